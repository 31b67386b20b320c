/*
 * Reading one planned partition in the JVM: the record walk of trioha/pipeline/_framing.py
 * (_frame, _after_run; find_record, explain_record in _validation.py) and the decoding of
 * decode_records (_batches.py), one record at a time into columnar batches. What counts as a message, and every value of
 * every column, is the Python reader's; the tests compare both engines on the same logs.
 */
package trioha.pipeline.jvm;

import java.io.IOException;
import java.io.RandomAccessFile;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.execution.vectorized.OnHeapColumnVector;
import org.apache.spark.sql.execution.vectorized.WritableColumnVector;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarBatch;

final class CommitLogReader implements PartitionReader<ColumnarBatch> {
  // CommitLog record layout (CommitLog.MessageExtEncoder.encode); see trioha/pipeline/_format.py
  static final int MESSAGE_MAGIC = 0xDAA320A7;
  static final int MESSAGE_MAGIC_V2 = 0xDAA320AB;
  static final int BLANK_MAGIC = 0xCBD43194;
  static final int MIN_RECORD_SIZE = 88 + 1 + 2;
  static final int POS_PHYSICAL_OFFSET = 28;
  static final int POS_SYSFLAG = 36;
  static final int SYSFLAG_COMPRESSED = 0x1;
  /** Spark's timestamp range in milliseconds (0001-01-01 to 9999-12-31 UTC). */
  static final long MIN_MILLIS = -62_135_596_800_000L;
  static final long MAX_MILLIS = 253_402_300_799_999L;

  // Column numbers of the full schema.
  static final int PHYSICAL_OFFSET = 0, SIZE = 1, TOPIC = 2, QUEUE_ID = 3, QUEUE_OFFSET = 4,
      TAGS = 5, KEYS = 6, BORN_TIMESTAMP = 7, BORN_HOST = 8, STORE_TIMESTAMP = 9, STORE_HOST = 10,
      SYSFLAG = 11, FLAG = 12, BODY_CRC = 13, RECONSUME_TIMES = 14, PREPARED = 15, MAGIC_CODE = 16,
      PROPERTIES = 17, BODY = 18, MSG_ID = 19, COMPRESSED = 20, COMPRESSION = 21, COLUMNS = 22;

  private static final byte[] TAGS_KEY = "TAGS".getBytes(StandardCharsets.US_ASCII);
  private static final byte[] KEYS_KEY = "KEYS".getBytes(StandardCharsets.US_ASCII);
  private static final byte[] HEX = "0123456789ABCDEF".getBytes(StandardCharsets.US_ASCII);

  private final CommitLogSource.Range[] ranges;
  private final CommitLogSource.Settings settings;
  /** For each column of the full schema, its vector in the batch (null: not read). */
  private final WritableColumnVector[] vectors = new WritableColumnVector[COLUMNS];
  private final ColumnarBatch batch;
  private final boolean decode;

  private int rangeIndex = -1;
  private ByteBuffer buf; // the current segment's readable bytes (null: no range open)
  private long segStart;
  private int size; // min(file length, planned length)
  private int pos; // the walk position, relative to the segment; -1: nothing more here
  private int hi; // the range's end, relative

  private byte[] scratch = new byte[1 << 16];
  private final byte[] msgId = new byte[56];
  // The current record's property pairs: name start, separator (\u0001), value end; kept.
  private int[] pairStart = new int[16];
  private int[] pairSep = new int[16];
  private int[] pairEnd = new int[16];
  private boolean[] pairKeep = new boolean[16];
  private final HostCache bornHosts = new HostCache();
  private final HostCache storeHosts = new HostCache();

  CommitLogReader(CommitLogSource.Range[] ranges, StructType schema, CommitLogSource.Settings settings) {
    this.ranges = ranges;
    this.settings = settings;
    ColumnVector[] cols = new ColumnVector[schema.fields().length];
    boolean any = false;
    for (int i = 0; i < cols.length; i++) {
      String name = schema.fields()[i].name();
      int full = CommitLogSource.SCHEMA.fieldIndex(name);
      OnHeapColumnVector v = new OnHeapColumnVector(settings.batchRows, schema.fields()[i].dataType());
      vectors[full] = v;
      cols[i] = v;
      any = true;
    }
    decode = any;
    batch = new ColumnarBatch(cols);
  }

  // --- walking -----------------------------------------------------------------------------

