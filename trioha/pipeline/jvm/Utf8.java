package trioha.pipeline.jvm;

import java.io.ByteArrayOutputStream;

/**
 * UTF-8 checking and repair as Python's {@code bytes.decode("utf-8", "replace")} does it,
 * which the Python reader uses for topics and properties: each maximal ill-formed
 * subsequence (Unicode's "maximal subpart" practice) becomes one U+FFFD.
 */
final class Utf8 {
  private Utf8() {}

  /** null if b[off, off + len) is well-formed UTF-8, else the repaired bytes. */
  static byte[] replaceInvalid(byte[] b, int off, int len) {
    int end = off + len;
    int i = off;
    while (i < end) {
      if (b[i] >= 0) {
        i++;
        continue;
      }
      int n = sequence(b, i, end);
      if (n < 0) {
        return repair(b, off, end);
      }
      i += n;
    }
    return null;
  }

  /**
   * The length of the well-formed sequence starting at i, or -(length of its maximal
   * ill-formed subpart) (at least 1) when it is not well-formed.
   */
  private static int sequence(byte[] b, int i, int end) {
    int lead = b[i] & 0xFF;
    int need;
    int lo = 0x80;
    int hi = 0xBF;
    if (lead >= 0xC2 && lead <= 0xDF) {
      need = 1;
    } else if (lead >= 0xE0 && lead <= 0xEF) {
      need = 2;
      if (lead == 0xE0) lo = 0xA0;
      if (lead == 0xED) hi = 0x9F;
    } else if (lead >= 0xF0 && lead <= 0xF4) {
      need = 3;
      if (lead == 0xF0) lo = 0x90;
      if (lead == 0xF4) hi = 0x8F;
    } else {
      return -1;
    }
    for (int k = 1; k <= need; k++) {
      if (i + k >= end) {
        return -k;
      }
      int c = b[i + k] & 0xFF;
      if (c < lo || c > hi) {
        return -k;
      }
      lo = 0x80;
      hi = 0xBF;
    }
    return need + 1;
  }

  private static byte[] repair(byte[] b, int off, int end) {
    ByteArrayOutputStream out = new ByteArrayOutputStream(end - off + 8);
    int i = off;
    while (i < end) {
      if (b[i] >= 0) {
        out.write(b[i]);
        i++;
        continue;
      }
      int n = sequence(b, i, end);
      if (n > 0) {
        out.write(b, i, n);
        i += n;
      } else {
        out.write(0xEF);
        out.write(0xBF);
        out.write(0xBD);
        i += -n;
      }
    }
    return out.toByteArray();
  }
}
