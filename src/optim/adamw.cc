#include "optim/adamw.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"

namespace meshtrain::optim {

float learning_rate(const AdamWConfig& c, int step, int total_steps) {
  if (step < c.warmup_steps) return c.lr * (float)(step + 1) / (float)c.warmup_steps;
  double span = std::max(1, total_steps - c.warmup_steps);
  double progress = (double)(step - c.warmup_steps) / span;
  return (float)(c.min_lr + 0.5 * (c.lr - c.min_lr) * (1.0 + std::cos(M_PI * progress)));
}

float learning_rate_by_tokens(const AdamWConfig& c, double before, double now, double warmup, double total) {
  if (before < warmup) return (float)(c.lr * std::min(1.0, (before + now) / warmup));
  const double span = std::max(now, total - warmup);
  const double progress = std::min(1.0, (before - warmup) / span);
  return (float)(c.min_lr + 0.5 * (c.lr - c.min_lr) * (1.0 + std::cos(M_PI * progress)));
}

double grad_norm(const float* grads, size_t n) { return std::sqrt(sum_of_squares(grads, n)); }

namespace {

// Sum of squares over [0, n) in 64 fixed chunks, each in double, added in chunk order: the
// same result for any thread count (bitwise-exact resume relies on it). Within a chunk,
// element i goes to lane i % 8 and the lanes are added in order: one vector of doubles,
// not a chain of dependent additions. `values(b, e, out)` writes elements [b, e) as
// floats (at most 1024 at a time).
template <typename Values>
double fixed_order_sum_of_squares(size_t n, Values values) {
  constexpr size_t kChunks = 64, kBlock = 1024, kLanes = 8;
  double partial[kChunks] = {};
  const size_t chunk = (n + kChunks - 1) / kChunks;
#pragma omp parallel for schedule(static) if (n >= 64 * kBlock)
  for (size_t c = 0; c < kChunks; c++) {
    double lane[kLanes] = {};
    float block[kBlock];
    const size_t end = std::min(n, (c + 1) * chunk);
    for (size_t b = c * chunk; b < end; b += kBlock) {
      const size_t e = std::min(end, b + kBlock);
      const float* x = values(b, e, block);
      size_t i = 0;
      for (; i + kLanes <= e - b; i += kLanes)
        for (size_t j = 0; j < kLanes; j++) lane[j] += (double)x[i + j] * x[i + j];
      for (size_t j = 0; i < e - b; i++, j++) lane[j] += (double)x[i] * x[i];
    }
    for (double v : lane) partial[c] += v;
  }
  double sum = 0;
  for (double p : partial) sum += p;
  return sum;
}

}  // namespace

double sum_of_squares(const float* grads, size_t n) {
  return fixed_order_sum_of_squares(n, [&](size_t b, size_t, float*) { return grads + b; });
}

double sum_of_squares(kernels::Precision p, const uint16_t* grads, size_t n) {
  return fixed_order_sum_of_squares(n, [&](size_t b, size_t e, float* block) {
    kernels::from_half(p, grads + b, block, e - b);
    return (const float*)block;
  });
}

SumOfSquaresStream::SumOfSquaresStream(size_t n) : n_(n), chunk_((n + kChunks - 1) / kChunks) {}

void SumOfSquaresStream::add(const float* x, size_t count) {
  CHECK(seen_ + count <= n_);
  while (count > 0) {
    // Within fixed_order_sum_of_squares' chunk c, element i goes to lane (i - c * chunk) % 8
    // (its 1024-element blocks start at multiples of 8), lanes fold into partial[c] in order.
    const size_t c = seen_ / chunk_, start = c * chunk_, end = std::min(n_, start + chunk_);
    const size_t m = std::min(count, end - seen_), lane0 = (seen_ - start) % kLanes;
    size_t k = 0;
    for (; k < m && (lane0 + k) % kLanes != 0; k++) lane_[(lane0 + k) % kLanes] += (double)x[k] * x[k];
    for (; k + kLanes <= m; k += kLanes)  // whole vectors from lane 0, as the one-shot sum does
      for (size_t j = 0; j < kLanes; j++) lane_[j] += (double)x[k + j] * x[k + j];
    for (; k < m; k++) lane_[(lane0 + k) % kLanes] += (double)x[k] * x[k];
    x += m, count -= m, seen_ += m;
    if (seen_ == end) {
      for (double& v : lane_) partial_[c] += v, v = 0;
    }
  }
}

double SumOfSquaresStream::total() const {
  CHECK(seen_ == n_);
  double sum = 0;
  for (double p : partial_) sum += p;
  return sum;
}

float clip_coefficient(double norm, float max_norm, double loss_scale) {
  float clip = max_norm > 0 ? (float)(max_norm / (norm / loss_scale + 1e-6)) : 1.0f;
  if (clip >= 1.0f) clip = 1.0f;
  return (float)(clip / loss_scale);
}

float clip_grads(float* grads, size_t n, double norm, float max_norm, double loss_scale) {
  const float coef = clip_coefficient(norm, max_norm, loss_scale);
  if (coef == 1.0f) return 1.0f;
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; i++) grads[i] *= coef;
  return coef;
}

