#include "data/prep.h"

#include <cmath>
#include <filesystem>

#include "core/file_io.h"
#include "data/bpe.h"
#include "data/brown.h"
#include "data/token_file.h"
#include "data/tokenizer_files.h"

namespace meshtrain::data {

namespace fs = std::filesystem;

namespace {

Status read_documents(const PrepOptions& o, std::vector<std::string>* docs) {
  if (!o.brown_dir.empty() == !o.inputs.empty())
    return Status::error("give exactly one of --brown or --input FILE...");
  if (!o.brown_dir.empty()) {
    std::vector<std::string> paths;
    RETURN_IF_ERROR(list_brown_files(o.brown_dir, &paths));
    RETURN_IF_ERROR(filter_brown_categories(o.brown_dir, o.brown_categories, &paths));
    for (const auto& p : paths) {
      std::string tagged;
      RETURN_IF_ERROR(read_file(p, &tagged));
      docs->push_back(brown_to_text(tagged));
    }
  } else {
    for (const auto& p : o.inputs) {
      std::string text;
      RETURN_IF_ERROR(read_file(p, &text));
      docs->push_back(std::move(text));
    }
  }
  return Status::ok();
}

}  // namespace

Status prepare_corpus(const PrepOptions& o, PrepStats* stats) {
  if (!(o.val_fraction >= 0 && o.val_fraction < 1))
    return Status::error("--val-fraction must be in [0, 1)");
  if (o.out_dir.empty()) return Status::error("--out DIR is required");
  Gpt2Tokenizer tok;
  RETURN_IF_ERROR(Gpt2Tokenizer::load(o.tokenizer_dir, &tok));
  std::vector<std::string> docs;
  RETURN_IF_ERROR(read_documents(o, &docs));

  std::vector<std::vector<int>> encoded(docs.size());
#pragma omp parallel for schedule(dynamic)
  for (size_t i = 0; i < docs.size(); i++) encoded[i] = tok.encode(docs[i]);

  std::vector<Token> train, val;
  auto append = [&](std::vector<Token>& dst, const std::vector<int>& ids, size_t from, size_t to) {
    for (size_t i = from; i < to; i++) dst.push_back(static_cast<Token>(ids[i]));
  };
  const Token eot = static_cast<Token>(tok.eot_id());
  if (docs.size() == 1) {
    const auto& ids = encoded[0];
    size_t split = ids.size() - (size_t)std::floor(ids.size() * o.val_fraction);
    train.push_back(eot);
    append(train, ids, 0, split);
    if (split < ids.size()) {
      val.push_back(eot);
      append(val, ids, split, ids.size());
    }
  } else {
    size_t n_val = (size_t)std::round(docs.size() * o.val_fraction);
    if (o.val_fraction > 0 && n_val == 0) n_val = 1;
    for (size_t d = 0; d < docs.size(); d++) {
      auto& dst = d + n_val >= docs.size() ? val : train;
      dst.push_back(eot);
      append(dst, encoded[d], 0, encoded[d].size());
    }
  }
  std::error_code ec;
  fs::create_directories(o.out_dir, ec);
  if (ec) return Status::error("cannot create " + o.out_dir + ": " + ec.message());
  RETURN_IF_ERROR(write_token_file((fs::path(o.out_dir) / "train.bin").string(), train));
  RETURN_IF_ERROR(write_token_file((fs::path(o.out_dir) / "val.bin").string(), val));
  // The tokens mean nothing without their tokenizer: it goes with them.
  RETURN_IF_ERROR(save_tokenizer_copy(o.tokenizer_dir, (fs::path(o.out_dir) / kTokenizerFolder).string()));
  stats->documents = docs.size();
  stats->train_tokens = train.size();
  stats->val_tokens = val.size();
  return Status::ok();
}

}  // namespace meshtrain::data
