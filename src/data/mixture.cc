#include "data/mixture.h"

#include <cmath>
#include <numeric>
#include <set>

namespace meshtrain::data {

namespace {

constexpr double kWeightResolution = 10000;  // weights are kept to 1/10,000 of the total

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  size_t from = 0;
  for (size_t at; (at = s.find(sep, from)) != std::string::npos; from = at + 1) parts.push_back(s.substr(from, at - from));
  parts.push_back(s.substr(from));
  return parts;
}

}  // namespace

Status parse_mixture(const std::string& arg, std::vector<MixtureSpec>* out) {
  out->clear();
  if (arg.empty()) return Status::error("--data is empty: give a data folder, or NAME=DIR:WEIGHT,...");
  if (arg.find('=') == std::string::npos) {
    out->push_back({"data", arg, 1});
    return Status::ok();
  }
  std::set<std::string> names;
  for (const std::string& part : split(arg, ',')) {
    const size_t eq = part.find('='), colon = part.rfind(':');
    if (eq == std::string::npos || eq == 0 || colon == std::string::npos || colon < eq + 2)
      return Status::error("--data: '" + part + "' is not NAME=DIR:WEIGHT (e.g. web=data/web:0.7)");
    MixtureSpec s{part.substr(0, eq), part.substr(eq + 1, colon - eq - 1), 0};
    const std::string w = part.substr(colon + 1);
    char* end = nullptr;
    s.weight = std::strtod(w.c_str(), &end);
    if (w.empty() || end != w.c_str() + w.size() || !std::isfinite(s.weight))
      return Status::error("--data: the weight '" + w + "' of '" + s.name + "' is not a number");
    if (s.weight <= 0)
      return Status::error("--data: the weight of '" + s.name + "' is " + w + "; weights must be positive");
    if (!names.insert(s.name).second) return Status::error("--data: the name '" + s.name + "' is given twice");
    out->push_back(std::move(s));
  }
  return Status::ok();
}

Status MixtureSchedule::make(const std::vector<double>& weights, MixtureSchedule* out) {
  if (weights.empty()) return Status::error("a mixture needs at least one source");
  const double total = std::accumulate(weights.begin(), weights.end(), 0.0);
  MixtureSchedule m;
  uint64_t g = 0;
  for (size_t d = 0; d < weights.size(); d++) {
    const auto u = uint64_t(std::llround(weights[d] / total * kWeightResolution));
    if (u == 0)
      return Status::error("--data: source " + std::to_string(d + 1) + "'s weight is below 1/" +
                           std::to_string(int(kWeightResolution)) + " of the total, the finest share a mixture keeps");
    m.units_.push_back(u);
    g = std::gcd(g, u);
  }
  for (uint64_t& u : m.units_) u /= g;
  m.period_ = std::accumulate(m.units_.begin(), m.units_.end(), uint64_t(0));
  const int n = int(m.units_.size());
  std::vector<uint64_t> taken(size_t(n), 0);
  m.before_.assign(size_t(n), std::vector<uint64_t>(m.period_ + 1, 0));
  for (uint64_t pos = 0; pos < m.period_; pos++) {
    // The source whose next row is due first: time (2i+1)/(2u), compared exactly.
    int best = -1;
    for (int d = 0; d < n; d++) {
      if (taken[size_t(d)] == m.units_[size_t(d)]) continue;
      if (best < 0 || (2 * taken[size_t(d)] + 1) * m.units_[size_t(best)] <
                          (2 * taken[size_t(best)] + 1) * m.units_[size_t(d)])
        best = d;
    }
    m.source_.push_back(best);
    m.index_.push_back(taken[size_t(best)]++);
    for (int d = 0; d < n; d++) m.before_[size_t(d)][pos + 1] = taken[size_t(d)];
  }
  *out = std::move(m);
  return Status::ok();
}

void MixtureSchedule::locate(uint64_t r, int* source, uint64_t* index) const {
  const uint64_t cycle = r / period_, pos = r % period_;
  *source = source_[pos];
  *index = cycle * units_[size_t(*source)] + index_[pos];
}

uint64_t MixtureSchedule::rows_of(uint64_t rows, int source) const {
  return rows / period_ * units_[size_t(source)] + before_[size_t(source)][rows % period_];
}

}  // namespace meshtrain::data