std::vector<AdamSegment> full_segments(const model::ParamLayout& layout) {
  std::vector<AdamSegment> out;
  for (const auto& t : layout.tensors())
    out.push_back({t.offset, t.offset, t.offset, t.numel, t.decay,
                   t.tp_copy, layout.unit_of(t)});
  return out;
}

AdamW::AdamW(const AdamWConfig& config, const model::ParamLayout& layout, bool master_weights)
    : AdamW(config, full_segments(layout), layout.total(), master_weights) {}

AdamW::AdamW(const AdamWConfig& config, std::vector<AdamSegment> segments, size_t state_size,
             bool master_weights, const StateFiles* files)
    : config_(config), segments_(std::move(segments)), size_(state_size), master_(master_weights),
      store_(state_size) {
  if (files) store_.set_chunk(files->chunk);
  for (int k = 0; k < state_kinds(); k++) {
    if (!files || k == kMasterWeights) {
      store_.add((ShardArray)k, MemCategory::kOptim);
      continue;
    }
    const Status st = store_.add_file((ShardArray)k, files->dir, files->rank, files->direct);
    CHECK_MSG(st.is_ok(), st.message().c_str());
  }
}

unsigned AdamW::state_mask() const {
  return bit(kMomentM) | bit(kMomentV) | (master_ ? bit(kMasterWeights) : 0u);
}

// The update op's scalars, `decay` the factor of the tensors that take weight decay.
struct AdamW::Coefficients : kernels::AdamWScalars {
  // The scalars for a segment: its tensors decay or keep their parameters (decay 1).
  kernels::AdamWScalars for_segment(bool decays) const {
    kernels::AdamWScalars s = *this;
    if (!decays) s.decay = 1.0f;
    return s;
  }
};

AdamW::Coefficients AdamW::coefficients(float lr, int t) const {
  const float b1 = config_.beta1, b2 = config_.beta2;
  // Same operation order as torch's single-tensor AdamW.
  const float bias1 = 1.0f - std::pow(b1, (float)t);
  const float bias2 = 1.0f - std::pow(b2, (float)t);
  return {{b1, b2, config_.eps, lr / bias1, std::sqrt(bias2), 1.0f - lr * config_.weight_decay}};
}

namespace {

// Work on [0, n) in blocks over the threads (the 16-bit updates widen a block at a time).
constexpr size_t kBlock = 2048;
template <typename Body>
void over_blocks(size_t n, Body body) {
#pragma omp parallel for schedule(static)
  for (size_t b = 0; b < n; b += kBlock) body(b, std::min(n, b + kBlock));
}

}  // namespace

