package dev.sparkapp.fs;

import java.io.IOException;
import java.net.URI;
import java.net.URISyntaxException;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.ChecksumFs;
import org.apache.hadoop.fs.DelegateToFileSystem;
import org.apache.hadoop.fs.FsConstants;
import org.apache.hadoop.fs.FsServerDefaults;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.local.LocalConfigKeys;

/**
 * {@code file:} for Hadoop's FileContext API ({@code fs.AbstractFileSystem.file.impl}),
 * which Spark's checkpoint files go through: Hadoop's LocalFs over
 * {@link NioRawLocalFileSystem} (LocalFs cannot be given another raw file system).
 */
public class NioLocalFs extends ChecksumFs {

    public NioLocalFs(URI uri, Configuration conf) throws IOException, URISyntaxException {
        super(new Raw(uri, conf));
    }

    /** Hadoop's RawLocalFs, delegating to {@link NioRawLocalFileSystem}. */
    static final class Raw extends DelegateToFileSystem {

        Raw(URI uri, Configuration conf) throws IOException, URISyntaxException {
            super(uri, new NioRawLocalFileSystem(), conf, FsConstants.LOCAL_FS_URI.getScheme(), false);
        }

        @Override
        public int getUriDefaultPort() {
            return -1;  // no default port
        }

        @Override
        public FsServerDefaults getServerDefaults(Path path) throws IOException {
            return LocalConfigKeys.getServerDefaults();
        }

        @Override
        @Deprecated
        public FsServerDefaults getServerDefaults() throws IOException {
            return LocalConfigKeys.getServerDefaults();
        }

        @Override
        public boolean isValidName(String src) {
            return true;  // any local path
        }
    }
}
