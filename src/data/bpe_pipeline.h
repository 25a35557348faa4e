// The encoding pipeline the Hugging Face and tiktoken loaders both build: special tokens
// matched in the raw text, then normalizers, pre-tokenizers and the BPE model on the
// stretches between them. tokenizer.json describes exactly such a pipeline; a tiktoken rank
// file is one with a single regex Split, byte-level symbols, whole-piece lookup first
// (ignore_merges) and merges derived from the ranks. Sharing it keeps one encoder to make
// fast and to get right.
//
// Immutable once finish() has run; encode() is thread-safe (scratch is per thread).
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "data/bpe_merge.h"
#include "data/special_tokens.h"
#include "data/text_regex.h"

namespace meshtrain::data {

struct NormalizerStep {
  enum class Kind { kNfc, kNfd, kNfkc, kNfkd, kLowercase, kPrepend, kReplace, kStrip };
  Kind kind;
  std::string text;  // kPrepend: what is prepended; kReplace: the literal pattern
  std::shared_ptr<const TextRegex> regex;  // kReplace with a Regex pattern
  std::string content;                      // kReplace: the replacement (taken literally)
  bool left = false, right = false;         // kStrip
};

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };
enum class PrependScheme { kAlways, kFirst, kNever };

struct PreTokenizerStep {
  enum class Kind { kSplit, kByteLevel, kMetaspace, kDigits };
  Kind kind;
  std::shared_ptr<const TextRegex> regex;  // kSplit with a Regex; kByteLevel with use_regex
  std::string literal;                      // kSplit with a String
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
  bool add_prefix_space = false;    // kByteLevel
  std::string replacement;          // kMetaspace
  PrependScheme prepend = PrependScheme::kAlways;
  bool split = true;                // kMetaspace
  bool individual_digits = false;   // kDigits
};

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

struct BpePipeline {
  struct VocabEntry {
    int id;
    bool whole = false;  // the merges turn this token's own spelling into exactly it
  };

  std::vector<NormalizerStep> normalizers;
  std::vector<PreTokenizerStep> pre_tokenizers;
  // Symbols are bytes (vocab keyed by raw bytes) rather than Unicode characters (vocab keyed
  // by the token's text).
  bool byte_level = false;
  std::unordered_map<std::string, VocabEntry, StringHash, std::equal_to<>> vocab;
  PairMerges merges;
  int unk_id = -1;
  bool fuse_unk = false;
  bool byte_fallback = false;  // a character missing from vocab becomes its <0xNN> tokens
  bool ignore_merges = false;  // a whole piece in vocab is emitted without merging
  int byte_fallback_ids[256];  // id of <0xNN>, or -1
  SpecialTokenMatcher raw_specials;         // matched before normalization
  SpecialTokenMatcher normalized_specials;  // matched in each normalized stretch
  std::vector<std::string> token_bytes;     // id -> bytes it decodes to

  BpePipeline() { std::fill(std::begin(byte_fallback_ids), std::end(byte_fallback_ids), -1); }
  // Precomputes the lookups encode() uses; call once everything above is set.
  void finish();
  void encode(std::string_view text, std::vector<int>* ids) const;
  // The normalizers applied to `in` (used for normalized added tokens' contents too).
  void normalize(std::string_view in, std::string* out) const;

 private:
  struct Scratch;
  void encode_stretch(std::string_view text, bool at_start, std::vector<int>* ids, Scratch& s) const;
  void pre_tokenize_and_encode(std::string_view text, bool at_start, std::vector<int>* ids, Scratch& s) const;
  void encode_piece(std::string_view piece, std::vector<int>* ids, std::vector<int>* symbols) const;
  void initial_symbols(std::string_view piece, std::vector<int>* symbols) const;

  int byte_symbols_[256];  // byte-level: id of the byte's one-symbol token, or -1
  int ascii_ids_[128];     // character mode: id of each ASCII character's token, or -1
};

}  // namespace meshtrain::data
