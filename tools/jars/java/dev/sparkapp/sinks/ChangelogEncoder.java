package dev.sparkapp.sinks;

import java.math.BigDecimal;
import java.math.MathContext;
import java.math.RoundingMode;
import java.nio.charset.StandardCharsets;
import java.sql.Date;
import java.sql.Timestamp;
import java.time.Instant;
import java.time.LocalDate;
import java.time.LocalDateTime;
import java.time.ZoneId;
import java.time.ZonedDateTime;
import java.util.ArrayList;
import java.util.Base64;
import java.util.HashSet;
import java.util.Iterator;
import java.util.List;
import java.util.NoSuchElementException;
import java.util.Set;

import org.apache.spark.api.java.JavaRDD;
import org.apache.spark.api.java.function.FlatMapFunction;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.catalyst.CatalystTypeConverters;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.util.DateTimeUtils;
import org.apache.spark.sql.classic.Dataset;
import org.apache.spark.sql.types.ArrayType;
import org.apache.spark.sql.types.BinaryType;
import org.apache.spark.sql.types.BooleanType;
import org.apache.spark.sql.types.ByteType;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.DateType;
import org.apache.spark.sql.types.DecimalType;
import org.apache.spark.sql.types.DoubleType;
import org.apache.spark.sql.types.FloatType;
import org.apache.spark.sql.types.IntegerType;
import org.apache.spark.sql.types.LongType;
import org.apache.spark.sql.types.NullType;
import org.apache.spark.sql.types.ShortType;
import org.apache.spark.sql.types.StringType;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.types.TimestampNTZType;
import org.apache.spark.sql.types.TimestampType;

import scala.Function1;
import scala.collection.Seq;

/**
 * A batch's changelog lines, encoded in Spark's tasks in the JVM, byte for byte as
 * spark_app's Python encoder writes them (spark_app/runtime/sinks/changelog.py: a row as
 * {@code json.dumps} of its values after {@code _jsonable}, compact and ASCII-only).
 *
 * <p>The Python encoder runs in a Python worker after the batch's last JVM stage: every
 * row crosses to Python as Arrow and back as bytes (a 200,000-row batch's encoding and
 * fetch took 0.81 s that way, 0.30 s here). Outputs compare a key's new row with the one
 * stored in their state as text, so the two encoders must agree to the byte, or a restart
 * across the change would emit a retraction and an insert of every equal row;
 * {@link #supports} leaves to the Python encoder the types whose Python text this class
 * does not reproduce (maps, intervals, variants, repeated field names).
 *
 * <p>Each output row is a chunk of up to {@link #CHUNK_ROWS} lines (Arrow's batch size in
 * the Python encoder), so that the driver fetches a partition's lines in a few rows.
 *
 * <p>The tasks take Spark's own rows and convert them with {@code CatalystTypeConverters},
 * not through an encoder ({@code Dataset.mapPartitions} with {@code Encoders.row}): an
 * encoder's row deserializer is generated code whose compilation starts Scala's runtime
 * reflection, about 0.4 s of the first batch in a new driver's JVM.
 */
public final class ChangelogEncoder implements FlatMapFunction<Iterator<InternalRow>, InternalRow> {
  private static final long serialVersionUID = 1L;

  static final int CHUNK_ROWS = 10_000;
  private static final int CHUNK_BYTES = 8 << 20;
  private static final StructType CHUNKS = new StructType()
      .add("chunk", DataTypes.BinaryType, false)
      .add("lines", DataTypes.IntegerType, false);

  private final StructType schema;
  private final long timeMs;
  private final String mode;
  private final int[] key;
  private final String zone;

  private ChangelogEncoder(StructType schema, long timeMs, String mode, int[] key, String zone) {
    this.schema = schema;
    this.timeMs = timeMs;
    this.mode = mode;
    this.key = key;
    this.zone = zone;
  }

