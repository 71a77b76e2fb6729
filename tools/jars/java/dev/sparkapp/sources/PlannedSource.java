package dev.sparkapp.sources;

import java.util.Map;
import java.util.Set;

import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.read.streaming.MicroBatchStream;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * A streaming source planned by Python code in the driver's own process ({@link Planner})
 * and read by Python tasks: each row it yields is one input partition, which the query
 * then reads with {@code mapInArrow}. The same planning as a Spark Python data source,
 * without its Python processes: one to create the source, one that plans for each stream
 * and one that prepares the read, each started at a query's start and each importing
 * pyspark and the source's modules, which put a driver's start 1.4 s behind plain
 * Structured Streaming's.
 *
 * <p>Options: {@code planner}, the id under which the driver registered its {@link Planner}
 * ({@link Planners}).
 */
public final class PlannedSource implements TableProvider {
    /** The one column of a planned source's rows: a partition as its Python reader unpickles it. */
    public static final StructType SCHEMA = new StructType().add("partition", DataTypes.BinaryType, false);

    @Override
    public StructType inferSchema(CaseInsensitiveStringMap options) {
        return SCHEMA;
    }

    @Override
    public Table getTable(StructType schema, Transform[] partitioning, Map<String, String> properties) {
        return new PlannedTable(properties.get("planner"));
    }

    private static final class PlannedTable implements Table, SupportsRead {
        private final String planner;

        PlannedTable(String planner) {
            if (planner == null) {
                throw new IllegalArgumentException("a planned source needs the option planner");
            }
            this.planner = planner;
        }

        @Override
        public String name() {
            return "spark_app planned source " + planner;
        }

        @Override
        @SuppressWarnings("deprecation")
        public StructType schema() {
            return SCHEMA;
        }

        @Override
        public Set<TableCapability> capabilities() {
            return Set.of(TableCapability.MICRO_BATCH_READ);
        }

        @Override
        public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
            return () -> new Scan() {
                @Override
                public StructType readSchema() {
                    return SCHEMA;
                }

                @Override
                public MicroBatchStream toMicroBatchStream(String checkpointLocation) {
                    return new PlannedStream(Planners.get(planner));
                }
            };
        }
    }
}
