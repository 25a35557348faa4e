// A mixture of datasets sampled by weight: `train --data web=DIR:0.7,books=DIR:0.3`.
//
// Rows, not tokens, are what is mixed. Global row r (row j of step k is r = k*G + j) goes to
// one source by a fixed interleave of period U = the sum of the weights as integers
// (weights are normalised and rounded to 1/10,000, then divided by their gcd): source d
// gets exactly u_d of every U consecutive rows, spread evenly (Sainte-Laguë order: its
// i-th row of a period at time (2i+1)/(2u_d)). Within its source a row is the source's next
// row: the i-th row ever given to source d reads that source's tokens [(i mod E_d)*T, +T+1),
// E_d = floor((n_d-1)/T). So every source is read in order, none skips data, and the whole
// walk is a function of the row number alone: resume is exact at any layout, and the
// realised share of each source after any number of rows is known without counting.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace meshtrain::data {

struct MixtureSpec {
  std::string name, dir;
  double weight = 1;
};

// Parses "NAME=DIR:WEIGHT,..." (DIR may hold ':'; the weight is after the last one). A
// plain DIR (no '=') is one source named "data" of weight 1. Errors quote the argument.
Status parse_mixture(const std::string& arg, std::vector<MixtureSpec>* out);

class MixtureSchedule {
 public:
  static Status make(const std::vector<double>& weights, MixtureSchedule* out);
  // The source of global row r and its index among that source's rows.
  void locate(uint64_t r, int* source, uint64_t* index) const;
  // How many of rows [0, rows) went to `source`.
  uint64_t rows_of(uint64_t rows, int source) const;
  int sources() const { return int(units_.size()); }
  uint64_t period() const { return period_; }
  const std::vector<uint64_t>& units() const { return units_; }

 private:
  std::vector<uint64_t> units_;          // u_d
  uint64_t period_ = 1;                  // U
  std::vector<int> source_;              // per position of a period
  std::vector<uint64_t> index_;          // the row's index among its source's rows in the period
  std::vector<std::vector<uint64_t>> before_;  // before_[d][pos]: rows of d at positions < pos
};

}  // namespace meshtrain::data
