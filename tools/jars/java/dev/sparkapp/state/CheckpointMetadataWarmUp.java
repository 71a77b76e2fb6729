package dev.sparkapp.state;

import java.io.File;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.util.concurrent.CompletableFuture;

import org.apache.spark.sql.execution.streaming.checkpointing.CommitMetadata;
import org.apache.spark.sql.execution.streaming.state.RocksDBCheckpointMetadata;

/**
 * Reads a sample of Spark's checkpoint metadata in a thread of its own while a resumed
 * driver starts, so that its queries do not read their first in a cold JVM.
 *
 * <p>Spark reads a query's commit log ({@code CommitMetadata}) when the query starts, and
 * each RocksDB state store's snapshot metadata ({@code RocksDBCheckpointMetadata}) when a
 * task first loads the store, with json4s. The first time json4s extracts a case class in a
 * JVM it describes the class by parsing its Scala signature, once for each constructor
 * parameter of a generic type, with its own parser running cold. A resumed driver paid
 * that in the first state store task on each core (0.3 to 0.4 s of CPU, the largest part
 * of what a 1M-key state adds to a start) and on the query's start (0.07 to 0.09 s); the
 * descriptions are cached for the JVM's life (bench/README.md, 2026-12-06).
 *
 * <p>The samples have the fields Spark 4.1.2 writes. Should a later Spark read them
 * differently, the warm-up fails, which costs the queries nothing but the time it would
 * have saved; {@code tests/integration/spark_app/test_session.py} reads them with the
 * pinned Spark.
 */
public final class CheckpointMetadataWarmUp {

    private static final String COMMIT = "{\"nextBatchWatermarkMs\":0}";

    private static final String STORE = "v1\n{"
            + "\"sstFiles\":[{\"localFileName\":\"000001.sst\",\"dfsSstFileName\":\"000001-w.sst\",\"sizeBytes\":1}],"
            + "\"logFiles\":[{\"localFileName\":\"000002.log\",\"dfsLogFileName\":\"000002-w.log\",\"sizeBytes\":1}],"
            + "\"numKeys\":1,\"numInternalKeys\":1,\"columnFamilyMapping\":{\"default\":0},"
            + "\"columnFamilyTypeMap\":{\"default\":false},\"maxColumnFamilyId\":0}";

    private static CompletableFuture<Void> started;

    private CheckpointMetadataWarmUp() {}

    /**
     * Starts the reads, once per JVM (later calls return the first call's future): the
     * commit log's, and the state stores' with {@code stateStores}. The future completes when
     * they are done, or exceptionally if a sample could not be read.
     */
    public static synchronized CompletableFuture<Void> start(boolean stateStores) {
        if (started == null) {
            CompletableFuture<Void> done = new CompletableFuture<>();
            Thread thread = new Thread(() -> read(stateStores, done), "spark_app-checkpoint-metadata-warm-up");
            thread.setDaemon(true);
            thread.start();
            started = done;
        }
        return started;
    }

    private static void read(boolean stateStores, CompletableFuture<Void> done) {
        try {
            CommitMetadata.apply(COMMIT);
            if (stateStores) {
                File sample = Files.createTempFile("spark_app-rocksdb-metadata", "").toFile();
                try {
                    Files.writeString(sample.toPath(), STORE, StandardCharsets.UTF_8);
                    RocksDBCheckpointMetadata.readFromFile(sample);
                } finally {
                    Files.deleteIfExists(sample.toPath());
                }
            }
            done.complete(null);
        } catch (Exception | LinkageError e) {
            done.completeExceptionally(e);
        }
    }
}
