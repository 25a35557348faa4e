// Finds special and added tokens spelt in a text (Hugging Face's added_tokens, tiktoken's
// special tokens), so they become their single ids instead of being split by the regex.
//
// Leftmost-longest, as Hugging Face's tokenizers match them: of the tokens starting at the
// first position where any matches, the longest wins. Tokens are bucketed by first byte;
// when every token starts with the same byte ("<|...|>", "<...>", as nearly always), the
// scan is a memchr for it, so text with no candidates costs about a memory pass.
#pragma once
#include <array>
#include <string>
#include <string_view>
#include <vector>

namespace meshtrain::data {

struct SpecialTokenSpec {
  std::string content;
  int id = -1;
  bool lstrip = false;       // the match takes the whitespace before it too
  bool rstrip = false;       // ... and after it
  bool single_word = false;  // only where no letter or digit touches it on either side
};

class SpecialTokenMatcher {
 public:
  void add(SpecialTokenSpec spec);  // empty contents are ignored
  bool empty() const { return tokens_.empty(); }

  struct Match {
    size_t begin;  // including whitespace taken by lstrip (never before `from`)
    size_t end;    // including whitespace taken by rstrip
    int id;
  };
  // The first match in text[from..], or false.
  bool find(std::string_view text, size_t from, Match* match) const;

 private:
  bool single_word_ok(std::string_view text, size_t begin, size_t end) const;

  std::vector<SpecialTokenSpec> tokens_;
  std::array<std::vector<int>, 256> by_first_byte_;  // token indexes, longest first
  int distinct_first_bytes_ = 0;
  unsigned char only_first_byte_ = 0;
};

}  // namespace meshtrain::data