  /** The next valid record start of the partition (relative to the open segment), or -1. */
  private int nextRecord() throws IOException {
    while (true) {
      if (buf == null) {
        if (!openNextRange()) {
          return -1;
        }
      }
      if (pos < 0 || pos >= hi) {
        buf = null;
        continue;
      }
      int total = validSize(pos);
      if (total > 0) {
        int at = pos;
        pos += total;
        return at;
      }
      pos = afterStop(pos);
    }
  }

  private boolean openNextRange() throws IOException {
    rangeIndex++;
    if (rangeIndex >= ranges.length) {
      return false;
    }
    CommitLogSource.Range r = ranges[rangeIndex];
    try (RandomAccessFile f = new RandomAccessFile(r.path, "r"); FileChannel ch = f.getChannel()) {
      long readable = Math.min(ch.size(), r.length);
      if (readable > Integer.MAX_VALUE) {
        throw new IOException(
            "segment " + r.path + " is " + readable + " bytes; the JVM engine reads segments "
                + "up to 2 GiB (use engine=python)");
      }
      size = (int) Math.max(0, readable);
      buf = size == 0 ? ByteBuffer.allocate(0) : ch.map(FileChannel.MapMode.READ_ONLY, 0, size);
    }
    segStart = r.start;
    pos = (int) (r.begin - r.start);
    hi = (int) (r.end - r.start);
    return true;
  }

  /**
   * TOTALSIZE of the record at relative position p if it is a valid record, else 0:
   * explain_record's conditions (CommitLog.checkMessageAndReturnSize, plus "the stored
   * physical offset is the record's own").
   */
  private int validSize(int p) {
    long left = (long) size - p;
    if (left < 8) {
      return 0;
    }
    int total = buf.getInt(p);
    int magic = buf.getInt(p + 4);
    if (magic != MESSAGE_MAGIC && magic != MESSAGE_MAGIC_V2) {
      return 0;
    }
    if (total < MIN_RECORD_SIZE || total > left) {
      return 0;
    }
    if (buf.getLong(p + POS_PHYSICAL_OFFSET) != segStart + p) {
      return 0;
    }
    int family = (buf.getInt(p + POS_SYSFLAG) >> 4) & 3;
    int hsize = headSize(family);
    long end = (long) p + total;
    if (hsize > total) {
      return 0;
    }
    int bodyLen = buf.getInt(p + hsize - 4);
    if (bodyLen < 0) {
      return 0;
    }
    long bodyEnd = (long) p + hsize + bodyLen;
    int tlWidth = magic == MESSAGE_MAGIC_V2 ? 2 : 1;
    if (bodyEnd + tlWidth > end) {
      return 0;
    }
    int topicLen = tlWidth == 2 ? buf.getShort((int) bodyEnd) : buf.get((int) bodyEnd);
    if (topicLen < 0) {
      return 0;
    }
    long topicEnd = bodyEnd + tlWidth + topicLen;
    if (topicEnd + 2 > end) {
      return 0;
    }
    int propsLen = buf.getShort((int) topicEnd);
    if (propsLen < 0) {
      return 0;
    }
    return topicEnd + 2 + propsLen == end ? total : 0;
  }

  static int headSize(int family) {
    return 80 + ((family & 1) != 0 ? 16 : 4) + ((family & 2) != 0 ? 16 : 4);
  }

  /** _after_run for messages: where reading goes on after what stopped a run at p. */
  private int afterStop(int p) {
    long left = (long) size - p;
    if (left <= 0) {
      return -1;
    }
    if (left >= 8 && buf.getInt(p + 4) == BLANK_MAGIC) {
      return -1; // the end-of-file marker: the segment is done
    }
    return findRecord(p + 1);
  }

  /** find_record: the first position at or after lo holding a valid record, or -1. */
  private int findRecord(int lo) {
    byte m0 = (byte) (MESSAGE_MAGIC >>> 24);
    for (int q = lo + 4; q + 3 <= size; q++) {
      if (buf.get(q) == m0 && validSize(q - 4) > 0) {
        return q - 4;
      }
    }
    return -1;
  }

  // --- batches -----------------------------------------------------------------------------

  @Override
  public boolean next() throws IOException {
    for (WritableColumnVector v : vectors) {
      if (v != null) {
        v.reset();
      }
    }
    bornHosts.clear();
    storeHosts.clear();
    int rows = 0;
    long bytes = 0;
    while (rows < settings.batchRows && (rows == 0 || bytes < settings.batchBytes)) {
      int at = nextRecord();
      if (at < 0) {
        break;
      }
      int total = buf.getInt(at);
      if (decode) {
        put(rows, at, total);
      }
      rows++;
      bytes += total;
    }
    batch.setNumRows(rows);
    return rows > 0;
  }

