package dev.sparkapp.fs;

import java.io.File;
import java.io.IOException;
import java.io.InputStream;
import java.nio.file.Files;
import java.nio.file.StandardCopyOption;

import org.apache.hadoop.fs.LocalFileSystem;
import org.apache.hadoop.fs.Path;

/**
 * {@code file:} for Hadoop's FileSystem API ({@code fs.file.impl}): the checksummed local
 * file system over {@link NioRawLocalFileSystem}.
 */
public class NioLocalFileSystem extends LocalFileSystem {

    public NioLocalFileSystem() {
        super(new NioRawLocalFileSystem());
    }

    /**
     * A file copied out to a local path is read as before (its checksum verified) but
     * written without a checksum file of its own: a state store's load copies each of its
     * snapshot's RocksDB files into the store's working folder, where nothing reads a
     * checksum file (RocksDB checks its own blocks), and writing one doubled the files
     * created per file loaded. Folders, and moves, are Hadoop's.
     */
    @Override
    public void copyToLocalFile(boolean delSrc, Path src, Path dst) throws IOException {
        File target = pathToFile(dst);
        if (delSrc || target.isDirectory() || !getFileStatus(src).isFile()) {
            super.copyToLocalFile(delSrc, src, dst);
            return;
        }
        File parent = target.getParentFile();
        if (parent != null) {
            Files.createDirectories(parent.toPath());
        }
        try (InputStream in = open(src)) {
            Files.copy(in, target.toPath(), StandardCopyOption.REPLACE_EXISTING);
        }
    }
}
