package trioha.pipeline.jvm;

import com.github.luben.zstd.ZstdInputStream;
import java.io.ByteArrayInputStream;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.util.zip.DataFormatException;
import java.util.zip.Inflater;

/**
 * Compressed bodies, as trioha/pipeline/_batches.py's compression_of and decompress: the
 * algorithm from the sysflag (MessageSysFlag, CompressionType.findByValue), and the body as
 * the producer sent it (UtilAll.uncompress, Lz4Compressor, ZstdCompressor), with
 * java.util.zip, the zstd-jni Spark itself ships, and {@link Lz4Frame}.
 */
final class Bodies {
  private Bodies() {}

  static String compressionName(int sysflag) {
    int code = (sysflag >> 8) & 7;
    switch (code) {
      case 0: case 3: return "zlib";
      case 1: return "lz4";
      case 2: return "zstd";
      default: return "unknown(" + code + ")";
    }
  }

  /** The decompressed body, or null when it does not decompress (left as stored). */
  static byte[] decompress(byte[] b, int off, int len, String algorithm) {
    try {
      switch (algorithm) {
        case "zlib": return inflate(b, off, len);
        case "lz4": return Lz4Frame.decode(b, off, len);
        case "zstd": return drain(new ZstdInputStream(new ByteArrayInputStream(b, off, len)));
        default: return null;
      }
    } catch (IOException | RuntimeException | LinkageError e) {
      return null;
    }
  }

  /**
   * zlib.decompress: a complete zlib stream; bytes after its end are ignored. Whether the
   * stream has ended is asked after every call, before a call that produced nothing counts
   * as a failure: the last call of a stream may produce nothing (an empty body, or output
   * that ended exactly at a chunk's end) and still finish it, and needsInput() is true
   * then too, all input being consumed.
   */
  private static byte[] inflate(byte[] b, int off, int len) {
    Inflater inf = new Inflater();
    try {
      inf.setInput(b, off, len);
      ByteArrayOutputStream out = new ByteArrayOutputStream(Math.max(64, 4 * len));
      byte[] chunk = new byte[1 << 16];
      while (true) {
        int n = inf.inflate(chunk);
        out.write(chunk, 0, n);
        if (inf.finished()) {
          return out.toByteArray();
        }
        if (n == 0 && (inf.needsInput() || inf.needsDictionary())) {
          return null; // truncated, or a preset dictionary nobody has
        }
      }
    } catch (DataFormatException e) {
      return null;
    } finally {
      inf.end();
    }
  }

  private static byte[] drain(InputStream in) throws IOException {
    try (InputStream s = in) {
      return s.readAllBytes();
    }
  }
}