  @Override
  public ColumnarBatch get() {
    return batch;
  }

  @Override
  public void close() {
    buf = null;
    batch.close();
  }

  private static int i32(byte[] b, int at) {
    return ((b[at] & 0xFF) << 24) | ((b[at + 1] & 0xFF) << 16) | ((b[at + 2] & 0xFF) << 8) | (b[at + 3] & 0xFF);
  }

  private static long i64(byte[] b, int at) {
    return ((long) i32(b, at) << 32) | (i32(b, at + 4) & 0xFFFFFFFFL);
  }

  /** Decode the (valid) record at relative position at into row i of the batch. */
  private void put(int i, int at, int total) {
    if (scratch.length < total) {
      scratch = new byte[Math.max(total, 2 * scratch.length)];
    }
    byte[] r = scratch;
    buf.get(at, r, 0, total);
    int magic = i32(r, 4);
    int sysflag = i32(r, POS_SYSFLAG);
    int family = (sysflag >> 4) & 3;
    int bornLen = (family & 1) != 0 ? 16 : 4;
    int storeLen = (family & 2) != 0 ? 16 : 4;
    int bornAddr = 48;
    int bornPort = bornAddr + bornLen;
    int storeTs = bornPort + 4;
    int storeAddr = storeTs + 8;
    int storePort = storeAddr + storeLen;
    int reconsume = storePort + 4;
    int prepared = reconsume + 4;
    int bodyPos = prepared + 12;
    int bodyLen = i32(r, bodyPos - 4);
    int topicLenPos = bodyPos + bodyLen;
    int topicPos;
    int topicLen;
    if (magic == MESSAGE_MAGIC_V2) {
      topicLen = (short) (((r[topicLenPos] & 0xFF) << 8) | (r[topicLenPos + 1] & 0xFF));
      topicPos = topicLenPos + 2;
    } else {
      topicLen = r[topicLenPos];
      topicPos = topicLenPos + 1;
    }
    int propsPos = topicPos + topicLen + 2;
    int propsLen = total - propsPos;
    long physical = segStart + at;

    WritableColumnVector v;
    if ((v = vectors[PHYSICAL_OFFSET]) != null) v.putLong(i, physical);
    if ((v = vectors[SIZE]) != null) v.putInt(i, total);
    if ((v = vectors[TOPIC]) != null) putString(v, i, r, topicPos, topicLen);
    if ((v = vectors[QUEUE_ID]) != null) v.putInt(i, i32(r, 12));
    if ((v = vectors[QUEUE_OFFSET]) != null) v.putLong(i, i64(r, 20));
    if (vectors[TAGS] != null || vectors[KEYS] != null || vectors[PROPERTIES] != null) {
      properties(i, r, propsPos, propsLen);
    }
    if ((v = vectors[BORN_TIMESTAMP]) != null) putTimestamp(v, i, i64(r, 40));
    if ((v = vectors[BORN_HOST]) != null) {
      byte[] host = bornHosts.render(r, bornAddr, bornLen, i32(r, bornPort));
      v.putByteArray(i, host, 0, host.length);
    }
    if ((v = vectors[STORE_TIMESTAMP]) != null) putTimestamp(v, i, i64(r, storeTs));
    if ((v = vectors[STORE_HOST]) != null) {
      byte[] host = storeHosts.render(r, storeAddr, storeLen, i32(r, storePort));
      v.putByteArray(i, host, 0, host.length);
    }
    if ((v = vectors[SYSFLAG]) != null) v.putInt(i, sysflag);
    if ((v = vectors[FLAG]) != null) v.putInt(i, i32(r, 16));
    if ((v = vectors[BODY_CRC]) != null) v.putInt(i, i32(r, 8));
    if ((v = vectors[RECONSUME_TIMES]) != null) v.putInt(i, i32(r, reconsume));
    if ((v = vectors[PREPARED]) != null) v.putLong(i, i64(r, prepared));
    if ((v = vectors[MAGIC_CODE]) != null) v.putLong(i, magic & 0xFFFFFFFFL);
    if ((v = vectors[MSG_ID]) != null) {
      // MessageDecoder.createMessageId: store host address, port (int32), physical offset.
      int n = storeLen + 12;
      byte[] id = msgId;
      for (int k = 0; k < n; k++) {
        int b;
        if (k < storeLen + 4) {
          b = r[storeAddr + k] & 0xFF; // address then port, contiguous in the record
        } else {
          b = (int) (physical >>> (8 * (n - 1 - k))) & 0xFF;
        }
        id[2 * k] = HEX[b >> 4];
        id[2 * k + 1] = HEX[b & 15];
      }
      v.putByteArray(i, id, 0, 2 * n);
    }
    boolean flagged = (sysflag & SYSFLAG_COMPRESSED) != 0;
    String algorithm = flagged ? Bodies.compressionName(sysflag) : null;
    boolean still = flagged;
    if ((v = vectors[BODY]) != null || vectors[COMPRESSED] != null) {
      byte[] plain = null;
      if (flagged && settings.decompress) {
        plain = Bodies.decompress(r, bodyPos, bodyLen, algorithm);
        still = plain == null;
      }
      if (v != null) {
        if (plain != null) {
          v.putByteArray(i, plain, 0, plain.length);
        } else {
          v.putByteArray(i, r, bodyPos, bodyLen);
        }
      }
    }
    if ((v = vectors[COMPRESSED]) != null) v.putBoolean(i, still);
    if ((v = vectors[COMPRESSION]) != null) {
      if (algorithm == null) {
        v.putNull(i);
      } else {
        byte[] name = algorithm.getBytes(StandardCharsets.UTF_8);
        v.putByteArray(i, name, 0, name.length);
      }
    }
  }