template <typename Update>
void AdamW::for_each_run(unsigned mask, unsigned write_mask, Update update,
                         const ShardStore::ChunkUpdate& after_chunk) {
  if (!store_.any_in_file(mask)) {
    ChunkPointers whole;
    for (int a = 0; a < kShardArrays; a++)
      if (mask & (1u << a)) whole.p[a] = store_.data((ShardArray)a);
    for (const AdamSegment& s : segments_) update(s, 0, s.count, store_.advanced(whole, s.state_offset));
    if (after_chunk) after_chunk(0, store_.size(), whole);
    return;
  }
  // Chunk by chunk of the store: the segments' parts that fall into it.
  store_.for_each_chunk(mask, write_mask, [&](size_t begin, size_t end, const ChunkPointers& chunk) {
    for (const AdamSegment& s : segments_) {
      const size_t a = std::max(begin, s.state_offset), b = std::min(end, s.state_offset + s.count);
      if (a >= b) continue;
      update(s, a - s.state_offset, b - s.state_offset, store_.advanced(chunk, a - begin));
    }
    if (after_chunk) after_chunk(begin, end, chunk);
  });
}

void AdamW::step(float* params, const float* grads, float lr, int t) {
  const Coefficients c = coefficients(lr, t);
  for_each_run(state_mask(), state_mask(), [&](const AdamSegment& s, size_t from, size_t to, const ChunkPointers& st) {
    kernels::adamw_update(params + s.param_offset + from, grads + s.grad_offset + from, st.f(kMomentM),
                          st.f(kMomentV), to - from, c.for_segment(s.decay));
  });
}

void AdamW::step_preconditioned(float* params, float lr, int t) {
  CHECK_MSG(!store_.any_in_file(state_mask()), "1-bit Adam's update needs the moments in memory");
  const Coefficients c = coefficients(lr, t);
  for (const AdamSegment& s : segments_) {
    const float decay = s.decay ? c.decay : 1.0f;
    kernels::adamw_preconditioned_update(params + s.param_offset, store_.data(kMomentM) + s.state_offset,
                                         s.count, decay, c.step_size);
  }
}

void AdamW::init_master(const float* params) {
  CHECK_MSG(master_ && !store_.in_file(kMasterWeights), "init_master: no in-memory master weights");
  for (const AdamSegment& s : segments_)
    std::copy(params + s.param_offset, params + s.param_offset + s.count,
              store_.data(kMasterWeights) + s.state_offset);
}

// One block of step_mixed's update: the 16-bit gradients widened and scaled, the master
// weights updated, the 16-bit parameters rounded from them.
void AdamW::mixed_block(kernels::Precision p, const Coefficients& c, float decay, float grad_coef,
                        const uint16_t* g16, uint16_t* p16, float* w, float* m, float* v, size_t n) {
  float g[kBlock];
  kernels::from_half(p, g16, g, n);
  if (grad_coef != 1.0f) {
#pragma omp simd
    for (size_t i = 0; i < n; i++) g[i] *= grad_coef;
  }
  kernels::AdamWScalars s = c;
  s.decay = decay;
  kernels::adamw_update(w, g, m, v, n, s);
  kernels::to_half(p, w, p16, n);
}

