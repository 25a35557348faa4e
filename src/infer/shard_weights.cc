#include "infer/shard_weights.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "core/check.h"

namespace meshtrain::infer {

ShardWeights::ShardWeights(const model::ParamLayout& layout, std::vector<FlatRange> held)
    : layout_(layout), held_(std::move(held)), at_(held_.size()) {
  size_t total = 0;
  for (size_t i = 0; i < held_.size(); i++) {
    CHECK_MSG(i == 0 || held_[i].begin >= held_[i - 1].begin + held_[i - 1].count, "held ranges sorted, disjoint");
    CHECK_MSG(held_[i].begin + held_[i].count <= layout.total(), "held ranges inside the model");
    at_[i] = total;
    total += held_[i].count;
  }
  values_.allocate(MemCategory::kParams, total);
}

Status ShardWeights::write(size_t at, size_t n, const float* values) {
  if (at + n > layout_.total()) return Status::error("weights past the model's parameters");
  // The held ranges that end after `at`, up to the first starting at or after at + n.
  auto it = std::upper_bound(held_.begin(), held_.end(), at,
                             [](size_t a, const FlatRange& r) { return a < r.begin + r.count; });
  for (; it != held_.end() && it->begin < at + n; ++it) {
    const size_t from = std::max(it->begin, at), to = std::min(it->begin + it->count, at + n);
    std::memcpy(values_.data() + at_[it - held_.begin()] + (from - it->begin), values + (from - at),
                (to - from) * sizeof(float));
  }
  return Status::ok();
}

const float* ShardWeights::acquire_params(int u) { return values_.data(); }

float* ShardWeights::acquire_grads(int u) {
  CHECK_MSG(false, "a decoding rank's weights have no gradients");
  return nullptr;
}

const float* ShardWeights::find(size_t begin, size_t count, const model::ParamTensor& t) const {
  auto it = std::upper_bound(held_.begin(), held_.end(), begin,
                             [](size_t a, const FlatRange& r) { return a < r.begin + r.count; });
  if (it == held_.end() || begin < it->begin || begin + count > it->begin + it->count) {
    char why[256];
    std::snprintf(why, sizeof why, "this decoding rank does not hold elements %zu-%zu of %s (from its start)",
                  begin - t.offset, begin - t.offset + count - 1, t.name.c_str());
    CHECK_MSG(false, why);
  }
  return values_.data() + at_[it - held_.begin()] + (begin - it->begin);
}

const float* ShardWeights::fp32_tensor(const float*, int, const model::ParamTensor& t,
                                       const model::ParamLayout&) const {
  return find(t.offset, t.numel, t);
}

const float* ShardWeights::fp32_rows(const float*, int, const model::ParamTensor& t, int64_t first_row, int64_t rows,
                                     const model::ParamLayout&) const {
  const size_t width = t.numel / t.shape[0];
  return find(t.offset + (size_t)first_row * width, (size_t)rows * width, t);
}

}  // namespace meshtrain::infer
