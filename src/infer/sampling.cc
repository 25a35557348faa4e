#include "infer/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/check.h"

namespace meshtrain::infer {

namespace {

// Token ids ordered by logit, largest first, ties by id: the first `keep` of them sorted.
// The logits are copied beside their ids so that the sort reads contiguous pairs.
std::vector<int> most_likely(const float* logits, int V, int keep) {
  std::vector<std::pair<float, int>> order(V);
  for (int i = 0; i < V; i++) order[i] = {logits[i], i};
  auto before = [](const std::pair<float, int>& a, const std::pair<float, int>& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  if (keep < V) std::nth_element(order.begin(), order.begin() + keep, order.end(), before);
  std::sort(order.begin(), order.begin() + keep, before);
  std::vector<int> ids(keep);
  for (int i = 0; i < keep; i++) ids[i] = order[i].second;
  return ids;
}

double log_sum_exp(const float* logits, int V) {
  const float mx = *std::max_element(logits, logits + V);
  double sum = 0;
  for (int i = 0; i < V; i++) sum += std::exp((double)logits[i] - mx);
  return mx + std::log(sum);
}

}  // namespace

int sample_token(const float* logits, int V, const SampleOptions& o, std::mt19937_64& rng) {
  if (o.temperature <= 0) return (int)(std::max_element(logits, logits + V) - logits);
  const int keep = (o.top_k > 0 && o.top_k < V) ? o.top_k : V;
  // Truncated (top-k, top-p): the likeliest first. Otherwise every token in id order, which
  // draws from the same distribution without sorting the vocabulary.
  std::vector<int> ids;
  if (keep < V || o.top_p < 1.0f) {
    ids = most_likely(logits, V, keep);
  } else {
    ids.resize(V);
    std::iota(ids.begin(), ids.end(), 0);
  }
  const float mx = *std::max_element(logits, logits + V);
  std::vector<double> w(keep);
  double sum = 0;
  for (int i = 0; i < keep; i++) sum += (w[i] = std::exp((logits[ids[i]] - mx) / o.temperature));
  int kept = keep;
  if (o.top_p < 1.0f) {  // the nucleus: the first tokens whose mass reaches top_p of the whole
    double mass = 0;
    for (kept = 0; kept < keep;) {
      mass += w[kept++];
      if (mass >= (double)o.top_p * sum) break;
    }
    sum = mass;
  }
  // 53 random bits -> uniform in [0, 1): the same on every standard library.
  double u = (double)(rng() >> 11) * 0x1.0p-53 * sum;
  for (int i = 0; i < kept; i++) {
    if (u < w[i]) return ids[i];
    u -= w[i];
  }
  return ids[kept - 1];
}

double token_logprob(const float* logits, int V, int token) {
  CHECK(token >= 0 && token < V);
  return (double)logits[token] - log_sum_exp(logits, V);
}

std::vector<TokenLogprob> top_logprobs(const float* logits, int V, int count) {
  count = std::clamp(count, 0, V);
  const double lse = log_sum_exp(logits, V);
  std::vector<TokenLogprob> out;
  for (int id : most_likely(logits, V, count)) out.push_back({id, (double)logits[id] - lse});
  return out;
}

StopStrings::StopStrings(std::vector<std::string> stops) : stops_(std::move(stops)) {
  std::erase_if(stops_, [](const std::string& s) { return s.empty(); });
}

std::string StopStrings::feed(const std::string& piece) {
  if (stopped_) return "";
  held_ += piece;
  // The earliest complete stop string ends the text.
  size_t first = std::string::npos;
  for (const std::string& s : stops_) first = std::min(first, held_.find(s));
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = held_.substr(0, first);
    held_.clear();
    return out;
  }
  // Hold back the longest tail that is the start of some stop string.
  size_t hold = 0;
  for (const std::string& s : stops_)
    for (size_t n = std::min(s.size() - 1, held_.size()); n > hold; n--)
      if (held_.compare(held_.size() - n, n, s, 0, n) == 0) {
        hold = n;
        break;
      }
  std::string out = held_.substr(0, held_.size() - hold);
  held_.erase(0, held_.size() - hold);
  return out;
}

std::string StopStrings::finish() {
  std::string out = stopped_ ? "" : held_;
  held_.clear();
  return out;
}

}  // namespace meshtrain::infer
