package dev.sparkapp.delta;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.FileAlreadyExistsException;
import java.util.Arrays;
import java.util.Iterator;

import io.delta.storage.S3SingleDriverLogStore;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataInputStream;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Options.CreateFileOptionKeys;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.s3a.RemoteFileChangedException;

import dev.sparkapp.fs.S3Errors;

/**
 * Delta's LogStore for s3a:// tables with S3's put-if-absent: a table version's commit file
 * is created with {@code If-None-Match: *}, so of two writers (two drivers, two clusters)
 * committing version N only one succeeds. The other gets HTTP 412, which this store turns
 * into {@link FileAlreadyExistsException}: Delta's transaction then checks the winner's
 * commit for conflicts and retries at N+1, or fails with a concurrent-modification error.
 *
 * <p>Why our own: Delta 4.4.0 has no LogStore that uses S3's conditional writes
 * (delta-io/delta#3596, #4813). Its default for s3a, S3SingleDriverLogStore, checks that N
 * does not exist and then writes it, under a lock that only one JVM sees. Hadoop 3.4.2's
 * S3A can send the header (HADOOP-19256), but only for {@code createFile(path)} with
 * {@code fs.option.create.conditional.overwrite}: {@code create(path, false)} probes with
 * HEAD and LIST and then puts unconditionally, and a 412 comes back as
 * {@link RemoteFileChangedException}. Reads and listings are S3SingleDriverLogStore's.
 */
public class S3PutIfAbsentLogStore extends S3SingleDriverLogStore {

    public S3PutIfAbsentLogStore(Configuration initHadoopConf) {
        super(initHadoopConf);
    }

    @Override
    public void write(Path path, Iterator<String> actions, Boolean overwrite, Configuration hadoopConf)
            throws IOException {
        if (overwrite) {
            // Checkpoints and _last_checkpoint: whole objects, replaced in one PUT.
            super.write(path, actions, true, hadoopConf);
            return;
        }
        byte[] content = lines(actions);
        FileSystem fs = path.getFileSystem(hadoopConf);
        // FileSystem.createFile returns a raw builder, whose build() is typed Object.
        try (FSDataOutputStream out = (FSDataOutputStream) fs.createFile(path)
                .overwrite(false)
                .must(CreateFileOptionKeys.FS_OPTION_CREATE_CONDITIONAL_OVERWRITE, true)
                .build()) {
            out.write(content);
        } catch (RemoteFileChangedException e) {
            if (!S3Errors.preconditionFailed(e)) {
                throw e;
            }
            // The AWS SDK retries a PUT whose response was lost; if the first attempt had
            // landed, the retry finds our own commit. Another writer's commit differs (its
            // commitInfo has its own timestamp and transaction id).
            if (Arrays.equals(read(fs, path), content)) {
                return;
            }
            FileAlreadyExistsException exists = new FileAlreadyExistsException(path.toString());
            exists.initCause(e);
            throw exists;
        }
    }

    /** Delta's commit file format: one action per line, each ending in a newline. */
    private static byte[] lines(Iterator<String> actions) throws IOException {
        ByteArrayOutputStream bytes = new ByteArrayOutputStream();
        while (actions.hasNext()) {
            bytes.write((actions.next() + "\n").getBytes(StandardCharsets.UTF_8));
        }
        return bytes.toByteArray();
    }

    private static byte[] read(FileSystem fs, Path path) throws IOException {
        try (FSDataInputStream in = fs.open(path)) {
            return in.readAllBytes();
        }
    }
}
