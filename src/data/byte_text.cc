#include "data/byte_text.h"

namespace meshtrain::data {

std::array<char32_t, 256> bytes_to_unicode() {
  std::array<char32_t, 256> table{};
  char32_t next_extra = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    table[b] = printable ? char32_t(b) : next_extra++;
  }
  return table;
}

std::array<int, kByteAlphabetEnd> unicode_to_bytes() {
  std::array<int, kByteAlphabetEnd> byte_of;
  byte_of.fill(-1);
  const auto table = bytes_to_unicode();
  for (int b = 0; b < 256; ++b) byte_of[table[b]] = b;
  return byte_of;
}

void append_utf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(char(cp));
  } else if (cp < 0x800) {
    out->push_back(char(0xC0 | (cp >> 6)));
    out->push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(char(0xE0 | (cp >> 12)));
    out->push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(char(0xF0 | (cp >> 18)));
    out->push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(char(0x80 | (cp & 0x3F)));
  }
}

size_t decode_utf8(std::string_view s, size_t i, char32_t* cp) {
  const auto at = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char b0 = at(i);
  const size_t left = s.size() - i;
  if (b0 < 0x80) {
    *cp = b0;
    return 1;
  }
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    if (left < 2 || !is_utf8_continuation(at(i + 1))) return 0;
    *cp = (char32_t(b0 & 0x1F) << 6) | (at(i + 1) & 0x3F);
    return 2;
  }
  if (b0 >= 0xE0 && b0 <= 0xEF) {
    if (left < 3 || !is_utf8_continuation(at(i + 1)) || !is_utf8_continuation(at(i + 2))) return 0;
    const unsigned char b1 = at(i + 1);
    if ((b0 == 0xE0 && b1 < 0xA0) || (b0 == 0xED && b1 > 0x9F)) return 0;  // overlong, surrogate
    *cp = (char32_t(b0 & 0x0F) << 12) | (char32_t(b1 & 0x3F) << 6) | (at(i + 2) & 0x3F);
    return 3;
  }
  if (b0 >= 0xF0 && b0 <= 0xF4) {
    if (left < 4 || !is_utf8_continuation(at(i + 1)) || !is_utf8_continuation(at(i + 2)) ||
        !is_utf8_continuation(at(i + 3)))
      return 0;
    const unsigned char b1 = at(i + 1);
    if ((b0 == 0xF0 && b1 < 0x90) || (b0 == 0xF4 && b1 > 0x8F)) return 0;  // overlong, > U+10FFFF
    *cp = (char32_t(b0 & 0x07) << 18) | (char32_t(b1 & 0x3F) << 12) |
          (char32_t(at(i + 2) & 0x3F) << 6) | (at(i + 3) & 0x3F);
    return 4;
  }
  return 0;
}

bool unmap_byte_alphabet(std::string_view token, const std::array<int, kByteAlphabetEnd>& byte_of,
                         std::string* out) {
  out->clear();
  for (size_t i = 0; i < token.size();) {
    char32_t cp = 0;
    const size_t n = decode_utf8(token, i, &cp);
    if (n == 0 || cp >= byte_of.size() || byte_of[cp] < 0) return false;
    out->push_back(char(byte_of[cp]));
    i += n;
  }
  return true;
}

}  // namespace meshtrain::data
