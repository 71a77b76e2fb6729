package dev.sparkapp.fs;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.attribute.PosixFilePermissions;

import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsPermission;
import org.apache.hadoop.io.nativeio.NativeIO;

/**
 * Hadoop's local file system, setting a file's permissions with java.nio rather than a
 * {@code chmod} process. Without Hadoop's native library (pyspark ships none), every file
 * Hadoop creates on a local disk started a process: a state store's load copies each of
 * its RocksDB files (and their checksums) that way, and a state with 1,000 batches of
 * history holds 1,000 small files per partition (RocksDB moves files of disjoint keys
 * down its levels without merging them), so a driver's first batch spent 25 s starting
 * 8,000 processes. Spark's checkpoint writes (offsets, commits, changelogs) paid the same
 * on every batch. The sticky bit, which Hadoop sets only on directories asked for it, is
 * not set.
 */
public class NioRawLocalFileSystem extends RawLocalFileSystem {

    @Override
    public void setPermission(Path path, FsPermission permission) throws IOException {
        if (NativeIO.isAvailable()) {
            super.setPermission(path, permission);
            return;
        }
        String symbols = permission.getUserAction().SYMBOL + permission.getGroupAction().SYMBOL
                + permission.getOtherAction().SYMBOL;
        Files.setPosixFilePermissions(pathToFile(path).toPath(), PosixFilePermissions.fromString(symbols));
    }
}
