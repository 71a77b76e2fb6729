package dev.sparkapp.sources;

import java.io.Serializable;
import java.util.ArrayList;
import java.util.Base64;
import java.util.List;
import java.util.UUID;

import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.streaming.AcceptsLatestSeenOffset;
import org.apache.spark.sql.connector.read.streaming.MicroBatchStream;
import org.apache.spark.sql.connector.read.streaming.Offset;

/** One stream of a {@link PlannedSource}: each call goes to its {@link Planner}. */
final class PlannedStream implements MicroBatchStream, AcceptsLatestSeenOffset {
    private final Planner planner;
    private final String stream = UUID.randomUUID().toString();

    PlannedStream(Planner planner) {
        this.planner = planner;
    }

    @Override
    public Offset initialOffset() {
        return new JsonOffset(planner.initialOffset(stream));
    }

    @Override
    public Offset latestOffset() {
        return new JsonOffset(planner.latestOffset(stream));
    }

    @Override
    public void setLatestSeenOffset(Offset offset) {
        planner.seen(stream, offset.json());
    }

    @Override
    public Offset deserializeOffset(String json) {
        return new JsonOffset(json);
    }

    @Override
    public InputPartition[] planInputPartitions(Offset start, Offset end) {
        String planned = planner.partitions(stream, start.json(), end.json());
        List<InputPartition> partitions = new ArrayList<>();
        for (String line : planned.split("\n")) {
            if (!line.isEmpty()) {
                partitions.add(new Partition(Base64.getDecoder().decode(line)));
            }
        }
        return partitions.toArray(new InputPartition[0]);
    }

    @Override
    public PartitionReaderFactory createReaderFactory() {
        return new ReaderFactory();
    }

    @Override
    public void commit(Offset end) {
        // Nothing to do, and no call to the driver's Python per batch: the query's own
        // commit (spark_app.runtime.commit) records what the batch read.
    }

    @Override
    public void stop() {
        planner.close(stream);
    }

    /** An offset as the planner wrote it (Offset's equality compares the JSON). */
    private static final class JsonOffset extends Offset {
        private final String json;

        JsonOffset(String json) {
            this.json = json;
        }

        @Override
        public String json() {
            return json;
        }
    }

    private record Partition(byte[] payload) implements InputPartition {
        private static final long serialVersionUID = 1L;
    }

    private static final class ReaderFactory implements PartitionReaderFactory, Serializable {
        private static final long serialVersionUID = 1L;

        @Override
        public PartitionReader<InternalRow> createReader(InputPartition partition) {
            byte[] payload = ((Partition) partition).payload();
            return new PartitionReader<>() {
                private boolean read;

                @Override
                public boolean next() {
                    if (read) {
                        return false;
                    }
                    read = true;
                    return true;
                }

                @Override
                public InternalRow get() {
                    return new GenericInternalRow(new Object[] {payload});
                }

                @Override
                public void close() {
                }
            };
        }
    }
}
