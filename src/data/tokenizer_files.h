// A tokenizer travels with what it produced. `prep` copies the files of the tokenizer it used
// (whatever Tokenizer::source_files() lists: encoder.json + vocab.bpe, tokenizer.json +
// tokenizer_config.json, tokenizer.model, cl100k_base.tiktoken, ...) under their own names
// into <data>/tokenizer/, with manifest.json giving the format and each file's size and
// checksum; `train` copies that folder into <run>/tokenizer/ and records the data folder in
// config.json. A run folder is then enough to sample from, wherever the source tree, the
// downloads or the data went: load_tokenizer reads a copy as it reads the original.
//
// manifest.json: {"format": "gpt2-bpe" | "hf-bpe" | "tiktoken" | "sentencepiece" | ...,
//                 "name": ..., "vocab_size": N, "source": the folder or file copied,
//                 "files": {name: {"bytes": n, "checksum64": hex}, ...}}
// Copies written before the generalization ("gpt2-bpe", encoder.json and vocab.bpe, no name
// or vocab_size) verify as they always did.
#pragma once
#include <string>
#include <vector>

#include "core/status.h"
#include "data/tokenizer.h"

namespace meshtrain::data {

inline constexpr const char* kTokenizerFolder = "tokenizer";

// Copies the files of `tokenizer` into to_dir (created) with a manifest.
Status save_tokenizer_copy(const Tokenizer& tokenizer, const std::string& to_dir);
// The same for the tokenizer at `from` (anything load_tokenizer reads). A verified copy is
// copied as its manifest lists it, without loading the tokenizer; copying one onto itself
// is a no-op.
Status save_tokenizer_copy(const std::string& from, const std::string& to_dir);
// Whether `dir` holds a tokenizer copy (a manifest.json).
bool has_tokenizer_copy(const std::string& dir);
// Checks a copy's files against its manifest (sizes and checksums) and returns, in
// *fingerprint, one string that identifies the tokenizer (equal copies, equal strings): its
// files' names and checksums.
Status verify_tokenizer_copy(const std::string& dir, std::string* fingerprint = nullptr);
// The fingerprint a copy of `tokenizer` would have, from its own files.
Status tokenizer_fingerprint(const Tokenizer& tokenizer, std::string* fingerprint);
// Whether two fingerprints are the same files' contents, whatever the files are called
// (export writes GPT-2's encoder.json as vocab.json).
bool same_tokenizer(const std::string& a, const std::string& b);
// The vocabulary of the tokenizer a verified copy holds: the manifest's vocab_size, or for
// an older manifest without one, the loaded tokenizer's.
Status tokenizer_copy_vocab(const std::string& dir, int* vocab_size);

// The tokenizer in the files Hugging Face's from_pretrained reads, written by `export` next
// to the weights (their names in *written):
// - GPT-2's BPE: vocab.json and merges.txt, which are encoder.json and vocab.bpe under the
//   names GPT2Tokenizer(Fast) reads;
// - any other format: its own files under their own names (tokenizer.json and
//   tokenizer_config.json; a SentencePiece model as tokenizer.model, LlamaTokenizer's name;
//   a tiktoken file as it is).
Status write_hf_tokenizer(const Tokenizer& tokenizer, const std::string& to_dir, std::vector<std::string>* written);
// llm.c's decoding table (what its samplers read as gpt2_tokenizer.bin): a header of 256
// int32 (magic 20240328, version 2, vocabulary size, end-of-text id), then each token as
// one length byte and its bytes. Only for tokenizers whose text is their tokens' bytes
// joined (GPT-2's and tiktoken's byte-level BPE) with an end-of-text token; else an error
// saying why (llmc_tokenizer_unsupported).
Status write_llmc_tokenizer(const Tokenizer& tokenizer, const std::string& path);
// Why llm.c's table cannot hold `tokenizer`, or "" when it can.
std::string llmc_tokenizer_unsupported(const Tokenizer& tokenizer);

}  // namespace meshtrain::data
