// Sequence-length warmup (Li et al. 2022, "The Stability-Efficiency Dilemma"; DeepSpeed's
// seqlen curriculum): early steps train on short rows, lengthening to the model's T.
//
// Step k (0-based) trains on rows of length(k) tokens:
//   linear, root:  floor((k/N)^(1/r) * (T - start) + start), r = 1 for linear, rounded
//                  down to a multiple of `step` (never below it), capped at T; T from k = N on;
//   discrete:      the first listed length whose step bound k is below, else T.
// Rows keep their documented positions (data/loader.h): a shortened row is the first
// length(k) tokens of its T-token window, as DeepSpeed truncates the batch; the rest of the
// window is skipped, not repacked. So the data a step reads depends only on k, and a resume
// mid-curriculum is bitwise.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"

namespace meshtrain::train {

struct CurriculumOptions {
  std::string kind = "none";  // none | seqlen
  int start = 64;             // the first steps' row length
  int steps = 0;              // N: steps until rows are T long (linear, root)
  std::string schedule = "linear";  // linear | root | discrete
  int step = 8;               // lengths are multiples of this (DeepSpeed's difficulty_step)
  double root = 2;            // r of the root schedule
  // discrete: "L1:K1,L2:K2,...": length L1 for steps k < K1, L2 for k < K2, ..., then T.
  std::string discrete;
};

class Curriculum {
 public:
  // Checks the options against the model's T (every length in 1..T); an error names the flag.
  static Status make(const CurriculumOptions& o, int T, Curriculum* out);

  bool on() const { return on_; }
  int T() const { return T_; }
  // Tokens per row at step k.
  int length(int64_t k) const;
  // Every distinct length the schedule takes, shortest first (for checks made up front).
  std::vector<int> lengths() const;
  // Tokens of `rows` rows per step over steps [0, k).
  int64_t tokens_before(int64_t k, int64_t rows) const;
  // "seqlen 64 -> 256 over 500 steps (root 2, multiples of 8)", or "none".
  std::string describe() const;

 private:
  bool on_ = false;
  int T_ = 0, start_ = 0, step_ = 1;
  int64_t steps_ = 0;
  double root_ = 1;
  std::vector<std::pair<int, int64_t>> discrete_;  // (length, first step past it)
};

// Parses "L1:K1,L2:K2,..." (lengths and step bounds both increasing).
Status parse_discrete_curriculum(const std::string& text, std::vector<std::pair<int, int64_t>>* out);

}  // namespace meshtrain::train
