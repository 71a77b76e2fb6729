package dev.sparkapp.sources;

import java.io.IOException;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;

import com.fasterxml.jackson.core.JsonFactory;
import com.fasterxml.jackson.core.JsonParser;
import com.fasterxml.jackson.core.JsonToken;
import com.fasterxml.jackson.core.StreamReadFeature;

import org.apache.spark.SparkContext;
import org.apache.spark.sql.Column;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.api.java.UDF5;
import org.apache.spark.sql.expressions.UserDefinedFunction;
import org.apache.spark.sql.functions;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StringType;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;

/**
 * A Kafka source's JSON values parsed in Spark's tasks in the JVM (Spark's JSON reader,
 * {@code from_json}), so that no row of a batch crosses to a Python worker: with a Python
 * parse, a word count's batch latency was 1.23x plain Structured Streaming's.
 *
 * <p>A message is kept when it holds exactly one JSON object (nothing after it), with no
 * key twice, whose top-level string fields hold strings (or null), and which Spark's reader
 * reads as the schema (its corrupt-record column stays null); Spark's reader alone would
 * take the first of two objects, the last of two equal keys, and the text of a number or
 * an object for a string. Every other message (a tombstone, an empty value, not JSON, a
 * field of the wrong type) is handed to the driver in a {@link RejectedMessages}, which
 * writes it to the dead letters with the reason in the batch's commit, and is not kept.
 */
public final class JsonMessages {
    private static final String RECORD = "__spark_app_record";
    private static final String KEEP = "__spark_app_keep";

    private JsonMessages() {
    }

    /** An accumulator of the set-aside messages, registered with the driver's context. */
    public static RejectedMessages rejected(SparkContext context, String name) {
        RejectedMessages rejected = new RejectedMessages();
        context.register(rejected, name);
        return rejected;
    }

    /**
     * The records of {@code raw} (Spark's Kafka rows) read as {@code schema}, with
     * {@code columns} of the Kafka rows after them; the rest go to {@code rejected}.
     */
    public static Dataset<Row> parse(Dataset<Row> raw, StructType schema, List<String> columns,
                                     RejectedMessages rejected) {
        String corrupt = unusedName(schema, "_corrupt_record");
        Map<String, String> options = new HashMap<>();
        options.put("mode", "PERMISSIVE");
        options.put("columnNameOfCorruptRecord", corrupt);
        Column record = functions.from_json(raw.col("value").cast(DataTypes.StringType),
                                            schema.add(corrupt, DataTypes.StringType, true), options);
        List<Column> read = new ArrayList<>(List.of(record.as(RECORD), raw.col("value"), raw.col("topic"),
                                                    raw.col("partition"), raw.col("offset")));
        for (String name : columns) {
            if (!List.of("value", "topic", "partition", "offset").contains(name)) {
                read.add(raw.col(name));
            }
        }
        Dataset<Row> parsed = raw.select(read.toArray(new Column[0]));
        // Judged in a projection, not in the filter: the optimizer would push a filter below
        // the record's projection and parse every message twice. Not deterministic, so that
        // neither the filter nor a pipeline's own filters move below it (every message read
        // is judged, whatever the pipeline keeps of it).
        UserDefinedFunction keep = functions.udf(new Keep(rejected, stringFields(schema)), DataTypes.BooleanType)
                .asNondeterministic();
        List<Column> judged = new ArrayList<>(List.of(parsed.col(RECORD), keep.apply(
                parsed.col("value"), parsed.col(RECORD).getField(corrupt), parsed.col("topic"), parsed.col("partition"),
                parsed.col("offset")).as(KEEP)));
        for (String name : columns) {
            judged.add(parsed.col(name));
        }
        Dataset<Row> kept = parsed.select(judged.toArray(new Column[0])).where(functions.col(KEEP));
        List<Column> out = new ArrayList<>();
        for (StructField field : schema.fields()) {
            out.add(kept.col(RECORD).getField(field.name()).as(field.name()));
        }
        for (String name : columns) {
            out.add(kept.col(name));
        }
        return kept.select(out.toArray(new Column[0]));
    }

    /** Whether one message is kept; a message that is not is handed to the driver. */
    static final class Keep implements UDF5<byte[], String, String, Integer, Long, Boolean> {
        private static final long serialVersionUID = 1L;
        private static final JsonFactory JSON = JsonFactory.builder()
                .enable(StreamReadFeature.STRICT_DUPLICATE_DETECTION).build();

        private final RejectedMessages rejected;
        private final HashSet<String> strings;

        Keep(RejectedMessages rejected, HashSet<String> strings) {
            this.rejected = rejected;
            this.strings = strings;
        }

        @Override
        public Boolean call(byte[] value, String corrupt, String topic, Integer partition, Long offset) {
            if (corrupt == null && oneObject(value, strings)) {
                return true;
            }
            rejected.add(new RejectedMessage(topic, partition, offset, value));
            return false;
        }
    }

    /**
     * Whether {@code value} holds exactly one JSON object, no key twice, and a string or
     * null in each top-level field named in {@code strings}. A streaming scan: fields are
     * skipped, not built.
     */
    static boolean oneObject(byte[] value, Set<String> strings) {
        if (value == null) {
            return false;
        }
        try (JsonParser parser = Keep.JSON.createParser(value)) {
            if (parser.nextToken() != JsonToken.START_OBJECT) {
                return false;
            }
            JsonToken token;
            while ((token = parser.nextToken()) == JsonToken.FIELD_NAME) {
                String name = parser.currentName();
                JsonToken field = parser.nextToken();
                if (strings.contains(name) && field != JsonToken.VALUE_STRING && field != JsonToken.VALUE_NULL) {
                    return false;
                }
                parser.skipChildren();
            }
            return token == JsonToken.END_OBJECT && parser.nextToken() == null;
        } catch (IOException notJson) {
            return false;
        }
    }

    private static HashSet<String> stringFields(StructType schema) {
        HashSet<String> names = new HashSet<>();
        for (StructField field : schema.fields()) {
            if (field.dataType() instanceof StringType) {
                names.add(field.name());
            }
        }
        return names;
    }

    private static String unusedName(StructType schema, String wanted) {
        Set<String> taken = new HashSet<>(List.of(schema.fieldNames()));
        String name = wanted;
        for (int i = 2; taken.contains(name); i++) {
            name = wanted + "_" + i;
        }
        return name;
    }
}
