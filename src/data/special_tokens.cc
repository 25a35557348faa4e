#include "data/special_tokens.h"

#include <unicode/uchar.h>

#include <algorithm>
#include <cstring>

#include "data/byte_text.h"

namespace meshtrain::data {

namespace {

// The character ending at text[end) (walking back over continuation bytes), or -1.
int32_t char_before(std::string_view text, size_t end) {
  if (end == 0) return -1;
  size_t start = end - 1;
  while (start > 0 && end - start < 4 && is_utf8_continuation(static_cast<unsigned char>(text[start]))) --start;
  char32_t cp = 0;
  return decode_utf8(text, start, &cp) == end - start ? int32_t(cp) : -1;
}

int32_t char_after(std::string_view text, size_t begin) {
  if (begin >= text.size()) return -1;
  char32_t cp = 0;
  return decode_utf8(text, begin, &cp) ? int32_t(cp) : -1;
}

bool is_space(int32_t cp) { return cp >= 0 && u_isUWhiteSpace(cp); }
bool is_word(int32_t cp) { return cp >= 0 && u_isalnum(cp); }

}  // namespace

void SpecialTokenMatcher::add(SpecialTokenSpec spec) {
  if (spec.content.empty()) return;
  const auto first = static_cast<unsigned char>(spec.content[0]);
  tokens_.push_back(std::move(spec));
  std::vector<int>& bucket = by_first_byte_[first];
  if (bucket.empty()) ++distinct_first_bytes_, only_first_byte_ = first;
  bucket.push_back(int(tokens_.size()) - 1);
  std::stable_sort(bucket.begin(), bucket.end(),
                   [&](int a, int b) { return tokens_[a].content.size() > tokens_[b].content.size(); });
}

bool SpecialTokenMatcher::single_word_ok(std::string_view text, size_t begin, size_t end) const {
  return !is_word(char_before(text, begin)) && !is_word(char_after(text, end));
}

bool SpecialTokenMatcher::find(std::string_view text, size_t from, Match* match) const {
  if (tokens_.empty()) return false;
  for (size_t pos = from; pos < text.size(); ++pos) {
    if (distinct_first_bytes_ == 1) {
      const void* hit = std::memchr(text.data() + pos, only_first_byte_, text.size() - pos);
      if (hit == nullptr) return false;
      pos = size_t(static_cast<const char*>(hit) - text.data());
    }
    for (int index : by_first_byte_[static_cast<unsigned char>(text[pos])]) {
      const SpecialTokenSpec& t = tokens_[index];
      if (text.compare(pos, t.content.size(), t.content) != 0) continue;
      size_t begin = pos, end = pos + t.content.size();
      if (t.single_word && !single_word_ok(text, begin, end)) continue;
      if (t.lstrip) {
        for (int32_t cp; begin > from && is_space(cp = char_before(text, begin));) {
          begin -= utf8_length(char32_t(cp));
        }
      }
      if (t.rstrip) {
        for (int32_t cp; is_space(cp = char_after(text, end));) end += utf8_length(char32_t(cp));
      }
      *match = Match{begin, end, t.id};
      return true;
    }
  }
  return false;
}

}  // namespace meshtrain::data
