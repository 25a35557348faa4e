#include "data/training_data.h"

#include <cstdio>
#include <filesystem>

#include "data/dataset.h"
#include "data/tokenizer.h"
#include "data/tokenizer_files.h"

namespace meshtrain::data {

Status open_training_data(const std::string& data_arg, TrainingData* out) {
  RETURN_IF_ERROR(parse_mixture(data_arg, &out->sources));
  std::vector<TokenStream> train, val;
  std::vector<std::string> names;
  std::vector<double> weights;
  std::string fp_source;
  out->has_val = true;
  for (const MixtureSpec& s : out->sources) {
    Dataset d;
    RETURN_IF_ERROR(open_dataset(s.dir, &d).with_context(out->sources.size() > 1 ? "--data " + s.name : "--data"));
    // A folder from an earlier prep has no manifest, but may have its tokenizer's copy.
    const std::string copy = (std::filesystem::path(s.dir) / kTokenizerFolder).string();
    if (d.tokenizer_fingerprint.empty() && has_tokenizer_copy(copy)) {
      RETURN_IF_ERROR(verify_tokenizer_copy(copy, &d.tokenizer_fingerprint));
      RETURN_IF_ERROR(tokenizer_copy_vocab(copy, &d.tokenizer_vocab));
    }
    if (!d.tokenizer_fingerprint.empty()) {
      if (out->tokenizer_fingerprint.empty()) {
        out->tokenizer_fingerprint = d.tokenizer_fingerprint, fp_source = s.name;
        out->tokenizer_vocab = d.tokenizer_vocab;
        out->tokenizer_source = copy;
      } else if (d.tokenizer_fingerprint != out->tokenizer_fingerprint) {
        return Status::error("--data: '" + s.name + "' (" + s.dir + ") was prepared with another tokenizer than '" +
                             fp_source + "'; a mixture's sources must share one tokenizer");
      }
    }
    names.push_back(out->sources.size() > 1 ? s.name : s.dir);
    weights.push_back(s.weight);
    out->has_val = out->has_val && d.has_val;
    train.push_back(std::move(d.train));
    val.push_back(std::move(d.val));
  }
  if (out->sources.size() == 1) {
    out->train = TokenLoader::from_stream(std::move(train[0]), names[0]);
    if (out->has_val) out->val = TokenLoader::from_stream(std::move(val[0]), names[0]);
    return Status::ok();
  }
  RETURN_IF_ERROR(TokenLoader::mixture(std::move(train), names, weights, &out->train));
  if (out->has_val) RETURN_IF_ERROR(TokenLoader::mixture(std::move(val), names, weights, &out->val));
  return Status::ok();
}

int data_tokenizer_vocab(const std::string& data_arg) {
  std::vector<MixtureSpec> sources;
  if (!parse_mixture(data_arg, &sources).is_ok()) return 0;
  DatasetManifest m;
  if (read_manifest(sources[0].dir, &m).is_ok()) return m.tokenizer_vocab;
  int vocab = 0;
  const std::string copy = (std::filesystem::path(sources[0].dir) / kTokenizerFolder).string();
  if (has_tokenizer_copy(copy) && tokenizer_copy_vocab(copy, &vocab).is_ok()) return vocab;
  return 0;
}

Status data_document_separator(const std::string& data_arg, int* separator) {
  std::vector<MixtureSpec> sources;
  RETURN_IF_ERROR(parse_mixture(data_arg, &sources));
  const std::string copy = (std::filesystem::path(sources[0].dir) / kTokenizerFolder).string();
  if (!has_tokenizer_copy(copy))
    return Status::error("--data " + sources[0].dir + " holds no copy of its tokenizer (" + copy +
                         "), so its end-of-text token is unknown: give --doc-separator ID (GPT-2's is 50256)");
  std::unique_ptr<Tokenizer> tok;
  RETURN_IF_ERROR(load_tokenizer(copy, &tok));
  *separator = tok->document_separator();
  if (*separator < 0)
    return Status::error("the tokenizer of --data " + sources[0].dir + " has no end-of-text (or BOS) token to "
                         "end documents: give --doc-separator ID");
  return Status::ok();
}

std::string describe_shares(const TokenLoader& loader, int64_t steps, int G) {
  const std::vector<double> shares = loader.realised_shares(steps, G);
  std::string text;
  for (size_t d = 0; d < shares.size(); d++) {
    char part[64];
    std::snprintf(part, sizeof(part), "%s%s %.4f", d ? ", " : "", loader.source_names()[d].c_str(), shares[d]);
    text += part;
  }
  return text;
}

}  // namespace meshtrain::data
