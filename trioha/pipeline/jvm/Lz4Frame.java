package trioha.pipeline.jvm;

import java.util.Arrays;
import net.jpountz.xxhash.XXHash32;
import net.jpountz.xxhash.XXHashFactory;

/**
 * One LZ4 frame (the LZ4 frame format, as lz4.frame.decompress reads it: the first frame,
 * whatever follows it ignored), including frames of linked blocks, whose matches reach back
 * into earlier blocks and which lz4-java's LZ4FrameInputStream refuses. The block format is
 * decoded here into one growing output buffer, so a match may refer to any earlier output.
 * Header, block and content checksums are verified (xxHash32, from lz4-java).
 */
final class Lz4Frame {
  private Lz4Frame() {}

  private static final int MAGIC = 0x184D2204;
  private static final XXHash32 XXH = XXHashFactory.fastestJavaInstance().hash32();

  /** The frame's content, or null when the bytes are not one valid frame. */
  static byte[] decode(byte[] b, int off, int len) {
    int end = off + len;
    int p = off;
    if (len < 7 || le32(b, p) != MAGIC) {
      return null;
    }
    p += 4;
    int flg = b[p] & 0xFF;
    int bd = b[p + 1] & 0xFF;
    if ((flg >> 6) != 1 || (flg & 0x02) != 0 || (bd & 0x8F) != 0) {
      return null; // version 01, reserved bits zero
    }
    int maxBlock = 1 << (2 * ((bd >> 4) & 7) + 8);
    if (((bd >> 4) & 7) < 4) {
      return null;
    }
    boolean blockChecksum = (flg & 0x10) != 0;
    boolean contentSize = (flg & 0x08) != 0;
    boolean contentChecksum = (flg & 0x04) != 0;
    boolean dictionary = (flg & 0x01) != 0;
    int descriptor = 2 + (contentSize ? 8 : 0) + (dictionary ? 4 : 0);
    if (p + descriptor + 1 > end) {
      return null;
    }
    if (((XXH.hash(b, p, descriptor, 0) >> 8) & 0xFF) != (b[p + descriptor] & 0xFF)) {
      return null;
    }
    if (dictionary) {
      return null; // a dictionary nobody has
    }
    long declared = contentSize ? le64(b, p + 2) : -1;
    p += descriptor + 1;
    byte[] out = new byte[Math.max(64, declared >= 0 && declared < (1 << 30) ? (int) declared : 4 * len)];
    int n = 0;
    while (true) {
      if (p + 4 > end) {
        return null;
      }
      int word = le32(b, p);
      p += 4;
      if (word == 0) {
        break; // the end mark
      }
      int size = word & 0x7FFFFFFF;
      if (size > maxBlock || p + size + (blockChecksum ? 4 : 0) > end) {
        return null;
      }
      if (blockChecksum && XXH.hash(b, p, size, 0) != le32(b, p + size)) {
        return null;
      }
      if ((word & 0x80000000) != 0) { // stored uncompressed
        out = room(out, n, size);
        System.arraycopy(b, p, out, n, size);
        n += size;
      } else {
        int[] written = {n};
        out = block(b, p, p + size, out, written, maxBlock);
        if (out == null) {
          return null;
        }
        n = written[0];
      }
      p += size + (blockChecksum ? 4 : 0);
    }
    if (contentChecksum) {
      if (p + 4 > end || XXH.hash(out, 0, n, 0) != le32(b, p)) {
        return null;
      }
    }
    if (declared >= 0 && declared != n) {
      return null;
    }
    return Arrays.copyOf(out, n);
  }

  /** One compressed block appended to out at written[0]; null when it is malformed. */
  private static byte[] block(byte[] b, int p, int end, byte[] out, int[] written, int maxBlock) {
    int n = written[0];
    int limit = n + maxBlock;
    int[] at = new int[1];
    while (p < end) {
      int token = b[p++] & 0xFF;
      at[0] = p;
      int lit = length(b, at, end, token >>> 4);
      p = at[0];
      if (lit < 0 || lit > end - p || n + lit > limit) {
        return null;
      }
      out = room(out, n, lit);
      System.arraycopy(b, p, out, n, lit);
      n += lit;
      p += lit;
      if (p == end) {
        break; // the last sequence has literals only
      }
      if (p + 2 > end) {
        return null;
      }
      int offset = (b[p] & 0xFF) | ((b[p + 1] & 0xFF) << 8);
      p += 2;
      if (offset == 0 || offset > n) {
        return null;
      }
      at[0] = p;
      int match = length(b, at, end, token & 15);
      p = at[0];
      if (match < 0) {
        return null;
      }
      match += 4;
      if (n + match > limit) {
        return null;
      }
      out = room(out, n, match);
      for (int k = 0; k < match; k++) { // may overlap itself: byte by byte
        out[n + k] = out[n - offset + k];
      }
      n += match;
    }
    written[0] = n;
    return out;
  }

  /**
   * A literal or match length: the token's 4 bits, plus bytes while they are 255 when those
   * are 15. at[0] is the position of the extra bytes, moved past them; -1 if they run out.
   */
  private static int length(byte[] b, int[] at, int end, int nibble) {
    int len = nibble;
    if (nibble == 15) {
      int more;
      do {
        if (at[0] >= end) {
          return -1;
        }
        more = b[at[0]++] & 0xFF;
        len += more;
      } while (more == 255);
    }
    return len;
  }

  private static byte[] room(byte[] out, int n, int more) {
    if (n + more <= out.length) {
      return out;
    }
    return Arrays.copyOf(out, Math.max(n + more, 2 * out.length));
  }

  private static int le32(byte[] b, int p) {
    return (b[p] & 0xFF) | ((b[p + 1] & 0xFF) << 8) | ((b[p + 2] & 0xFF) << 16) | ((b[p + 3] & 0xFF) << 24);
  }

  private static long le64(byte[] b, int p) {
    return (le32(b, p) & 0xFFFFFFFFL) | ((long) le32(b, p + 4) << 32);
  }
}
