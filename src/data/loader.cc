#include "data/loader.h"

#include <algorithm>

#include "core/check.h"
#include "data/token_file.h"

namespace meshtrain::data {

Status TokenLoader::open(const std::string& path, TokenLoader* out) {
  out->path_ = path;
  return read_token_file(path, &out->tokens_);
}

TokenLoader TokenLoader::from_tokens(std::vector<Token> tokens) {
  TokenLoader l;
  l.tokens_ = std::move(tokens);
  l.path_ = "<memory>";
  return l;
}

Status TokenLoader::check(int G, int T, int vocab) const {
  if (windows(G, T) < 1)
    return Status::error(path_ + " has " + std::to_string(tokens_.size()) +
                         " tokens, fewer than one global batch needs (" + std::to_string(G) +
                         " rows x " + std::to_string(T) + " tokens + 1)");
  auto max_it = std::max_element(tokens_.begin(), tokens_.end());
  if (max_it != tokens_.end() && *max_it >= (Token)vocab)
    return Status::error(path_ + " contains token id " + std::to_string(*max_it) +
                         ", outside the model's vocabulary of " + std::to_string(vocab));
  return Status::ok();
}

int64_t TokenLoader::windows(int G, int T) const {
  if (tokens_.size() < 1) return 0;
  return (int64_t)(tokens_.size() - 1) / ((int64_t)G * T);
}

int64_t TokenLoader::window_start(int64_t step, int G, int T) const {
  return (step % windows(G, T)) * (int64_t)G * T;
}

void TokenLoader::fill(int64_t step, int G, int T, int row0, int rows, int length, int* inputs,
                       int* targets) const {
  CHECK(row0 >= 0 && row0 + rows <= G);
  CHECK(length >= 1 && length <= T);
  const int64_t start = window_start(step, G, T) + (int64_t)row0 * T;
  for (int64_t r = 0; r < rows; r++)
    for (int64_t i = 0; i < length; i++) {
      inputs[r * length + i] = tokens_[start + r * T + i];
      targets[r * length + i] = tokens_[start + r * T + i + 1];
    }
}

}  // namespace meshtrain::data
