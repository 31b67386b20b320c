/*
 * The JVM engine of trioha's "commitlog" data source: a Spark DataSource V2 reader that
 * decodes RocketMQ commit log records in the executors' JVMs, with no Python worker and no
 * Arrow hand-off in the way. It yields exactly the rows of the Python reader
 * (trioha/pipeline/_decode.py and its steps) in the same schema (trioha/pipeline/_schema.py
 * MESSAGE_SCHEMA).
 *
 * Partitions are not planned here: the driver's Python planner (trioha/pipeline/_plan.py)
 * cuts the log at record starts and hands the result over as the "partitions" option, a
 * JSON list of partitions, each a list of byte ranges of segment files. Compiled on demand
 * against the pyspark jars by trioha/pipeline/_jvm.py; see docs/pipeline.md, "Engines".
 */
package trioha.pipeline.jvm;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.io.Serializable;
import java.util.ArrayList;
import java.util.EnumSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.read.Batch;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.read.SupportsPushDownRequiredColumns;
import org.apache.spark.sql.sources.DataSourceRegister;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/** {@code spark.read.format("commitlog_jvm")}: one row per message, planned partitions given. */
public final class CommitLogSource implements TableProvider, DataSourceRegister {

  /** The messages schema; column for column trioha.pipeline._schema.MESSAGE_SCHEMA. */
  public static final StructType SCHEMA =
      new StructType(
          new StructField[] {
            field("physical_offset", DataTypes.LongType, false),
            field("size", DataTypes.IntegerType, false),
            field("topic", DataTypes.StringType, false),
            field("queue_id", DataTypes.IntegerType, false),
            field("queue_offset", DataTypes.LongType, false),
            field("tags", DataTypes.StringType, true),
            field("keys", DataTypes.StringType, true),
            field("born_timestamp", DataTypes.TimestampType, true),
            field("born_host", DataTypes.StringType, false),
            field("store_timestamp", DataTypes.TimestampType, true),
            field("store_host", DataTypes.StringType, false),
            field("sysflag", DataTypes.IntegerType, false),
            field("flag", DataTypes.IntegerType, false),
            field("body_crc", DataTypes.IntegerType, false),
            field("reconsume_times", DataTypes.IntegerType, false),
            field("prepared_transaction_offset", DataTypes.LongType, false),
            field("magic_code", DataTypes.LongType, false),
            field(
                "properties",
                DataTypes.createMapType(DataTypes.StringType, DataTypes.StringType, true),
                false),
            field("body", DataTypes.BinaryType, false),
            field("msg_id", DataTypes.StringType, false),
            field("compressed", DataTypes.BooleanType, false),
            field("compression", DataTypes.StringType, true),
          });

  /** Bumped when what the engine yields changes; the Python side checks it is the same. */
  public static final int VERSION = 1;

  private static StructField field(String name, org.apache.spark.sql.types.DataType type, boolean nullable) {
    return DataTypes.createStructField(name, type, nullable);
  }

  @Override
  public String shortName() {
    return "commitlog_jvm";
  }

  @Override
  public StructType inferSchema(CaseInsensitiveStringMap options) {
    return SCHEMA;
  }

  @Override
  public Table getTable(
      StructType schema, Transform[] partitioning, Map<String, String> properties) {
    return new CommitLogTable();
  }

  /** The options every task needs, read once on the driver. */
  static final class Settings implements Serializable {
    private static final long serialVersionUID = 1L;
    final boolean decompress;
    final int batchRows;
    final long batchBytes;

    Settings(CaseInsensitiveStringMap options) {
      decompress = bool(options, "decompress");
      batchRows = (int) Math.max(1, Math.min(positive(options, "batchRows", 4096), 1 << 20));
      batchBytes = positive(options, "batchBytes", 32L << 20);
    }

    private static boolean bool(CaseInsensitiveStringMap options, String name) {
      String text = options.getOrDefault(name, "false").trim().toLowerCase(java.util.Locale.ROOT);
      switch (text) {
        case "true": case "1": case "yes": case "on": return true;
        case "false": case "0": case "no": case "off": return false;
        default:
          throw new IllegalArgumentException(
              "option " + name + "=" + text + " is not a boolean (true/false)");
      }
    }