  private static void putTimestamp(WritableColumnVector v, int i, long millis) {
    if (millis < MIN_MILLIS || millis > MAX_MILLIS) {
      v.putNull(i);
    } else {
      v.putLong(i, millis * 1000);
    }
  }

  private static void putString(WritableColumnVector v, int i, byte[] b, int off, int len) {
    byte[] fixed = Utf8.replaceInvalid(b, off, len);
    if (fixed == null) {
      v.putByteArray(i, b, off, len);
    } else {
      v.putByteArray(i, fixed, 0, fixed.length);
    }
  }

  /**
   * MessageDecoder.string2messageProperties as _batches._properties does it: pairs split at
   * \u0002, then at the first \u0001; a pair with an empty name or value is skipped; a later
   * duplicate name wins, and the map lists the names in the order of their last pair.
   */
  private void properties(int i, byte[] r, int off, int len) {
    byte[] text = Utf8.replaceInvalid(r, off, len);
    byte[] b = r;
    int start = off;
    int end = off + len;
    if (text != null) {
      b = text;
      start = 0;
      end = text.length;
    }
    int count = 0;
    int p = start;
    while (p <= end) {
      int q = p;
      while (q < end && b[q] != 2) {
        q++;
      }
      int sep = -1;
      for (int k = p; k < q; k++) {
        if (b[k] == 1) {
          sep = k;
          break;
        }
      }
      if (sep > p && sep < q - 1) {
        if (count == pairStart.length) {
          pairStart = java.util.Arrays.copyOf(pairStart, 2 * count);
          pairSep = java.util.Arrays.copyOf(pairSep, 2 * count);
          pairEnd = java.util.Arrays.copyOf(pairEnd, 2 * count);
          pairKeep = java.util.Arrays.copyOf(pairKeep, 2 * count);
        }
        pairStart[count] = p;
        pairSep[count] = sep;
        pairEnd[count] = q;
        pairKeep[count] = true;
        count++;
      }
      p = q + 1;
    }
    if (count > 1) {
      dropEarlierDuplicates(b, count);
    }
    int tags = -1;
    int keys = -1;
    for (int k = 0; k < count; k++) {
      if (!pairKeep[k]) {
        continue;
      }
      if (is(b, pairStart[k], pairSep[k], TAGS_KEY)) {
        tags = k;
      } else if (is(b, pairStart[k], pairSep[k], KEYS_KEY)) {
        keys = k;
      }
    }
    WritableColumnVector v;
    if ((v = vectors[TAGS]) != null) putValue(v, i, b, tags);
    if ((v = vectors[KEYS]) != null) putValue(v, i, b, keys);
    if ((v = vectors[PROPERTIES]) != null) {
      WritableColumnVector names = v.getChild(0);
      WritableColumnVector values = v.getChild(1);
      int first = names.getElementsAppended();
      int n = 0;
      for (int k = 0; k < count; k++) {
        if (pairKeep[k]) {
          names.appendByteArray(b, pairStart[k], pairSep[k] - pairStart[k]);
          values.appendByteArray(b, pairSep[k] + 1, pairEnd[k] - pairSep[k] - 1);
          n++;
        }
      }
      v.putArray(i, first, n);
    }
  }

