package dev.sparkapp.sources;

/**
 * The planning half of a {@link PlannedSource}: an object of the driver's Python process
 * (through Py4J's callback server, as foreachBatch's function is), where spark_app's
 * sources keep their durable planning state. Each stream Spark opens on the source has a
 * {@code stream} id of its own; offsets are JSON, as in Spark's offset log.
 */
public interface Planner {
    /** A new stream of this source (a query started, or restarted). */
    void open(String stream);

    String initialOffset(String stream);

    String latestOffset(String stream);

    /** On a restart, the last offset in the query's offset log, before anything else. */
    void seen(String stream, String offset);

    /**
     * The batch from {@code start} to {@code end}: each of its input partitions as the
     * Base64 of what a Python task reads, one per line.
     */
    String partitions(String stream, String start, String end);

    void commit(String stream, String end);

    void close(String stream);
}