    private static long positive(CaseInsensitiveStringMap options, String name, long dflt) {
      String text = options.get(name);
      if (text == null) {
        return dflt;
      }
      try {
        long value = Long.parseLong(text.trim());
        if (value < 1) {
          throw new IllegalArgumentException("option " + name + "=" + value + " must be at least 1");
        }
        return value;
      } catch (NumberFormatException e) {
        throw new IllegalArgumentException("option " + name + "=" + text + " is not an integer");
      }
    }
  }

  /** One byte range [begin, end) of a segment file, as the Python planner's ScanRange. */
  static final class Range implements Serializable {
    private static final long serialVersionUID = 1L;
    final String path;
    final long start;
    final long length;
    final long begin;
    final long end;

    Range(String path, long start, long length, long begin, long end) {
      if (!(start <= begin && begin < end && end <= start + length)) {
        throw new IllegalArgumentException(
            "range [" + begin + ", " + end + ") is not inside segment " + path);
      }
      this.path = path;
      this.start = start;
      this.length = length;
      this.begin = begin;
      this.end = end;
    }
  }

  /** What one task reads: its ranges in offset order. */
  static final class Part implements InputPartition {
    private static final long serialVersionUID = 1L;
    final int index;
    final Range[] ranges;

    Part(int index, Range[] ranges) {
      this.index = index;
      this.ranges = ranges;
    }
  }

  static List<Part> parsePartitions(String json) {
    if (json == null || json.isEmpty()) {
      throw new IllegalArgumentException(
          "commitlog_jvm needs the option 'partitions' (the driver's plan); use "
              + "trioha.pipeline.read_commitlog(spark, path, engine='jvm')");
    }
    List<Part> parts = new ArrayList<>();
    try {
      JsonNode root = new ObjectMapper().readTree(json);
      for (JsonNode p : root) {
        List<Range> ranges = new ArrayList<>();
        for (JsonNode r : p.get("ranges")) {
          ranges.add(
              new Range(
                  r.get("path").asText(),
                  r.get("start").asLong(),
                  r.get("length").asLong(),
                  r.get("begin").asLong(),
                  r.get("end").asLong()));
        }
        parts.add(new Part(parts.size(), ranges.toArray(new Range[0])));
      }
    } catch (IOException | NullPointerException e) {
      throw new IllegalArgumentException("option 'partitions' is not a partition plan: " + e, e);
    }
    return parts;
  }

  static final class CommitLogTable implements Table, SupportsRead {
    @Override
    public String name() {
      return "commitlog_jvm";
    }

    @Override
    public StructType schema() {
      return SCHEMA;
    }

    @Override
    public Set<TableCapability> capabilities() {
      return EnumSet.of(TableCapability.BATCH_READ);
    }

    @Override
    public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
      return new CommitLogScan(options);
    }
  }

  static final class CommitLogScan
      implements ScanBuilder, SupportsPushDownRequiredColumns, Scan, Batch {
    private final Settings settings;
    private final List<Part> parts;
    private StructType required = SCHEMA;

    CommitLogScan(CaseInsensitiveStringMap options) {
      settings = new Settings(options);
      parts = parsePartitions(options.get("partitions"));
    }

    @Override
    public void pruneColumns(StructType requiredSchema) {
      required = requiredSchema;
    }

    @Override
    public Scan build() {
      return this;
    }

    @Override
    public StructType readSchema() {
      return required;
    }

    @Override
    public String description() {
      return "commitlog_jvm [" + parts.size() + " partition(s)]";
    }

    @Override
    public Batch toBatch() {
      return this;
    }

    @Override
    public InputPartition[] planInputPartitions() {
      return parts.toArray(new InputPartition[0]);
    }

    @Override
    public PartitionReaderFactory createReaderFactory() {
      return new Factory(settings, required);
    }
  }

  static final class Factory implements PartitionReaderFactory {
    private static final long serialVersionUID = 1L;
    private final Settings settings;
    private final StructType schema;

    Factory(Settings settings, StructType schema) {
      this.settings = settings;
      this.schema = schema;
    }

    @Override
    public boolean supportColumnarReads(InputPartition partition) {
      return true;
    }

    @Override
    public PartitionReader<InternalRow> createReader(InputPartition partition) {
      throw new UnsupportedOperationException("commitlog_jvm reads columnar batches only");
    }

    @Override
    public PartitionReader<ColumnarBatch> createColumnarReader(InputPartition partition) {
      return new CommitLogReader(((Part) partition).ranges, schema, settings);
    }
  }
}
