// Hugging Face tokenizer.json (the `tokenizers` library's serialized pipeline) for BPE
// models: GPT-2/RoBERTa/Llama 3/Qwen2-style byte-level BPE and Llama 2/Mistral-style
// SentencePiece BPE with byte fallback.
//
// Why one class for both: a tokenizer.json is a pipeline (added tokens -> normalizer ->
// pre-tokenizer -> model -> post-processor, with a decoder beside it), and the two families
// differ only in which stages are present. The pre-tokenizer decides the model's alphabet:
// with ByteLevel in it, a piece's UTF-8 bytes are the initial symbols (each spelt by GPT-2's
// byte alphabet in the vocabulary); without it, a piece's Unicode characters are, and a
// character missing from the vocabulary falls back to <0xNN> byte tokens (byte_fallback) or
// the unknown token.
//
// What is read, and how it departs from the Rust library:
// - model: type "BPE" only; vocab, merges ("a b" strings or ["a","b"] pairs), unk_token,
//   fuse_unk, byte_fallback, ignore_merges. continuing_subword_prefix/end_of_word_suffix
//   (WordPiece-style BPE) and dropout are refused.
// - normalizer: NFC, NFD, NFKC, NFKD, Lowercase, Prepend, Replace (String or Regex), Strip,
//   Sequence. pre_tokenizer: ByteLevel, Split, Metaspace, Digits, Sequence. Nothing but
//   Digits may follow ByteLevel (later stages here see raw bytes, not the byte alphabet).
// - added_tokens: special or un-normalized ones are matched in the raw text, normalized ones
//   in each normalized stretch between them; leftmost-longest, with lstrip/rstrip/single_word.
// - post_processor: TemplateProcessing (a special token before $A is BOS, after it EOS),
//   RobertaProcessing/BertProcessing (cls BOS, sep EOS), ByteLevel (no-op), Sequence.
//   tokenizer_config.json beside the file overrides add_bos_token/add_eos_token and names
//   bos_token/eos_token.
// - decoder: ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip, Sequence, folded into
//   one byte string per id (token_bytes) plus the interface's leading-space rule.
// - Invalid UTF-8 (which the Rust library cannot be given) never fails: regexes skip invalid
//   bytes, so they form pieces of their own; in byte-level mode they are ordinary bytes, in
//   SentencePiece mode each becomes its <0xNN> token (or unk), so decode round-trips whenever
//   the vocabulary has byte tokens.
//
// Thread safety: immutable after load; encode keeps its scratch per thread.
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "data/tokenizer.h"

namespace meshtrain::data {

class HfTokenizer : public Tokenizer {
 public:
  // PATH is a tokenizer.json file (any *.json name) or a folder holding tokenizer.json;
  // tokenizer_config.json beside it is read when present. Errors name the file.
  static Status load(const std::string& path, HfTokenizer* out);
  // Whether PATH is a folder with tokenizer.json or a *.json file.
  static bool files_in(const std::string& path);
  // The same from contents; an empty config_json means no tokenizer_config.json. The names
  // stand for the files in messages.
  static Status from_strings(std::string_view tokenizer_json, std::string_view config_json,
                             const std::string& json_name, const std::string& config_name, HfTokenizer* out);

  std::vector<int> encode(std::string_view text) const override;
  std::string_view token_bytes(int id) const override;
  int vocab_size() const override;
  // Whether the pre-tokenizer holds ByteLevel (the model's symbols are bytes).
  bool byte_level() const;

  struct Impl;

 private:
  std::shared_ptr<const Impl> impl_;
};

}  // namespace meshtrain::data
