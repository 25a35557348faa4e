// The training data walk. For one source: optimizer step k reads the window of G*T+1 tokens
// starting at (k mod E)*G*T, where E = floor((n-1)/(G*T)) windows fit in the stream; so a
// window that would run past the end starts again at 0. Row j of the global batch is
// inputs [p+jT, p+(j+1)T) with targets shifted by one. For a mixture of sources
// (data/mixture.h) each global row goes to one source and reads that source's next row.
// Either way the walk is stateless in k, which makes resume and any split of rows over
// micro-batches or ranks exact. A row cut to L < T tokens (a sequence-length curriculum,
// train/curriculum.h) is the first L tokens of its row, not a repacking; the row's other
// T-L tokens are not trained on that step.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "data/dataset.h"
#include "data/mixture.h"
#include "data/token_file.h"

namespace meshtrain::data {

class TokenLoader {
 public:
  // One token file.
  static Status open(const std::string& path, TokenLoader* out);
  static TokenLoader from_tokens(std::vector<Token> tokens);
  // One dataset split.
  static TokenLoader from_stream(TokenStream stream, std::string name);
  // Several, sampled by weight.
  static Status mixture(std::vector<TokenStream> streams, std::vector<std::string> names,
                        const std::vector<double>& weights, TokenLoader* out);

  // Error when a global batch of G rows of T tokens does not fit (every source of a mixture
  // must hold one row), or (on the shards this rank checks: index % parts == part) a shard
  // is damaged or a token is outside the vocabulary.
  Status check(int G, int T, int vocab, int part = 0, int parts = 1) const;
  // The two halves of check(): the size, and the shards.
  Status check_fits(int G, int T) const;
  Status verify(int vocab, int part = 0, int parts = 1) const;
  // Steps before the walk starts again at the beginning (of its shortest source).
  int64_t windows(int G, int T) const;
  // One source: the first token of step `step`'s window.
  int64_t window_start(int64_t step, int G, int T) const;
  // Rows [row0, row0 + rows) of step `step`'s global batch into inputs/targets[rows, T].
  void fill(int64_t step, int G, int T, int row0, int rows, int* inputs, int* targets) const {
    fill(step, G, T, row0, rows, T, inputs, targets);
  }
  // The same rows cut to their first `length` tokens (a sequence-length curriculum):
  // inputs/targets[rows, length]; the windows, and so every row's position, stay those of T.
  void fill(int64_t step, int G, int T, int row0, int rows, int length, int* inputs, int* targets) const;

  uint64_t size() const;  // tokens over all sources
  bool is_mixture() const { return streams_.size() > 1; }
  const std::vector<std::string>& source_names() const { return names_; }
  // Each source's share of the rows of steps [0, steps): what the mixture really read.
  std::vector<double> realised_shares(int64_t steps, int G) const;
  const std::string& path() const { return path_; }
  const std::vector<TokenStream>& streams() const { return streams_; }

 private:
  std::vector<TokenStream> streams_;
  std::vector<std::string> names_;
  MixtureSchedule schedule_;
  std::string path_;
};

}  // namespace meshtrain::data
