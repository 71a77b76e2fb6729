package dev.sparkapp.sinks;

import java.io.ByteArrayOutputStream;
import java.io.DataOutputStream;
import java.io.IOException;
import java.io.Serializable;
import java.io.UncheckedIOException;
import java.nio.file.Files;
import java.nio.file.Path;

import org.apache.spark.rdd.RDD;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.classic.Dataset;

import scala.Function1;
import scala.Function2;
import scala.reflect.ClassTag$;
import scala.runtime.BoxedUnit;

/**
 * A batch's encoded chunks fetched to the driver in one job, each partition written to a
 * local file as its task's result arrives.
 *
 * <p>PySpark's toLocalIterator runs a job per partition, one after the other: the batch's
 * last stage (a stateful operator, its state store's load and commit) then ran one task at
 * a time on a driver with two cores, which made a small Kafka batch 1.4x slower than
 * Structured Streaming's collect (make bench-kafka). Here every task runs at once, and
 * the driver holds a partition's result only until it is on disk, so a large batch is
 * not held whole in memory on either side of Py4J. The tasks read Spark's own rows: the
 * external rows of {@code Dataset.rdd} are decoded by generated code whose compilation
 * starts Scala's runtime reflection in a new driver's JVM.
 */
public final class PartitionFiles {
  private PartitionFiles() {}

  /**
   * Runs one job over {@code chunks} (chunk binary, lines int) and writes partition i to
   * {@code folder/part-i}: per chunk, its line count and its length (4 bytes each,
   * big-endian), then its bytes. Returns the number of partitions.
   */
  public static int write(Dataset<Row> chunks, String folder) {
    RDD<InternalRow> rdd = chunks.queryExecution().toRdd();
    @SuppressWarnings("unchecked")
    Function1<scala.collection.Iterator<InternalRow>, byte[]> task =
        (Function1<scala.collection.Iterator<InternalRow>, byte[]> & Serializable) PartitionFiles::records;
    Function2<Object, byte[], BoxedUnit> stored = (index, bytes) -> {
      try {
        Files.write(Path.of(folder, name((Integer) index)), bytes);
      } catch (IOException error) {
        throw new UncheckedIOException(error);
      }
      return BoxedUnit.UNIT;
    };
    chunks.sparkSession().sparkContext().runJob(rdd, task, stored, ClassTag$.MODULE$.apply(byte[].class));
    return rdd.getNumPartitions();
  }

  public static String name(int partition) {
    return String.format("part-%05d", partition);
  }

  private static byte[] records(scala.collection.Iterator<InternalRow> rows) {
    ByteArrayOutputStream bytes = new ByteArrayOutputStream();
    try (DataOutputStream out = new DataOutputStream(bytes)) {
      while (rows.hasNext()) {
        InternalRow row = rows.next();
        byte[] chunk = row.getBinary(0);
        out.writeInt(row.getInt(1));
        out.writeInt(chunk.length);
        out.write(chunk);
      }
    } catch (IOException error) {
      throw new UncheckedIOException(error);
    }
    return bytes.toByteArray();
  }
}
