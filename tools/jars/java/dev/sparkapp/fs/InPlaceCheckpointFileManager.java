package dev.sparkapp.fs;

import java.io.ByteArrayOutputStream;
import java.io.FileNotFoundException;
import java.io.IOException;
import java.io.OutputStream;
import java.util.Arrays;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.CommonPathCapabilities;
import org.apache.hadoop.fs.FSDataInputStream;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileAlreadyExistsException;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Options.CreateFileOptionKeys;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.UnsupportedFileSystemException;
import org.apache.hadoop.util.functional.FutureIO;
import org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager.CancellableFSDataOutputStream;
import org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Spark's checkpoint files on an object store (S3A), written in place: the file appears
 * when its stream closes, and a cancelled stream is aborted, so nothing appears. Spark
 * writes every checkpoint file (offsets, commits, state store changelogs and snapshots)
 * through {@code createAtomic}; its default for a file system without atomic rename writes
 * under a temporary name and renames, which on S3 is a copy and a delete.
 *
 * <p>What spark-hadoop-cloud's {@code AbortableStreamBasedCheckpointFileManager} (Spark
 * 4.1.2) does differently, and why this class replaces it:
 * <ul>
 * <li>Its {@code close()} logs any failure as a warning and returns: an upload that failed
 * as the stream closed (S3A uploads a small file then), or a create-if-absent that found
 * the file written meanwhile, looked to Spark like a file written. Here a failure is the
 * writer's; a create-if-absent that loses throws Hadoop's {@link FileAlreadyExistsException},
 * which Spark's metadata logs report as a concurrent update of the checkpoint.
 * <li>It checked for the file before closing a create-if-absent, then uploaded: a race, and
 * two requests more per file. Here the upload is conditional (S3A's
 * {@code fs.option.create.conditional.overwrite}: an If-None-Match PUT, HADOOP-19256), so of
 * two writers exactly one succeeds.
 * <li>It reached S3 through a {@code FileContext}, whose S3A binding builds a file system of
 * its own for each manager (an AWS SDK client, a connection pool, thread pools): a resumed
 * driver held eight. Here every manager uses Hadoop's cached file system for the bucket.
 * <li>A file written over (a state store's) is uploaded without S3A's listing of its path
 * first: one request, not two.
 * <li>Spark asks whether a file exists, then opens it (its metadata logs, a state store's
 * schema and snapshot files: 10 to 15 files one after another as a query resumes), and S3A
 * asks S3 for the file's status each time. Here an open within a second of {@code exists}
 * reads with the status that {@code exists} got: one request fewer, a round trip on S3.
 * The open may come from another thread (Spark's checksum manager opens a file and its
 * checksum on threads of its own), so the statuses are kept by path. S3A reads the file
 * only if the object is still the one that status describes (its ETag); one written over
 * meanwhile fails the read, as it would between S3A's own status request and its read; one
 * this manager writes or deletes is forgotten, so its next open asks again.
 * </ul>
 * The other operations (list, mkdirs) and deleting itself are Spark's
 * {@code FileSystemBasedCheckpointFileManager}'s.
 */
public class InPlaceCheckpointFileManager extends FileSystemBasedCheckpointFileManager {

    private static final Logger LOG = LoggerFactory.getLogger(InPlaceCheckpointFileManager.class);

    /** S3A's Constants.FS_S3A_CREATE_PERFORMANCE, an option of one create (hadoop-aws 3.4). */
    static final String S3A_CREATE_PERFORMANCE = "fs.s3a.create.performance";

    /** How long after {@code exists} an open of the same file may use the status it got. */
    static final long FOUND_FOR_NANOS = TimeUnit.SECONDS.toNanos(1);

    /** Past this many statuses not yet opened, the ones older than FOUND_FOR_NANOS go. */
    private static final int FOUND_KEPT = 64;

    private final FileSystem fs;
    private final Map<Path, Found> found = new ConcurrentHashMap<>();

    /** A file's status as {@code exists} got it, and when. */
    private record Found(FileStatus status, long atNanos) {

        boolean fresh(long nowNanos) {
            return nowNanos - atNanos < FOUND_FOR_NANOS;
        }
    }

    public InPlaceCheckpointFileManager(Path path, Configuration hadoopConf) throws IOException {
        super(path, hadoopConf);
        this.fs = path.getFileSystem(hadoopConf);
        if (!fs.hasPathCapability(path, CommonPathCapabilities.ABORTABLE_STREAM)) {
            throw new UnsupportedFileSystemException(getClass().getSimpleName() + " needs a file system whose "
                    + "output streams can be aborted (S3A); " + path + " is on " + fs.getClass().getName());
        }
    }

    @Override
    public boolean exists(Path path) {
        found.remove(path);
        try {
            FileStatus status = fs.getFileStatus(path);  // S3A's exists asks the same probes
            if (status.isFile()) {
                long now = System.nanoTime();
                if (found.size() >= FOUND_KEPT) {
                    found.values().removeIf(kept -> !kept.fresh(now));  // found, never opened
                }
                found.put(path, new Found(status, now));
            }
            return true;
        } catch (FileNotFoundException e) {
            return false;
        } catch (IOException e) {
            throw rethrown(e);
        }
    }

    @Override
    public FSDataInputStream open(Path path) {
        Found last = found.remove(path);
        try {
            if (last != null && last.fresh(System.nanoTime())) {
                return FutureIO.awaitFuture(fs.openFile(path).withFileStatus(last.status()).build());
            }
            return fs.open(path);
        } catch (IOException e) {
            throw rethrown(e);
        }
    }

    @Override
    public void delete(Path path) {
        found.remove(path);
        super.delete(path);
    }

    @Override
    public CancellableFSDataOutputStream createAtomic(Path path, boolean overwriteIfPossible) {
        // FileSystem.createFile returns a raw builder, whose build() is typed Object.
        try {
            if (overwriteIfPossible) {
                // Without S3A's create performance, S3A lists the path first, to refuse
                // to write a file over a directory: a round trip before each write of a
                // state store's changelog, snapshot and checksum files, every batch, for a
                // case Spark's file names never make.
                FSDataOutputStream out = (FSDataOutputStream) fs.createFile(path)
                        .overwrite(true)
                        .opt(S3A_CREATE_PERFORMANCE, true)
                        .build();
                return new InPlaceStream(out, path, null);
            }
            FSDataOutputStream out = (FSDataOutputStream) fs.createFile(path)
                    .overwrite(false)
                    .must(CreateFileOptionKeys.FS_OPTION_CREATE_CONDITIONAL_OVERWRITE, true)
                    .build();
            return new InPlaceStream(out, path, new ByteArrayOutputStream());
        } catch (IOException e) {
            throw rethrown(e);
        }
    }

    /**
     * The file's stream: closing it uploads the file, cancelling it aborts the upload. A
     * create-if-absent keeps a copy of what it writes (Spark's metadata logs: a few
     * kilobytes) to tell its own upload from another writer's.
     */
    private final class InPlaceStream extends CancellableFSDataOutputStream {

        private final FSDataOutputStream out;
        private final Path path;
        private final ByteArrayOutputStream copy;
        private boolean ended;

        InPlaceStream(FSDataOutputStream out, Path path, ByteArrayOutputStream copy) {
            super(copy == null ? out : new TeeOutputStream(out, copy));
            this.out = out;
            this.path = path;
            this.copy = copy;
        }

        @Override
        public synchronized void close() throws IOException {
            if (ended) {
                return;
            }
            ended = true;
            found.remove(path);  // whatever exists saw of the file is about to be replaced
            try {
                out.close();
            } catch (IOException e) {
                if (copy == null || !S3Errors.preconditionFailed(e)) {
                    throw e;
                }
                // The AWS SDK retries a PUT whose response was lost; if the first attempt
                // had landed, the retry finds this writer's own file.
                if (Arrays.equals(read(path), copy.toByteArray())) {
                    return;
                }
                FileAlreadyExistsException lost = new FileAlreadyExistsException(
                        path + " was written by another writer while this one wrote it");
                lost.initCause(e);
                throw lost;
            }
        }

        @Override
        public synchronized void cancel() {
            if (ended) {
                return;
            }
            ended = true;
            try {
                out.abort();
                out.close();
            } catch (IOException | RuntimeException e) {
                // The write is being given up already; nothing of it was uploaded.
                LOG.warn("cancelling the write of {}: {}", path, e.toString());
            }
        }

        @Override
        public String toString() {
            return out.toString();
        }
    }

    private byte[] read(Path path) throws IOException {
        try (FSDataInputStream in = fs.open(path)) {
            return in.readAllBytes();
        }
    }

    /** Writes to the file and to the copy kept of it. */
    private static final class TeeOutputStream extends OutputStream {

        private final OutputStream out;
        private final OutputStream copy;

        TeeOutputStream(OutputStream out, OutputStream copy) {
            this.out = out;
            this.copy = copy;
        }

        @Override
        public void write(int b) throws IOException {
            out.write(b);
            copy.write(b);
        }

        @Override
        public void write(byte[] b, int off, int len) throws IOException {
            out.write(b, off, len);
            copy.write(b, off, len);
        }

        @Override
        public void flush() throws IOException {
            out.flush();
        }

        @Override
        public void close() throws IOException {
            out.close();
        }
    }

    /** Throws {@code e} from a method Scala declared without {@code throws}, as Scala would. */
    @SuppressWarnings("unchecked")
    private static <E extends Throwable> RuntimeException rethrown(Throwable e) throws E {
        throw (E) e;
    }
}
