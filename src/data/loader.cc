#include "data/loader.h"

#include <algorithm>
#include <filesystem>

#include "core/check.h"
#include "data/token_file.h"

namespace meshtrain::data {

namespace {

// Rows of T tokens (plus the one target after the last) that fit in n tokens.
uint64_t rows_in(uint64_t n, int T) { return n < 1 ? 0 : (n - 1) / uint64_t(T); }

}  // namespace

Status TokenLoader::open(const std::string& path, TokenLoader* out) {
  TokenStream stream;
  const std::string dir = std::filesystem::path(path).parent_path().string();
  RETURN_IF_ERROR(TokenStream::open(dir.empty() ? "." : dir, {{.file = std::filesystem::path(path).filename().string()}},
                                    &stream));
  *out = from_stream(std::move(stream), path);
  return Status::ok();
}

TokenLoader TokenLoader::from_tokens(std::vector<Token> tokens) {
  return from_stream(TokenStream::from_tokens(std::move(tokens)), "<memory>");
}

TokenLoader TokenLoader::from_stream(TokenStream stream, std::string name) {
  TokenLoader l;
  l.streams_.push_back(std::move(stream));
  l.names_.push_back(name);
  l.path_ = std::move(name);
  CHECK(MixtureSchedule::make({1.0}, &l.schedule_).is_ok());
  return l;
}

Status TokenLoader::mixture(std::vector<TokenStream> streams, std::vector<std::string> names,
                            const std::vector<double>& weights, TokenLoader* out) {
  CHECK(streams.size() == names.size() && names.size() == weights.size());
  TokenLoader l;
  RETURN_IF_ERROR(MixtureSchedule::make(weights, &l.schedule_));
  l.streams_ = std::move(streams);
  l.names_ = std::move(names);
  for (size_t d = 0; d < l.names_.size(); d++) l.path_ += (d ? "," : "") + l.names_[d];
  *out = std::move(l);
  return Status::ok();
}

uint64_t TokenLoader::size() const {
  uint64_t n = 0;
  for (const auto& s : streams_) n += s.size();
  return n;
}

Status TokenLoader::check(int G, int T, int vocab, int part, int parts) const {
  RETURN_IF_ERROR(check_fits(G, T));
  return verify(vocab, part, parts);
}

Status TokenLoader::check_fits(int G, int T) const {
  for (size_t d = 0; d < streams_.size(); d++) {
    const uint64_t need = is_mixture() ? uint64_t(T) + 1 : uint64_t(G) * T + 1;
    if (streams_[d].size() < need)
      return Status::error(names_[d] + " has " + std::to_string(streams_[d].size()) + " tokens, fewer than " +
                           (is_mixture() ? "one row needs (" + std::to_string(T) + " tokens + 1)"
                                         : "one global batch needs (" + std::to_string(G) + " rows x " +
                                               std::to_string(T) + " tokens + 1)"));
  }
  return Status::ok();
}

Status TokenLoader::verify(int vocab, int part, int parts) const {
  for (const TokenStream& s : streams_) RETURN_IF_ERROR(s.verify(part, parts, vocab));
  return Status::ok();
}

int64_t TokenLoader::windows(int G, int T) const {
  if (!is_mixture()) return int64_t(rows_in(streams_[0].size(), T) / uint64_t(G));
  // Whole periods of the interleave before the source that runs out first starts again.
  uint64_t periods = UINT64_MAX;
  for (size_t d = 0; d < streams_.size(); d++)
    periods = std::min(periods, rows_in(streams_[d].size(), T) / schedule_.units()[d]);
  return std::max<int64_t>(1, int64_t(periods * schedule_.period() / uint64_t(G)));
}

int64_t TokenLoader::window_start(int64_t step, int G, int T) const {
  return (step % windows(G, T)) * (int64_t)G * T;
}

void TokenLoader::fill(int64_t step, int G, int T, int row0, int rows, int length, int* inputs,
                       int* targets) const {
  CHECK(row0 >= 0 && row0 + rows <= G);
  CHECK(length >= 1 && length <= T);
  std::vector<Token> row(size_t(length) + 1);
  for (int64_t r = 0; r < rows; r++) {
    uint64_t start;
    int source = 0;
    if (!is_mixture()) {
      start = uint64_t(window_start(step, G, T) + (row0 + r) * T);
    } else {
      uint64_t index;
      schedule_.locate(uint64_t(step) * uint64_t(G) + uint64_t(row0 + r), &source, &index);
      start = index % rows_in(streams_[size_t(source)].size(), T) * uint64_t(T);
    }
    streams_[size_t(source)].read(start, row.size(), row.data());
    for (int64_t i = 0; i < length; i++) {
      inputs[r * length + i] = int(row[size_t(i)]);
      targets[r * length + i] = int(row[size_t(i) + 1]);
    }
  }
}

std::vector<double> TokenLoader::realised_shares(int64_t steps, int G) const {
  const uint64_t rows = uint64_t(steps) * uint64_t(G);
  std::vector<double> shares;
  for (int d = 0; d < schedule_.sources(); d++)
    shares.push_back(rows == 0 ? 0.0 : double(schedule_.rows_of(rows, d)) / double(rows));
  return shares;
}

}  // namespace meshtrain::data
