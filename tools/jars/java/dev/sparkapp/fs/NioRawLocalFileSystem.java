package dev.sparkapp.fs;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.attribute.PosixFilePermissions;

import org.apache.hadoop.fs.FileStatus;
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
 *
 * <p>It also answers whether a path is a symbolic link with java.nio: Hadoop asked a
 * {@code readlink} process for the source and the target of every rename through
 * FileContext, and each checkpoint file Spark writes is renamed into place: 101 processes
 * in a driver's start on a small state (traced; 57 in plain Structured Streaming's).
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

    /**
     * A path's status without following a symbolic link. Hadoop's answer (without its
     * native library) started {@code readlink} on the path's URI string, which names no
     * file, so it only ever found a plain file's status: that is what this returns, with
     * one lstat, for anything that is not a link. A link still gets Hadoop's own answer.
     */
    @Override
    public FileStatus getFileLinkStatus(Path path) throws IOException {
        if (Files.isSymbolicLink(pathToFile(path).toPath())) {
            return super.getFileLinkStatus(path);
        }
        return getFileStatus(path);
    }
}
