// The training data walk: optimizer step k reads the window of G*T+1 tokens starting at
// (k mod E)*G*T, where E = floor((n-1)/(G*T)) windows fit in the file; so a window that
// would run past the end starts again at 0. Row j of the global batch is
// inputs [p+jT, p+(j+1)T) with targets shifted by one. Stateless in k, which makes resume
// and any split of rows over micro-batches or ranks exact. A row cut to L < T tokens (a
// sequence-length curriculum, train/curriculum.h) is [p+jT, p+jT+L): the first L tokens of
// its window, not a repacking; the window's other T-L tokens are not trained on that step.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "data/token_file.h"

namespace meshtrain::data {

class TokenLoader {
 public:
  static Status open(const std::string& path, TokenLoader* out);
  static TokenLoader from_tokens(std::vector<Token> tokens);

  // Error when a global batch of G rows of T tokens does not fit in the file, or a token
  // is outside the vocabulary.
  Status check(int G, int T, int vocab) const;
  int64_t windows(int G, int T) const;
  int64_t window_start(int64_t step, int G, int T) const;
  // Rows [row0, row0 + rows) of step `step`'s global batch into inputs/targets[rows, T].
  void fill(int64_t step, int G, int T, int row0, int rows, int* inputs, int* targets) const {
    fill(step, G, T, row0, rows, T, inputs, targets);
  }
  // The same rows cut to their first `length` tokens (a sequence-length curriculum):
  // inputs/targets[rows, length]; the windows, and so every row's position, stay those of T.
  void fill(int64_t step, int G, int T, int row0, int rows, int length, int* inputs, int* targets) const;
  size_t size() const { return tokens_.size(); }
  const std::string& path() const { return path_; }

 private:
  std::vector<Token> tokens_;
  std::string path_;
};

}  // namespace meshtrain::data