  /**
   * {@code df} as (chunk, lines) rows. {@code mode}: {@code append} (changelog lines with
   * diff 1), {@code changelog} (the rows' own {@code diff} column), {@code keyed}
   * ({@code key<TAB>row}) or {@code append-keyed} ({@code key<TAB>line}); {@code key}: the
   * key's column names; {@code zone}: the session's time zone, in which the Python encoder
   * sees timestamps.
   */
  public static Dataset<Row> encode(Dataset<Row> df, long timeMs, String mode, List<String> key, String zone) {
    StructType schema = df.schema();
    if (!supports(schema)) {
      throw new IllegalArgumentException("the Python encoder writes these rows: " + schema.simpleString());
    }
    if (!List.of("append", "changelog", "keyed", "append-keyed").contains(mode)) {
      throw new IllegalArgumentException("unknown mode " + mode);
    }
    int[] columns = new int[key.size()];
    for (int i = 0; i < columns.length; i++) {
      // A key column the rows lack is null, as the Python encoder's row.get(name) is.
      columns[i] = List.of(schema.fieldNames()).indexOf(key.get(i));
    }
    ChangelogEncoder encoder = new ChangelogEncoder(schema, timeMs, mode, columns, zone);
    JavaRDD<InternalRow> chunks = df.queryExecution().toRdd().toJavaRDD().mapPartitions(encoder);
    return df.sparkSession().internalCreateDataFrame(chunks.rdd(), CHUNKS, false);
  }

  /** Whether every column's type is one this class writes as the Python encoder does. */
  public static boolean supports(StructType schema) {
    return supportsFields(schema);
  }

  private static boolean supportsFields(StructType struct) {
    Set<String> names = new HashSet<>();
    for (StructField field : struct.fields()) {
      // A Python dict keeps one value of a repeated name.
      if (!names.add(field.name()) || !supportsType(field.dataType())) {
        return false;
      }
    }
    return true;
  }

  private static boolean supportsType(DataType type) {
    if (type instanceof ArrayType array) {
      return supportsType(array.elementType());
    }
    if (type instanceof StructType struct) {
      return supportsFields(struct);
    }
    return type instanceof StringType || type instanceof BooleanType || type instanceof ByteType
        || type instanceof ShortType || type instanceof IntegerType || type instanceof LongType
        || type instanceof FloatType || type instanceof DoubleType || type instanceof DecimalType
        || type instanceof DateType || type instanceof TimestampType || type instanceof TimestampNTZType
        || type instanceof BinaryType || type instanceof NullType;
  }

  @Override
  public Iterator<InternalRow> call(Iterator<InternalRow> rows) {
    ZoneId zoneId = ZoneId.of(zone);
    int diff = "changelog".equals(mode) ? schema.fieldIndex("diff") : -1;
    // The external values an encoder would give (String, BigDecimal, Timestamp or Instant as
    // the session's java8API setting says, Seq, Row), copied out of each row as it comes.
    Function1<Object, Object> external = CatalystTypeConverters.createToScalaConverter(schema);
    return new Iterator<>() {
      @Override
      public boolean hasNext() {
        return rows.hasNext();
      }

      @Override
      public InternalRow next() {
        if (!rows.hasNext()) {
          throw new NoSuchElementException();
        }
        StringBuilder text = new StringBuilder();
        int lines = 0;
        while (rows.hasNext() && lines < CHUNK_ROWS && text.length() < CHUNK_BYTES) {
          encodeRow((Row) external.apply(rows.next()), diff, zoneId, text);
          lines++;
        }
        return new GenericInternalRow(new Object[] {text.toString().getBytes(StandardCharsets.US_ASCII), lines});
      }
    };
  }

  private void encodeRow(Row row, int diff, ZoneId zoneId, StringBuilder out) {
    if (mode.equals("keyed") || mode.equals("append-keyed")) {
      out.append('[');
      for (int i = 0; i < key.length; i++) {
        if (i > 0) {
          out.append(',');
        }
        if (key[i] < 0) {
          out.append("null");
        } else {
          value(row.get(key[i]), schema.fields()[key[i]].dataType(), zoneId, out);
        }
      }
      out.append("]\t");
    }
    int start = out.length();
    object(row, schema, diff, zoneId, out);
    if (mode.equals("keyed")) {
      out.append('\n');
      return;
    }
    long sign = diff < 0 ? 1 : ((Number) row.get(diff)).longValue();
    // sinks.changelog.line: "time" and "diff" added last to the row's object.
    out.setLength(out.length() - 1);
    if (out.length() > start + 1) {
      out.append(',');
    }
    out.append("\"time\":").append(timeMs).append(",\"diff\":").append(sign).append("}\n");
  }

