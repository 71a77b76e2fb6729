package dev.sparkapp.sources;

import java.util.ArrayList;
import java.util.List;

import org.apache.spark.util.AccumulatorV2;

/**
 * The Kafka messages that {@link JsonMessages} set aside, carried from Spark's tasks to
 * the driver with each task's result, as accumulators are: the driver writes their dead
 * letters in the batch's commit ({@link #drain}).
 *
 * <p>Spark merges the updates of successful task attempts only; a retried or speculative
 * task, or a batch whose rows are read by two jobs, may hand the same message over twice,
 * and the driver's letters are named by offset, so a repeat rewrites the same letter.
 */
public final class RejectedMessages extends AccumulatorV2<RejectedMessage, List<RejectedMessage>> {
    private static final long serialVersionUID = 1L;

    private final ArrayList<RejectedMessage> messages = new ArrayList<>();

    @Override
    public synchronized boolean isZero() {
        return messages.isEmpty();
    }

    @Override
    public synchronized RejectedMessages copy() {
        RejectedMessages copy = new RejectedMessages();
        copy.messages.addAll(messages);
        return copy;
    }

    @Override
    public synchronized void reset() {
        messages.clear();
    }

    @Override
    public synchronized void add(RejectedMessage message) {
        messages.add(message);
    }

    @Override
    public void merge(AccumulatorV2<RejectedMessage, List<RejectedMessage>> other) {
        List<RejectedMessage> theirs = other.value();
        synchronized (this) {
            messages.addAll(theirs);
        }
    }

    @Override
    public synchronized List<RejectedMessage> value() {
        return new ArrayList<>(messages);
    }

    /** On the driver: the messages handed over so far, which are then forgotten. */
    public synchronized List<RejectedMessage> drain() {
        List<RejectedMessage> taken = new ArrayList<>(messages);
        messages.clear();
        return taken;
    }
}
