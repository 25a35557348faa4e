// What `train --data` names, opened: one dataset folder, or a weighted mixture of several
// (data/mixture.h), as the train and val loaders. Every source must come from one
// tokenizer (the manifests' fingerprints agree).
#pragma once
#include <string>
#include <vector>

#include "core/status.h"
#include "data/loader.h"
#include "data/mixture.h"

namespace meshtrain::data {

struct TrainingData {
  std::vector<MixtureSpec> sources;
  TokenLoader train, val;
  bool has_val = false;               // every source has a val split
  std::string tokenizer_fingerprint;  // empty when no source names its tokenizer
  int tokenizer_vocab = 0;
  std::string tokenizer_source;       // where those two came from
};

Status open_training_data(const std::string& data_arg, TrainingData* out);

// The vocabulary size of the tokenizer `data_arg`'s (first) source was prepared with, from
// its manifest or its tokenizer copy; 0 when it names none.
int data_tokenizer_vocab(const std::string& data_arg);

// The token that ends each document in `data_arg`'s (first) source: the end-of-text token of
// the tokenizer it was prepared with (its copy in the folder; BOS where it has no EOS, as
// prep separates documents). An error when the folder holds no tokenizer copy.
Status data_document_separator(const std::string& data_arg, int* separator);

// The realised shares as JSON-ready text: "web 0.7000, books 0.3000".
std::string describe_shares(const TokenLoader& loader, int64_t steps, int G);

}  // namespace meshtrain::data