  private static void object(Row row, StructType struct, int skip, ZoneId zoneId, StringBuilder out) {
    out.append('{');
    StructField[] fields = struct.fields();
    boolean first = true;
    for (int i = 0; i < fields.length; i++) {
      if (i == skip) {
        continue;
      }
      if (!first) {
        out.append(',');
      }
      first = false;
      string(fields[i].name(), out);
      out.append(':');
      value(row.get(i), fields[i].dataType(), zoneId, out);
    }
    out.append('}');
  }

  private static void value(Object value, DataType type, ZoneId zoneId, StringBuilder out) {
    if (value == null) {
      out.append("null");
    } else if (type instanceof StringType) {
      string(value.toString(), out);
    } else if (type instanceof BooleanType) {
      out.append(((Boolean) value) ? "true" : "false");
    } else if (type instanceof FloatType) {
      out.append(pythonFloat(((Float) value).doubleValue()));
    } else if (type instanceof DoubleType) {
      out.append(pythonFloat((Double) value));
    } else if (type instanceof DecimalType) {
      // str(Decimal) and BigDecimal.toString follow the same rule (the General Decimal
      // Arithmetic specification's to-scientific-string); _jsonable makes it a string.
      string(((BigDecimal) value).toString(), out);
    } else if (type instanceof DateType) {
      out.append('"').append(isoDate(LocalDate.ofEpochDay(days(value)))).append('"');
    } else if (type instanceof TimestampType) {
      long micros = micros(value);
      ZonedDateTime local = Instant.ofEpochSecond(Math.floorDiv(micros, 1_000_000L),
          Math.floorMod(micros, 1_000_000L) * 1_000L).atZone(zoneId);
      out.append('"');
      isoDateTime(local.toLocalDateTime(), out);
      offset(local.getOffset().getTotalSeconds(), out);
      out.append('"');
    } else if (type instanceof TimestampNTZType) {
      out.append('"');
      isoDateTime((LocalDateTime) value, out);
      out.append('"');
    } else if (type instanceof BinaryType) {
      out.append('"').append(Base64.getEncoder().encodeToString((byte[]) value)).append('"');
    } else if (type instanceof ArrayType array) {
      out.append('[');
      boolean first = true;
      for (Object element : elements(value)) {
        if (!first) {
          out.append(',');
        }
        first = false;
        value(element, array.elementType(), zoneId, out);
      }
      out.append(']');
    } else if (type instanceof StructType struct) {
      object((Row) value, struct, -1, zoneId, out);
    } else {
      out.append(value);  // the integer types
    }
  }

  private static List<Object> elements(Object value) {
    if (value instanceof List<?> list) {
      return new ArrayList<>(list);
    }
    List<Object> found = new ArrayList<>();
    scala.collection.Iterator<?> it = ((Seq<?>) value).iterator();
    while (it.hasNext()) {
      found.add(it.next());
    }
    return found;
  }

  private static long micros(Object value) {
    // Spark's own conversions, which undo its rebasing of dates before 1582 (pyarrow's
    // datetimes are proleptic Gregorian, as Spark's stored values are).
    if (value instanceof Instant instant) {
      return DateTimeUtils.instantToMicros(instant);
    }
    return DateTimeUtils.fromJavaTimestamp((Timestamp) value);
  }

  private static long days(Object value) {
    if (value instanceof LocalDate date) {
      return date.toEpochDay();
    }
    return DateTimeUtils.fromJavaDate((Date) value);
  }

  private static String isoDate(LocalDate date) {
    return String.format("%04d-%02d-%02d", date.getYear(), date.getMonthValue(), date.getDayOfMonth());
  }