void AdamW::step_shard(kernels::Precision storage, float grad_coef, float lr, int t, const ChunkHook& updated) {
  const bool mixed = storage != kernels::Precision::kFp32;
  CHECK(store_.has(kShardParams) && store_.has(kShardGrads) && master_ == mixed);
  CHECK(store_.width(kShardParams) == (mixed ? kWord : kFloat) && store_.width(kShardGrads) == store_.width(kShardParams));
  const Coefficients c = coefficients(lr, t);
  const unsigned mask = state_mask() | bit(kShardParams) | bit(kShardGrads);
  for_each_run(mask, mask & ~bit(kShardGrads), [&](const AdamSegment& s, size_t from, size_t to, const ChunkPointers& a) {
    CHECK(s.param_offset == s.state_offset && s.grad_offset == s.state_offset);
    const float decay = s.decay ? c.decay : 1.0f;
    if (mixed) {
      over_blocks(to - from, [&](size_t b, size_t e) {
        mixed_block(storage, c, decay, grad_coef, a.h(kShardGrads) + b, a.h(kShardParams) + b,
                    a.f(kMasterWeights) + b, a.f(kMomentM) + b, a.f(kMomentV) + b, e - b);
      });
      return;
    }
    float* g = a.f(kShardGrads);
    if (grad_coef != 1.0f) {  // clip_grads' multiplication, on the way to the update
#pragma omp parallel for simd schedule(static)
      for (size_t i = 0; i < to - from; i++) g[i] *= grad_coef;
    }
    kernels::adamw_update(a.f(kShardParams), g, a.f(kMomentM), a.f(kMomentV), to - from, c.for_segment(s.decay));
  }, updated ? [&](size_t begin, size_t end, const ChunkPointers& a) { updated(begin, end, a.p[kShardParams]); }
             : ShardStore::ChunkUpdate{});
}

void AdamW::step_mixed(kernels::Precision p, uint16_t* params, const uint16_t* grads,
                       float grad_coef, float lr, int t) {
  CHECK(master_);
  const Coefficients c = coefficients(lr, t);
  for_each_run(state_mask(), state_mask(), [&](const AdamSegment& s, size_t from, size_t to, const ChunkPointers& st) {
    const float decay = s.decay ? c.decay : 1.0f;
    const uint16_t* g16 = grads + s.grad_offset + from;
    uint16_t* p16 = params + s.param_offset + from;
    over_blocks(to - from, [&](size_t b, size_t e) {
      mixed_block(p, c, decay, grad_coef, g16 + b, p16 + b, st.f(kMasterWeights) + b, st.f(kMomentM) + b,
                  st.f(kMomentV) + b, e - b);
    });
  });
}

void AdamW::params_from_master(kernels::Precision p, uint16_t* params) {
  CHECK(master_);
  if (!params) {  // the store's shard, streamed where it is in a file
    CHECK(store_.has(kShardParams) && store_.width(kShardParams) == kWord);
    for_each_run(bit(kMasterWeights) | bit(kShardParams), bit(kShardParams),
                 [&](const AdamSegment&, size_t from, size_t to, const ChunkPointers& st) {
                   kernels::to_half(p, st.f(kMasterWeights), st.h(kShardParams), to - from);
                 });
    return;
  }
  for_each_run(bit(kMasterWeights), 0, [&](const AdamSegment& s, size_t from, size_t to, const ChunkPointers& st) {
    kernels::to_half(p, st.f(kMasterWeights), params + s.param_offset + from, to - from);
  });
}

Status AdamW::offload(const std::string& dir, int rank, size_t chunk, bool direct) {
  store_.set_chunk(chunk);
  for (int k = 0; k < state_kinds(); k++)
    if (!store_.in_file((ShardArray)k)) RETURN_IF_ERROR(store_.move_to_file((ShardArray)k, dir, rank, direct));
  return Status::ok();
}

void AdamW::read_state(StateKind k, float* dst) {
  CHECK(k < state_kinds());
  store_.read(k, dst);
}

void AdamW::read_state(StateKind k, size_t begin, size_t count, float* dst) {
  CHECK(k < state_kinds());
  store_.read(k, begin, count, dst);
}

void AdamW::write_state(StateKind k, size_t begin, size_t count, const float* src) {
  CHECK(k < state_kinds());
  store_.write(k, begin, count, src);
}

void AdamW::write_state(StateKind k, const float* src) {
  CHECK(k < state_kinds());
  store_.write(k, src);
}

}  // namespace meshtrain::optim
