// One compiled pre-tokenization (or normalization) pattern, matched by PCRE2's JIT.
//
// Why PCRE2 and not std::regex: the patterns tokenizers publish (GPT-2's, Llama 3's,
// Qwen2's, tiktoken's cl100k/o200k) use Unicode properties (\p{L}, \p{N}, \p{Lu}),
// possessive quantifiers (?+, ++), scoped case-insensitivity (?i:...) and lookahead (?!\S);
// PCRE2 accepts all of them with Perl's meaning, as the reference implementations (Rust's
// fancy-regex/onig, Python's regex) do for these patterns, and its JIT runs them at tens of
// MB/s.
//
// Compiled with PCRE2_UTF | PCRE2_UCP (\s, \w, \d follow Unicode) and PCRE2_MATCH_INVALID_UTF:
// a byte that is not part of valid UTF-8 is never matched by anything, so it falls between
// matches, and matching never fails on untrusted text.
//
// Thread safety: immutable after compile(); each thread keeps its own match data.
#pragma once
#include <memory>
#include <string>
#include <string_view>

#include "core/status.h"

namespace meshtrain::data {

class TextRegex {
 public:
  // An error quotes PCRE2's message and the offset in the pattern where it gave up.
  static Status compile(std::string_view pattern, std::shared_ptr<const TextRegex>* out);
  ~TextRegex();

  // The first match in text[from..] (lookbehind may see text before `from`): its byte range,
  // or false. An empty match is reported like any other; callers step past it.
  bool find(std::string_view text, size_t from, size_t* begin, size_t* end) const;

  // Calls fn(begin, end) for each successive non-empty match, left to right.
  template <typename Fn>
  void for_each_match(std::string_view text, Fn&& fn) const {
    size_t from = 0, begin = 0, end = 0;
    while (from <= text.size() && find(text, from, &begin, &end)) {
      if (end > begin) {
        fn(begin, end);
        from = end;
      } else {
        from = end + char_length_at(text, end);  // past an empty match, a whole character
      }
    }
  }

  const std::string& pattern() const { return pattern_; }
  // Bytes of the UTF-8 character at text[i] (1 for an invalid byte or at the end).
  static size_t char_length_at(std::string_view text, size_t i);

 private:
  TextRegex() = default;
  struct Code;
  std::string pattern_;
  Code* code_ = nullptr;
  bool jit_ = false;
};

}  // namespace meshtrain::data
