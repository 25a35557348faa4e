#include "infer/decoder.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/check.h"
#include "kernels/ops.h"

namespace meshtrain::infer {

namespace k = meshtrain::kernels;
using model::LayerTensor;

// A unit's parameters from the model's store (its own buffer, or streamed weights) while in
// scope: acquired on construction, released on destruction.
class BatchDecoder::HeldUnit {
 public:
  HeldUnit(const model::Gpt& gpt, int unit)
      : store_(gpt.param_store()), layout_(gpt.layout()), unit_(unit), base_(store_->acquire_params(unit)) {}
  ~HeldUnit() { store_->release_params(unit_); }
  HeldUnit(const HeldUnit&) = delete;
  HeldUnit& operator=(const HeldUnit&) = delete;
  const float* operator[](const model::ParamTensor& t) const { return store_->fp32_tensor(base_, unit_, t, layout_); }
  // Tensor t from row `first` of its dim 0 on (all the store may hold of it: a tp share).
  const float* rows(const model::ParamTensor& t, int64_t first, int64_t count) const {
    return store_->fp32_rows(base_, unit_, t, first, count, layout_);
  }

 private:
  model::ParamStore* store_;
  const model::ParamLayout& layout_;
  int unit_;
  const float* base_;
};

BatchDecoder::BatchDecoder(const model::Gpt& gpt, DecodeGroups groups) : gpt_(gpt), groups_(groups) {
  const auto& c = gpt.config();
  tp_ = groups.tp_size(), tp_rank_ = groups.tp_rank();
  CHECK_MSG(c.kv_head_count() % tp_ == 0, "tensor-parallel decoding needs tp to divide the KV heads");
  kv_heads_ = c.kv_head_count() / tp_;
  CHECK_MSG(c.layers >= groups.stages(), "pipeline-parallel decoding needs a layer per stage");
  first_layer_ = c.layers * groups.stage() / groups.stages();
  last_layer_ = c.layers * (groups.stage() + 1) / groups.stages();
}

RowRange tp_share(int64_t rows, int tp, int rank) {
  const int64_t share = (rows + tp - 1) / tp, first = std::min(rows, rank * share);
  return {first, std::min(rows, first + share) - first};
}

namespace {

// A block's linear layers as the decoder multiplies by them: weight [out, in] (Llama's q, k
// and v, and its gate and up, fused: tensors back to back from `weight` on) and bias. Their
// output rows are what the tp ranks share (BatchDecoder::linear).
struct Linear {
  LayerTensor weight, bias;
  int64_t out, in;
};
enum { kQkvLinear, kAttProjLinear, kFcLinear, kFcProjLinear };  // block_linears' order
std::vector<Linear> block_linears(const model::GptConfig& c) {
  return {{model::kQkvW, model::kQkvB, c.qkv_dim(), c.dim},
          {model::kAttProjW, model::kAttProjB, c.dim, c.dim},
          {model::kFcW, model::kFcB, c.fc_dim(), c.dim},
          {model::kFcProjW, model::kFcProjB, c.dim, c.ffn()}};
}

// Sorted, with touching or overlapping ranges merged.
std::vector<FlatRange> merged(std::vector<FlatRange> ranges) {
  std::sort(ranges.begin(), ranges.end(), [](const FlatRange& a, const FlatRange& b) { return a.begin < b.begin; });
  std::vector<FlatRange> out;
  for (const FlatRange& r : ranges) {
    if (r.count == 0) continue;
    if (!out.empty() && r.begin <= out.back().begin + out.back().count)
      out.back().count = std::max(out.back().begin + out.back().count, r.begin + r.count) - out.back().begin;
    else
      out.push_back(r);
  }
  return out;
}

}  // namespace

std::vector<FlatRange> weights_read(const model::Gpt& gpt, const DecodeGroups& at) {
  const auto& c = gpt.config();
  const auto& layout = gpt.layout();
  std::vector<FlatRange> read, split;
  // Rows [share) of an operand of `out` rows of `width` starting at tensor t.
  auto share = [&](const model::ParamTensor& t, int64_t out, int64_t width) {
    const RowRange mine = tp_share(out, at.tp_size(), at.tp_rank());
    read.push_back({t.offset + (size_t)(mine.first * width), (size_t)(mine.count * width)});
    split.push_back({t.offset, (size_t)(out * width)});
  };
  const int first = c.layers * at.stage() / at.stages(), last = c.layers * (at.stage() + 1) / at.stages();
  for (int l = first; l < last; l++)
    for (const Linear& linear : block_linears(c)) {
      if (!layout.has(l, linear.weight)) continue;  // an MoE layer's MLP
      share(layout.layer(l, linear.weight), linear.out, linear.in);
      if (layout.has(l, linear.bias)) share(layout.layer(l, linear.bias), linear.out, 1);
    }
  if (at.stage() == 0) {  // the lookup: each rank its vocabulary share, summed (embed)
    share(layout.wte(), c.vocab, c.dim);
    if (layout.has_wpe()) read.push_back({layout.wpe().offset, layout.wpe().numel});
  }
  if (at.stage() + 1 == at.stages()) {
    read.push_back({layout.lnf_w().offset, layout.lnf_w().numel});
    if (layout.has_lnf_b()) read.push_back({layout.lnf_b().offset, layout.lnf_b().numel});
    share(layout.has_untied_head() ? layout.head() : layout.wte(), c.vocab, c.dim);
  }
  // The rest of the stage's layers (norms, routers, experts) whole.
  const std::vector<FlatRange> shared = merged(split);
  for (const model::ParamTensor& t : layout.tensors()) {
    if (t.layer < first || t.layer >= last) continue;
    const bool in_split = std::any_of(shared.begin(), shared.end(), [&](const FlatRange& r) {
      return t.offset >= r.begin && t.offset + t.numel <= r.begin + r.count;
    });
    if (!in_split) read.push_back({t.offset, t.numel});
  }
  return merged(read);
}

int BatchDecoder::add() {
  const auto& c = gpt_.config();
  auto s = std::make_unique<Sequence>();
  s->k_cache.allocate(MemCategory::kActivations,
                      (size_t)(last_layer_ - first_layer_) * c.max_seq_len * kv_heads_ * c.head_dim());
  s->v_cache.allocate(MemCategory::kActivations, s->k_cache.size());
  s->logits.allocate(MemCategory::kActivations, c.vocab);
  sequences_.push_back(std::move(s));
  return (int)sequences_.size() - 1;
}

void BatchDecoder::remove(int id) {
  CHECK(id >= 0 && id < (int)sequences_.size() && sequences_[id]);
  sequences_[id].reset();
}

BatchDecoder::Sequence& BatchDecoder::seq(int id) const {
  CHECK_MSG(id >= 0 && id < (int)sequences_.size() && sequences_[id], "no such sequence");
  return *sequences_[id];
}

void BatchDecoder::embed(const std::vector<Segment>& segments, float* x) const {
  const int C = gpt_.config().dim;
  const auto& layout = gpt_.layout();
  const HeldUnit embeddings(gpt_, layout.embedding_unit());
  const float* wpe = layout.has_wpe() ? embeddings[layout.wpe()] : nullptr;
  // With tp, each rank looks up the tokens in its share of the vocabulary, zeros elsewhere,
  // and a sum over the ranks gives every row: exactly, since each element adds one value to
  // zeros. Then the positions, as on one rank.
  const RowRange mine = tp_share(gpt_.config().vocab, tp_, tp_rank_);
  int rows = 0;
  for (const Segment& s : segments) {
    for (int i = 0; i < s.n; i++, rows++) {
      float* row = x + (size_t)(s.row + i) * C;
      const int token = s.tokens[i];
      if (token >= mine.first && token < mine.first + mine.count)
        std::memcpy(row, embeddings.rows(layout.wte(), token, 1), C * sizeof(float));
      else
        std::fill(row, row + C, 0.0f);
    }
  }
  if (tp_ > 1) groups_.tp->all_reduce(x, (size_t)rows * C);
  if (!wpe) return;
  for (const Segment& s : segments)
    for (int i = 0; i < s.n; i++) {
      float* row = x + (size_t)(s.row + i) * C;
      const float* at = wpe + (size_t)(s.seq->pos + i) * C;
      for (int c = 0; c < C; c++) row[c] += at[c];
    }
}

void BatchDecoder::norm(float* out, const float* x, const float* w, const float* b, int n) const {
  const auto& cfg = gpt_.config();
  std::vector<float> mean(n), rstd(n);
  if (cfg.norm == model::Norm::kRmsNorm) k::rmsnorm_forward(out, rstd.data(), x, w, n, cfg.dim, cfg.norm_eps);
  else k::layernorm_forward(out, mean.data(), rstd.data(), x, w, b, n, cfg.dim);
}

void BatchDecoder::gather_columns(float* out, const float* mine, int n, int share, int cols) {
  std::vector<float> all((size_t)tp_ * n * share);
  groups_.tp->all_gather(mine, all.data(), (size_t)n * share);
  for (int r = 0; r < tp_; r++) {
    const int c0 = r * share, width = std::min(share, cols - c0);
    for (int i = 0; i < n && width > 0; i++)
      std::memcpy(out + (size_t)i * cols + c0, all.data() + ((size_t)r * n + i) * share, width * sizeof(float));
  }
}

void BatchDecoder::linear(float* out, const float* in, const HeldUnit& unit, const model::ParamTensor& W,
                          const model::ParamTensor* b, int n, int K, int OC) {
  // (Rows, not the whole tensor: a vocabulary's padding rows are never read, nor held.)
  if (tp_ == 1) return k::matmul_forward_rowwise(out, in, unit.rows(W, 0, OC), b ? unit.rows(*b, 0, OC) : nullptr, n, K, OC);
  const RowRange range = tp_share(OC, tp_, tp_rank_);
  const int share = (OC + tp_ - 1) / tp_, lo = (int)range.first, rows = (int)range.count;
  std::vector<float> mine((size_t)n * share, 0.0f);
  // Each element of the share is computed exactly as one rank computes it (the kernel's
  // order does not depend on the rows beside it), into rows of `share` columns.
  std::vector<float> part((size_t)n * std::max(rows, 1));
  if (rows > 0) {
    k::matmul_forward_rowwise(part.data(), in, unit.rows(W, lo, rows), b ? unit.rows(*b, lo, rows) : nullptr, n, K, rows);
    for (int i = 0; i < n; i++)
      std::memcpy(mine.data() + (size_t)i * share, part.data() + (size_t)i * rows, rows * sizeof(float));
  }
  gather_columns(out, mine.data(), n, share, OC);
}

// One transformer block on the step's rows, each segment at its sequence's positions,
// appending its keys and values (this rank's KV heads) to its sequence's cache.
void BatchDecoder::block(int l, float* x, const std::vector<Segment>& segments, int n) {
  const auto& cfg = gpt_.config();
  const int C = cfg.dim, NH = cfg.heads, NKV = cfg.kv_head_count(), Q = cfg.qkv_dim();
  const int F = cfg.ffn(), Fc = cfg.fc_dim(), hs = cfg.head_dim();
  // This rank's heads: KV heads [kv0, kv0 + kv_heads_) and the query heads that use them.
  const int kv0 = tp_rank_ * kv_heads_, KVl = kv_heads_ * hs, NHl = NH / tp_, Cl = NHl * hs;
  const auto& layout = gpt_.layout();
  const HeldUnit weights(gpt_, layout.block_unit(l));
  auto W = [&](LayerTensor t) { return layout.has(l, t) ? weights[layout.layer(l, t)] : nullptr; };
  const std::vector<Linear> linears = block_linears(cfg);
  auto apply = [&](int which, float* out, const float* in) {
    const Linear& f = linears[which];
    const model::ParamTensor* bias = layout.has(l, f.bias) ? &layout.layer(l, f.bias) : nullptr;
    linear(out, in, weights, layout.layer(l, f.weight), bias, n, (int)f.in, (int)f.out);
  };
  std::vector<float> ln((size_t)n * C), qkv((size_t)n * Q), att((size_t)n * C), proj((size_t)n * C),
      h((size_t)n * Fc), hg((size_t)n * F), att_mine(tp_ > 1 ? (size_t)n * Cl : 0);

  norm(ln.data(), x, W(model::kLn1W), W(model::kLn1B), n);
  apply(kQkvLinear, qkv.data(), ln.data());
  float* att_out = tp_ > 1 ? att_mine.data() : att.data();
  for (const Segment& s : segments) {
    float* q = qkv.data() + (size_t)s.row * Q;
    const int pos = s.seq->pos;
    if (cfg.positions == model::Positions::kRope) {  // rows at positions pos .. pos + n - 1
      k::rope_rotate(q, s.n, s.n, Q, NH, hs, gpt_.rope_cos(), gpt_.rope_sin(), pos, false);
      k::rope_rotate(q + C, s.n, s.n, Q, NKV, hs, gpt_.rope_cos(), gpt_.rope_sin(), pos, false);
    }
    const size_t layer = (size_t)(l - first_layer_) * cfg.max_seq_len * KVl;
    float* kc = s.seq->k_cache.data() + layer;
    float* vc = s.seq->v_cache.data() + layer;
    for (int i = 0; i < s.n; i++) {
      const float* row = q + (size_t)i * Q;
      std::memcpy(kc + (size_t)(pos + i) * KVl, row + C + (size_t)kv0 * hs, KVl * sizeof(float));
      std::memcpy(vc + (size_t)(pos + i) * KVl, row + C + (size_t)NKV * hs + (size_t)kv0 * hs, KVl * sizeof(float));
    }
    k::attention_cached_forward(att_out + (size_t)s.row * Cl, q + (size_t)kv0 * (NH / NKV) * hs, Q, kc, vc, pos, s.n,
                                Cl, NHl, kv_heads_);
  }
  if (tp_ > 1) gather_columns(att.data(), att_mine.data(), n, Cl, C);
  apply(kAttProjLinear, proj.data(), att.data());
  k::residual_forward(x, x, proj.data(), (size_t)n * C);
  norm(ln.data(), x, W(model::kLn2W), W(model::kLn2B), n);
  if (cfg.is_moe_layer(l)) {
    moe_mlp(l, weights, ln.data(), n, proj.data());
    k::residual_forward(x, x, proj.data(), (size_t)n * C);
    return;
  }
  apply(kFcLinear, h.data(), ln.data());
  if (cfg.mlp == model::Mlp::kSwiGlu) k::swiglu_forward(hg.data(), h.data(), n, F);
  else k::gelu_forward(hg.data(), h.data(), (size_t)n * F);
  apply(kFcProjLinear, proj.data(), hg.data());
  k::residual_forward(x, x, proj.data(), (size_t)n * C);
}

// An MoE layer's MLP on n rows, as training routes them without capacity (inference drops
// nothing): each row's chosen experts, weighted, plus the shared experts.
void BatchDecoder::moe_mlp(int l, const HeldUnit& block, const float* ln, int n, float* out) const {
  const auto& cfg = gpt_.config();
  const auto& layout = gpt_.layout();
  const int C = cfg.dim, E = cfg.moe.experts, k = cfg.moe.top_k, Fe = cfg.expert_ffn(), Fce = cfg.expert_fc_dim();
  std::vector<float> logits((size_t)n * E), weight((size_t)n * k);
  std::vector<int> expert((size_t)n * k), slot((size_t)n * k), order((size_t)n * k), offsets(E + 1);
  k::matmul_forward_rowwise(logits.data(), ln, block[layout.layer(l, model::kRouterW)], nullptr, n, C, E);
  model::MoeRoute route{expert.data(), weight.data(), slot.data(), order.data(), offsets.data()};
  model::MoeRouteStats unused;
  model::moe_route(cfg.moe, model::MoeTraining{0, 0, 0}, logits.data(), n, n, &route, &unused);
  auto mlp = [&](const float* fc, const float* proj, const float* in, int rows, int Fc, int F, float* y) {
    std::vector<float> h((size_t)rows * Fc), hg((size_t)rows * F);
    k::matmul_forward_rowwise(h.data(), in, fc, nullptr, rows, C, Fc);
    if (cfg.mlp == model::Mlp::kSwiGlu) k::swiglu_forward(hg.data(), h.data(), rows, F);
    else k::gelu_forward(hg.data(), h.data(), (size_t)rows * F);
    k::matmul_forward_rowwise(y, hg.data(), proj, nullptr, rows, F, C);
  };
  std::fill(out, out + (size_t)n * C, 0.0f);
  if (layout.has(l, model::kSharedFcW)) {
    const int S = cfg.moe.shared_experts;
    mlp(block[layout.layer(l, model::kSharedFcW)], block[layout.layer(l, model::kSharedProjW)], ln, n, S * Fce, S * Fe,
        out);
  }
  std::vector<float> y(C);
  for (int i = 0; i < n * k; i++) {
    const int e = expert[i];
    const HeldUnit weights(gpt_, layout.expert_unit(l, e));
    mlp(weights[layout.expert_fc(l, e)], weights[layout.expert_proj(l, e)], ln + (size_t)(i / k) * C, 1, Fce, Fe,
        y.data());
    for (int c = 0; c < C; c++) out[(size_t)(i / k) * C + c] += weight[i] * y[c];
  }
}

// The last stage's head: each sequence's last row, normed, through the head at once.
void BatchDecoder::head(const std::vector<Segment>& segments, const float* x) {
  const auto& cfg = gpt_.config();
  const int C = cfg.dim, S = (int)segments.size();
  std::vector<float> last((size_t)S * C), ln((size_t)S * C), logits((size_t)S * cfg.vocab);
  for (int i = 0; i < S; i++)
    std::memcpy(last.data() + (size_t)i * C, x + (size_t)(segments[i].row + segments[i].n - 1) * C, C * sizeof(float));
  const auto& layout = gpt_.layout();
  const HeldUnit final_norm(gpt_, layout.final_unit());
  norm(ln.data(), last.data(), final_norm[layout.lnf_w()], layout.has_lnf_b() ? final_norm[layout.lnf_b()] : nullptr, S);
  if (layout.has_untied_head()) {
    linear(logits.data(), ln.data(), final_norm, layout.head(), nullptr, S, C, cfg.vocab);
  } else {  // tied: the embedding's rows
    const HeldUnit embeddings(gpt_, layout.embedding_unit());
    linear(logits.data(), ln.data(), embeddings, layout.wte(), nullptr, S, C, cfg.vocab);
  }
  for (int i = 0; i < S; i++)
    std::memcpy(segments[i].seq->logits.data(), logits.data() + (size_t)i * cfg.vocab, cfg.vocab * sizeof(float));
}

void BatchDecoder::run_stage(const std::vector<Segment>& segments, int rows) {
  comm::Group* pp = groups_.pp;
  const int stage = pp ? pp->rank() : 0, stages = pp ? pp->size() : 1;
  std::vector<float> x((size_t)rows * gpt_.config().dim);
  if (stage == 0) embed(segments, x.data());
  else pp->irecv(x.data(), x.size(), stage - 1, 0)->wait();
  for (int l = first_layer_; l < last_layer_; l++) block(l, x.data(), segments, rows);
  if (stage + 1 < stages) pp->isend(x.data(), x.size(), stage + 1, 0)->wait();
  else head(segments, x.data());
}

void BatchDecoder::step(std::span<const Rows> batch) {
  const auto& cfg = gpt_.config();
  std::vector<Segment> segments;
  int rows = 0;
  for (const Rows& r : batch) {
    Sequence* s = &seq(r.id);
    const int n = (int)r.tokens.size();
    CHECK(n > 0 && s->pos + n <= cfg.max_seq_len);
    for (const Segment& other : segments) CHECK_MSG(other.seq != s, "a sequence twice in one step");
    segments.push_back({s, rows, n, r.tokens});
    rows += n;
  }
  if (rows == 0) return;
  comm::Group* pp = groups_.pp;
  const int stages = pp ? pp->size() : 1;
  // With pipeline stages, the sequences may go through in micro-batches (whole sequences,
  // about equal rows): each stage takes them in order, so the second runs on stage 0 while
  // the first runs on stage 1, as a pipeline fills. A row's result does not depend on which
  // micro-batch it is in.
  const int groups = std::clamp(stages > 1 ? groups_.micro_batches : 1, 1, (int)segments.size());
  for (int g = 0, first = 0; g < groups; g++) {
    int last = first, group_rows = 0;  // segments [first, last): the g-th share of the rows
    const int64_t until = (int64_t)rows * (g + 1) / groups;
    while (last < (int)segments.size() && (last == first || g + 1 == groups || segments[last].row < until) &&
           (int)segments.size() - last > groups - g - 1)
      group_rows += segments[last++].n;
    std::vector<Segment> group(segments.begin() + first, segments.begin() + last);
    for (Segment& s : group) s.row -= segments[first].row;
    run_stage(group, group_rows);
    first = last;
  }
  if (stages > 1) {  // every stage samples: the last one's logits to all, in one message
    std::vector<float> logits(segments.size() * (size_t)cfg.vocab);
    for (size_t i = 0; i < segments.size(); i++)
      std::memcpy(logits.data() + i * cfg.vocab, segments[i].seq->logits.data(), cfg.vocab * sizeof(float));
    pp->broadcast(logits.data(), logits.size(), stages - 1);
    for (size_t i = 0; i < segments.size(); i++)
      std::memcpy(segments[i].seq->logits.data(), logits.data() + i * cfg.vocab, cfg.vocab * sizeof(float));
  }
  for (const Segment& s : segments) s.seq->pos += s.n;
}

}  // namespace meshtrain::infer