  /** datetime.isoformat(): the microseconds only when there are some. */
  private static void isoDateTime(LocalDateTime time, StringBuilder out) {
    out.append(isoDate(time.toLocalDate()))
        .append(String.format("T%02d:%02d:%02d", time.getHour(), time.getMinute(), time.getSecond()));
    int micros = time.getNano() / 1_000;
    if (micros != 0) {
      out.append(String.format(".%06d", micros));
    }
  }

  /** A UTC offset as datetime.isoformat() writes it: +HH:MM, and :SS when not whole minutes. */
  private static void offset(int seconds, StringBuilder out) {
    out.append(seconds < 0 ? '-' : '+');
    int total = Math.abs(seconds);
    out.append(String.format("%02d:%02d", total / 3600, total / 60 % 60));
    if (total % 60 != 0) {
      out.append(String.format(":%02d", total % 60));
    }
  }

  /** A JSON string as json.dumps writes it with ensure_ascii: everything outside ' '..'~' escaped. */
  static void string(String text, StringBuilder out) {
    out.append('"');
    for (int i = 0; i < text.length(); i++) {
      char c = text.charAt(i);
      switch (c) {
        case '"' -> out.append("\\\"");
        case '\\' -> out.append("\\\\");
        case '\n' -> out.append("\\n");
        case '\r' -> out.append("\\r");
        case '\t' -> out.append("\\t");
        case '\b' -> out.append("\\b");
        case '\f' -> out.append("\\f");
        default -> {
          if (c < ' ' || c > '~') {
            out.append(String.format("\\u%04x", (int) c));
          } else {
            out.append(c);
          }
        }
      }
    }
    out.append('"');
  }

  /**
   * repr() of a Python float, as json.dumps writes it: the shortest decimal that reads back
   * as the same double (the nearest one when several have that many digits), in positional
   * notation from 1e-4 up to 1e16 and in scientific notation outside it. Java 17's
   * Double.toString is not always the shortest (JDK-4511638), so the digits are searched.
   */
  static String pythonFloat(double value) {
    if (Double.isNaN(value)) {
      return "NaN";
    }
    if (Double.isInfinite(value)) {
      return value > 0 ? "Infinity" : "-Infinity";
    }
    if (value == 0) {
      return 1 / value < 0 ? "-0.0" : "0.0";
    }
    BigDecimal exact = new BigDecimal(value);
    BigDecimal shortest = null;
    for (int digits = 1; digits <= 17 && shortest == null; digits++) {
      BigDecimal down = exact.round(new MathContext(digits, RoundingMode.DOWN));
      BigDecimal up = exact.round(new MathContext(digits, RoundingMode.UP));
      boolean downReads = down.doubleValue() == value;
      boolean upReads = up.doubleValue() == value;
      if (downReads && upReads) {
        int order = exact.subtract(down).abs().compareTo(up.subtract(exact).abs());
        shortest = order < 0 ? down
            : order > 0 ? up : exact.round(new MathContext(digits, RoundingMode.HALF_EVEN));
      } else if (downReads) {
        shortest = down;
      } else if (upReads) {
        shortest = up;
      }
    }
    if (shortest == null) {
      shortest = exact.round(MathContext.DECIMAL64);
    }
    return positionalOrScientific(shortest.stripTrailingZeros());
  }

  private static String positionalOrScientific(BigDecimal number) {
    String sign = number.signum() < 0 ? "-" : "";
    String digits = number.unscaledValue().abs().toString();
    int exponent = digits.length() - 1 - number.scale();  // of the first digit
    StringBuilder out = new StringBuilder(sign);
    if (exponent >= -4 && exponent < 16) {
      if (exponent < 0) {
        out.append("0.").append("0".repeat(-exponent - 1)).append(digits);
      } else if (digits.length() <= exponent + 1) {
        out.append(digits).append("0".repeat(exponent + 1 - digits.length())).append(".0");
      } else {
        out.append(digits, 0, exponent + 1).append('.').append(digits.substring(exponent + 1));
      }
      return out.toString();
    }
    out.append(digits.charAt(0));
    if (digits.length() > 1) {
      out.append('.').append(digits.substring(1));
    }
    out.append('e').append(exponent < 0 ? '-' : '+');
    out.append(String.format("%02d", Math.abs(exponent)));
    return out.toString();
  }
}
