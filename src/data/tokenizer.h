// The one interface every tokenizer format implements: GPT-2's encoder.json + vocab.bpe,
// Hugging Face tokenizer.json (byte-level and SentencePiece-style BPE), tiktoken rank files,
// and SentencePiece .model files. Everything above data/ (prep, train, tokenize, generate,
// serve, eval) holds a `const Tokenizer&` and never asks which format it is.
//
// Decoding is the concatenation of each token's bytes (token_bytes), then one rule at the
// start of a sequence: tokenizers that prepend a space to the text they encode (Llama 2's and
// Mistral's "▁" prefix) drop it again. That is what their reference decoders do, and it lets
// a streamed completion print each new token's bytes as they come.
//
// Thread safety: a loaded tokenizer is immutable; encode and decode may run concurrently.
#pragma once
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace meshtrain::data {

// What a tokenizer says about itself, fixed at load.
struct TokenizerInfo {
  std::string format;   // "gpt2-bpe", "hf-bpe", "tiktoken", "sentencepiece"
  std::string name;     // e.g. "cl100k_base", or the source file's name
  int bos_id = -1;      // -1: none
  int eos_id = -1;      // -1: none
  bool add_bos = false;  // the format's insertion rule (tokenizer_config.json, post-processor)
  bool add_eos = false;
  bool strip_leading_space = false;  // decode drops one space at the start of a sequence
  int longest_token_bytes = 1;       // the most bytes of text one token stands for
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // The ids of `text`, with no BOS or EOS added. Special and added tokens spelt in the text
  // become their ids, as Hugging Face's tokenizers and tiktoken's allowed_special="all" do
  // (SentencePiece .model files: as the library does, which keeps "<s>" in text as text).
  // Never fails: invalid UTF-8 is encoded as each format documents.
  virtual std::vector<int> encode(std::string_view text) const = 0;
  // encode() with the format's BOS/EOS insertion rules applied (info().add_bos/add_eos).
  std::vector<int> encode_with_special(std::string_view text) const;
  // One training document: its ids between separators. [BOS] ids [EOS] when the tokenizer
  // has a BOS distinct from its EOS (Llama, Mistral, SentencePiece); [EOS] ids when it has
  // one end-of-text token (GPT-2's and tiktoken's <|endoftext|>, llm.c's convention).
  std::vector<int> encode_document(std::string_view text) const;

  // The bytes token `id` adds to a text in the middle of a sequence. id must be in range.
  virtual std::string_view token_bytes(int id) const = 0;
  // Concatenated token bytes, then the sequence-start rule. Ids out of range: CHECK.
  virtual std::string decode(std::span<const int> ids) const;
  // The same for untrusted ids: an error names the first id out of range.
  Status decode_checked(std::span<const int> ids, std::string* out) const;

  virtual int vocab_size() const = 0;
  const TokenizerInfo& info() const { return info_; }
  // The separator prep puts between documents (EOS, or BOS where there is no EOS).
  int document_separator() const { return info_.eos_id >= 0 ? info_.eos_id : info_.bos_id; }
  // The files this tokenizer was loaded from (what a copy must carry), as absolute paths.
  const std::vector<std::string>& source_files() const { return source_files_; }

 protected:
  TokenizerInfo info_;
  std::vector<std::string> source_files_;
};

// Loads whatever tokenizer `path` is, from its contents and names:
// - a folder with tokenizer.json (and optionally tokenizer_config.json): Hugging Face;
// - a folder with tokenizer.model, or a .model file: SentencePiece (a tiktoken rank file
//   under that name, as Meta's Llama 3 release ships, is read as tiktoken);
// - a .tiktoken file, or a folder with one: tiktoken;
// - a folder with encoder.json + vocab.bpe, or vocab.json + merges.txt: GPT-2;
// - a tokenizer.json file;
// - a tokenizer copy (tokenizer_files.h) whose manifest lists one file: that file.
// An error names the path and what was looked for.
Status load_tokenizer(const std::string& path, std::unique_ptr<Tokenizer>* out);
// Whether `path` holds any tokenizer load_tokenizer reads (without loading it).
bool tokenizer_files_in(const std::string& path);

}  // namespace meshtrain::data
