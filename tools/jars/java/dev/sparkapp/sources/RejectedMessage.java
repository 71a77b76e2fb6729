package dev.sparkapp.sources;

import java.io.Serializable;
import java.util.Arrays;

/** A Kafka message that did not read as one record of its source's schema. */
public final class RejectedMessage implements Serializable {
    private static final long serialVersionUID = 1L;

    /**
     * Bytes of a value kept for the driver, which finds the reason from them. Kafka's
     * brokers refuse messages over about 1 MB unless configured otherwise; a larger value's
     * reason is then found from its first MiB.
     */
    static final int KEPT_BYTES = 1 << 20;

    private final String topic;
    private final int partition;
    private final long offset;
    private final byte[] value;
    private final int length;

    RejectedMessage(String topic, int partition, long offset, byte[] value) {
        this.topic = topic;
        this.partition = partition;
        this.offset = offset;
        this.value = value == null ? null : Arrays.copyOf(value, Math.min(value.length, KEPT_BYTES));
        this.length = value == null ? -1 : value.length;
    }

    public String topic() {
        return topic;
    }

    public int partition() {
        return partition;
    }

    public long offset() {
        return offset;
    }

    /** The value (its first {@link #KEPT_BYTES}), or null for a tombstone. */
    public byte[] value() {
        return value;
    }

    /** The value's whole length in bytes; -1 for a tombstone. */
    public int length() {
        return length;
    }
}
