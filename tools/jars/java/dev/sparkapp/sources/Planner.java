package dev.sparkapp.sources;

/**
 * The planning half of a {@link PlannedSource}: an object of the driver's Python process
 * (through Py4J's callback server, as foreachBatch's function is), where spark_app's
 * sources keep their durable planning state. Each stream Spark opens on the source has a
 * {@code stream} id of its own (a query started, or restarted), for which the planner makes
 * a reader at its first call; offsets are JSON, as in Spark's offset log. A batch's commit
 * is not the planner's: the query's own commit records what the batch read.
 */
public interface Planner {
    String initialOffset(String stream);

    String latestOffset(String stream);

    /** On a restart, the last offset in the query's offset log, before anything else. */
    void seen(String stream, String offset);

    /**
     * The batch from {@code start} to {@code end}: each of its input partitions as the
     * Base64 of what a Python task reads, one per line.
     */
    String partitions(String stream, String start, String end);

    void close(String stream);
}
