#include "core/text.h"

#include <algorithm>
#include <cstdio>
#include <vector>

namespace meshtrain {

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);  // one row of the table, updated in place
  for (size_t j = 0; j <= b.size(); j++) row[j] = j;
  for (size_t i = 1; i <= a.size(); i++) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); j++) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] != b[j - 1])});
      diag = up;
    }
  }
  return row[b.size()];
}

namespace {

// The length of the UTF-8 sequence at text[i] (1-4), or 0 when it is not a valid one.
size_t utf8_sequence(std::string_view t, size_t i) {
  const unsigned char c = (unsigned char)t[i];
  if (c < 0x80) return 1;
  const size_t n = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
  if (n == 0 || i + n > t.size()) return 0;
  for (size_t k = 1; k < n; k++)
    if (((unsigned char)t[i + k] & 0xC0) != 0x80) return 0;
  const unsigned char d = (unsigned char)t[i + 1];
  if (c == 0xE0 && d < 0xA0) return 0;  // overlong
  if (c == 0xED && d >= 0xA0) return 0;  // a surrogate
  if (c == 0xF0 && d < 0x90) return 0;  // overlong
  if (c == 0xF4 && d >= 0x90) return 0;  // past U+10FFFF
  return n;
}

}  // namespace

size_t first_non_text_byte(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    const unsigned char c = (unsigned char)text[i];
    if ((c < 0x20 && c != '\t' && c != '\n' && c != '\r') || c == 0x7F) return i;
    const size_t n = utf8_sequence(text, i);
    if (n == 0) return i;
    i += n;
  }
  return std::string_view::npos;
}

std::string escaped_excerpt(std::string_view text, size_t at, size_t width) {
  const size_t from = at > width ? at - width : 0, to = std::min(text.size(), at + width + 1);
  std::string out;
  for (size_t i = from; i < to; i++) {
    const unsigned char c = (unsigned char)text[i];
    if (c >= 0x20 && c < 0x7F && c != '\\') {
      out += (char)c;
      continue;
    }
    char hex[8];
    std::snprintf(hex, sizeof hex, "\\x%02X", c);
    out += hex;
  }
  return out;
}

}  // namespace meshtrain
