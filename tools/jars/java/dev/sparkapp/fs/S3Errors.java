package dev.sparkapp.fs;

import software.amazon.awssdk.awscore.exception.AwsServiceException;

/** What an S3 error, as S3A passes it on, says. */
public final class S3Errors {

    private static final int PRECONDITION_FAILED = 412;

    private S3Errors() {}

    /**
     * Whether S3 answered HTTP 412 somewhere in {@code error}'s causes: a conditional create
     * (If-None-Match) that found the object there, which S3A reports as
     * RemoteFileChangedException.
     */
    public static boolean preconditionFailed(Throwable error) {
        for (Throwable cause = error; cause != null; cause = cause.getCause()) {
            if (cause instanceof AwsServiceException
                    && ((AwsServiceException) cause).statusCode() == PRECONDITION_FAILED) {
                return true;
            }
        }
        return false;
    }
}