  private static boolean is(byte[] b, int from, int to, byte[] name) {
    if (to - from != name.length) {
      return false;
    }
    for (int k = 0; k < name.length; k++) {
      if (b[from + k] != name[k]) {
        return false;
      }
    }
    return true;
  }

  private void putValue(WritableColumnVector v, int i, byte[] b, int k) {
    if (k < 0) {
      v.putNull(i);
    } else {
      v.putByteArray(i, b, pairSep[k] + 1, pairEnd[k] - pairSep[k] - 1);
    }
  }

  /** Unmark every pair whose name a later pair repeats (Java's HashMap keeps the last). */
  private void dropEarlierDuplicates(byte[] b, int count) {
    if (count <= 16) {
      for (int k = 0; k < count; k++) {
        int len = pairSep[k] - pairStart[k];
        for (int j = k + 1; j < count; j++) {
          if (pairSep[j] - pairStart[j] == len
              && java.util.Arrays.equals(
                  b, pairStart[k], pairSep[k], b, pairStart[j], pairSep[j])) {
            pairKeep[k] = false;
            break;
          }
        }
      }
      return;
    }
    HashMap<String, Integer> last = new HashMap<>();
    for (int k = 0; k < count; k++) {
      String name = new String(b, pairStart[k], pairSep[k] - pairStart[k], StandardCharsets.ISO_8859_1);
      Integer before = last.put(name, k);
      if (before != null) {
        pairKeep[before] = false;
      }
    }
  }

  /** Hosts rendered as _batches._hosts does, remembered while one batch is filled. */
  static final class HostCache {
    private final HashMap<Long, byte[]> v4 = new HashMap<>();
    private final HashMap<String, byte[]> v6 = new HashMap<>();

    void clear() {
      if (v4.size() + v6.size() > 4096) {
        v4.clear();
        v6.clear();
        lastText = null;
      }
    }

    private long lastKey = -1;
    private byte[] lastText;

    byte[] render(byte[] r, int addr, int len, int port) {
      if (len == 4) {
        long key = ((long) i32(r, addr) << 32) | (port & 0xFFFFFFFFL);
        if (key == lastKey && lastText != null) {
          return lastText;
        }
        lastKey = key;
        byte[] text = lastText = v4.get(key);
        if (text == null) {
          text = ((r[addr] & 0xFF) + "." + (r[addr + 1] & 0xFF) + "." + (r[addr + 2] & 0xFF) + "."
                  + (r[addr + 3] & 0xFF) + ":" + port).getBytes(StandardCharsets.US_ASCII);
          v4.put(key, text);
          lastText = text;
        }
        return text;
      }
      StringBuilder key = new StringBuilder(40);
      for (int k = 0; k < 16; k++) {
        key.append((char) (r[addr + k] & 0xFF));
      }
      key.append(':').append(port);
      return v6.computeIfAbsent(
          key.toString(),
          k -> ("[" + ipv6(r, addr) + "]:" + port).getBytes(StandardCharsets.US_ASCII));
    }

    /** Python's ipaddress.IPv6Address text: lower-case hextets, the first longest run of
     * two or more zero hextets written as "::". */
    static String ipv6(byte[] r, int addr) {
      int[] h = new int[8];
      for (int k = 0; k < 8; k++) {
        h[k] = ((r[addr + 2 * k] & 0xFF) << 8) | (r[addr + 2 * k + 1] & 0xFF);
      }
      int bestStart = -1;
      int bestLen = 0;
      int runStart = -1;
      int runLen = 0;
      for (int k = 0; k < 8; k++) {
        if (h[k] == 0) {
          if (runStart < 0) {
            runStart = k;
          }
          runLen++;
          if (runLen > bestLen) {
            bestLen = runLen;
            bestStart = runStart;
          }
        } else {
          runStart = -1;
          runLen = 0;
        }
      }
      StringBuilder out = new StringBuilder(40);
      if (bestLen < 2) {
        for (int k = 0; k < 8; k++) {
          if (k > 0) out.append(':');
          out.append(Integer.toHexString(h[k]));
        }
        return out.toString();
      }
      for (int k = 0; k < bestStart; k++) {
        if (k > 0) out.append(':');
        out.append(Integer.toHexString(h[k]));
      }
      out.append("::");
      for (int k = bestStart + bestLen; k < 8; k++) {
        if (k > bestStart + bestLen) out.append(':');
        out.append(Integer.toHexString(h[k]));
      }
      return out.toString();
    }
  }
}
