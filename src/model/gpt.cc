#include "model/gpt.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <random>
#include <utility>

#include "core/check.h"
#include "core/profile.h"
#include "kernels/ops.h"
#include "comm/self_group.h"
#include "model/initial_weights.h"

namespace meshtrain::model {

namespace k = meshtrain::kernels;
namespace pf = meshtrain::profile;

namespace {

// The step profile's name of a block's GEMM, by its weight.
pf::Op gemm_site(LayerTensor w) {
  switch (w) {
    case kQkvW: return pf::Op::kQkv;
    case kAttProjW: return pf::Op::kAttnProj;
    case kFcW: return pf::Op::kFc1;
    default: return pf::Op::kFc2;
  }
}

}  // namespace

Gpt::Gpt(const GptConfig& config, LocalState local, comm::Group* tp, bool sequence_parallel,
         const ModelPart& part, comm::Group* ep, ExpertTp expert_tp)
    : config_(config),
      layout_(config, tp ? tp->size() : 1, tp ? tp->rank() : 0, part, ep ? ep->size() : 1, ep ? ep->rank() : 0,
              expert_tp),
      chunks_(part.chunks.empty() ? std::vector<ModelPart::Chunk>{{0, config.layers}} : part.chunks),
      tp_(tp && tp->size() > 1 ? tp : nullptr),
      tp_size_(layout_.tp()),
      tp_rank_(layout_.tp_rank()) {
  sp_ = sequence_parallel && tp_;
  CHECK_MSG(validate_tp(config, tp_size_).is_ok(), "model shape not divisible by tp");
  Cl_ = config.dim / tp_size_;
  NHl_ = config.heads / tp_size_;
  NKVl_ = config.kv_heads_per_rank(tp_size_);
  Ql_ = config.qkv_dim_per_rank(tp_size_);
  kv_replicas_ = config.kv_replicas(tp_size_);
  Fcl_ = config.fc_dim() / tp_size_;
  Fl_ = config.ffn() / tp_size_;
  const int expert_split = layout_.experts_replicated() ? 1 : tp_size_;
  Fcel_ = config.expert_fc_dim() / expert_split;
  Fel_ = config.expert_ffn() / expert_split;
  Fcsl_ = config.expert_fc_dim() / tp_size_;
  Fsl_ = config.expert_ffn() / tp_size_;
  if (config.is_moe()) moe_stats_.resize(config.layers);
  ep_ = ep && ep->size() > 1 ? ep : nullptr;
  if (!ep_ && layout_.experts_replicated() && config.is_moe()) {
    own_ep_ = std::make_unique<comm::SelfGroup>();
    ep_ = own_ep_.get();
  }
  if (config.positions == Positions::kRope) {
    const size_t entries = (size_t)config.max_seq_len * (config.head_dim() / 2);
    rope_cos_.resize(entries), rope_sin_.resize(entries);
    k::rope_table(rope_cos_.data(), rope_sin_.data(), config.max_seq_len, config.head_dim(), config.rope_theta,
                  config.rope_scaling);
  }
  Vl_ = config.padded_vocab() / tp_size_;
  vb_ = tp_rank_ * Vl_;
  vn_ = std::clamp(config.vocab - vb_, 0, Vl_);
  if (local != LocalState::kNone)
    local_ = std::make_unique<LocalParamStore>(layout_, local == LocalState::kParamsAndGrads);
  store_ = local_.get();
  pipeline_.tied_head().configure(chunks_, config_.layers, layout_.has_untied_head());
}

void Gpt::set_recompute(Recompute mode, int every) {
  CHECK(every >= 1);
  recompute_ = mode;
  recompute_every_ = every;
  B_ = T_ = 0;  // activations are laid out again on the next forward
}

Recompute Gpt::recompute_of(int l) const {
  return l % recompute_every_ == 0 ? recompute_ : Recompute::kNone;
}

// Analytic FLOPs of one block's forward on this rank (2 per multiply-add; causal
// attention counts its half), added to the model or the recomputation count. An MoE layer's
// MLP counts its own (moe_flops: its rows depend on the routing).
void Gpt::count_block_flops(int l, int B, int T, bool recomputing, bool attention_only) {
  const double N = (double)B * T, C = config_.dim;
  // QK^T and PV, causal half; under cp this rank's T rows see the whole sequence's keys.
  const double attention = 2.0 * 2.0 * B * (double)T * T * cp_size() / 2.0 * Cl_;
  const double mlp = config_.is_moe_layer(l) ? 0.0 : (double)Fcl_ + Fl_;
  const double linears = 2.0 * N * C * ((double)Ql_ + Cl_ + mlp);
  const double f = attention_only ? attention : attention + linears;
  (recomputing ? flops_.recompute : flops_.model) += f;
}

void Gpt::tp_all_reduce(float* x, size_t n, comm::ReduceOp op) {
  if (tp_) tp_->all_reduce(x, n, op);
}

const float* Gpt::gather_rows(const float* local, float* full) {
  if (!sp_) return local;
  tp_->all_gather(local, full, (size_t)Nl_ * config_.dim);
  return full;
}

const float* Gpt::reduce_rows(float* full_partial, float* local) {
  const size_t n = (size_t)Nl_ * config_.dim;
  if (!sp_) {
    tp_all_reduce(full_partial, n);
    return full_partial;
  }
  tp_->reduce_scatter(full_partial, local, n);
  return local;
}

void Gpt::norm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int rows) const {
  const pf::Scope scope(pf::Op::kNorm, 0, 8.0 * rows * config_.dim);  // the rows read, the output written
  if (config_.norm == Norm::kRmsNorm) k::rmsnorm_forward(out, rstd, inp, weight, rows, config_.dim, config_.norm_eps);
  else k::layernorm_forward(out, mean, rstd, inp, weight, bias, rows, config_.dim);
}

void Gpt::norm_backward_tp(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                           const float* weight, const float* mean, const float* rstd, int rows) {
  const int C = config_.dim;
  const pf::Scope scope(pf::Op::kNorm, 0, 16.0 * rows * C);  // dout and the input read, dinp read and written
  const bool rms = config_.norm == Norm::kRmsNorm;
  auto backward = [&](float* dw, float* db) {
    if (rms) k::rmsnorm_backward(dinp, dw, dout, inp, weight, rstd, rows, C);
    else k::layernorm_backward(dinp, dw, db, dout, inp, weight, mean, rstd, rows, C);
  };
  if (!sp_) return backward(dweight, dbias);
  // Each rank saw only its tokens: sum the weight gradients over tp before accumulating.
  const int parts = rms ? 1 : 2;
  std::vector<float> dwb(parts * (size_t)C, 0.0f);
  backward(dwb.data(), rms ? nullptr : dwb.data() + C);
  tp_all_reduce(dwb.data(), dwb.size());
  for (int c = 0; c < C; c++) dweight[c] += dwb[c];
  if (!rms)
    for (int c = 0; c < C; c++) dbias[c] += dwb[C + c];
}

// Training rows start at position 0: row n of a B x T micro-batch is at position n % T,
// unless a document mask restarts them.
void Gpt::rotate_qk(float* qkv, int B, int T, bool inverse) const {
  if (config_.positions != Positions::kRope) return;
  const int hs = config_.head_dim(), N = B * T;
  const pf::Scope scope(pf::Op::kRope, 0, 8.0 * N * (Cl_ + NKVl_ * hs));  // q and k read and written
  const int* at = row_positions();
  k::rope_rotate(qkv, N, T, Ql_, NHl_, hs, rope_cos_.data(), rope_sin_.data(), 0, inverse, at);
  k::rope_rotate(qkv + Cl_, N, T, Ql_, NKVl_, hs, rope_cos_.data(), rope_sin_.data(), 0, inverse, at);
}

const DocumentRows* Gpt::sequence_documents() const {
  const DocumentRows& rows = set().sequence_documents;
  return rows.key_end.empty() ? nullptr : &rows;
}

const int* Gpt::row_positions() const { return rows_placed() ? set().documents.positions.data() : nullptr; }

void Gpt::set_context_parallel(const CpGroups& groups, CpComm comm) {
  cp_ = groups.cp && groups.cp->size() > 1 ? groups.cp : nullptr;
  CHECK_MSG(comm != CpComm::kHybrid || !cp_ || (groups.a2a && groups.ring), "--cp-comm hybrid needs its groups");
  ring_ = cp_ && comm == CpComm::kRing ? std::make_unique<RingAttention>(*cp_) : nullptr;
  ulysses_ = cp_ && comm == CpComm::kA2a ? std::make_unique<UlyssesAttention>(*cp_) : nullptr;
  if (cp_ && comm == CpComm::kHybrid)
    ulysses_ = std::make_unique<UlyssesAttention>(*groups.a2a, std::make_unique<RingAttention>(*groups.ring));
  gather_ = cp_ && comm == CpComm::kAllGather ? std::make_unique<GatherAttention>(*cp_) : nullptr;
  B_ = T_ = 0;
}

void Gpt::place_rows(ActivationSet& s, const int*& inputs, const int*& targets, int B, int T) {
  if (!cp_) {
    CHECK_MSG(inputs, "a document mask needs the micro-batch's tokens on every pipeline stage");
    s.documents = document_rows(inputs, B, T, doc_separator_);
    return;
  }
  DocumentRows whole;
  if (document_mask()) {
    CHECK_MSG(inputs, "a document mask needs the micro-batch's tokens on every pipeline stage");
    whole = document_rows(inputs, B, T, doc_separator_);
  }
  // Under a document mask the ranks that attend to their own rows (ring, all-gather) hold
  // chunks balanced on the keys those rows see; Ulysses attends whole sequences (the split
  // moves no work), and MoE's capacity reads the causal split's chunks.
  const bool balance = document_mask() && (ring_ || gather_) && !config_.is_moe();
  s.split = balance ? balanced_split(whole, B, T, cp_->size(), cp_->rank()) : CpSplit{cp_->size(), cp_->rank()};
  const CpSplit& split = s.split;
  if (document_mask()) {
    cp_balance_.used = std::max(cp_balance_.used, split_imbalance(split, whole, B, T));
    cp_balance_.causal = std::max(cp_balance_.causal, split_imbalance(CpSplit{split.size, 0}, whole, B, T));
  }
  s.documents = local_rows(split, document_mask() ? &whole : nullptr, B, T);
  // a2a attends over the whole sequences (hybrid: its group's rows)
  if (ulysses_) s.sequence_documents = ulysses_->traded_rows(document_mask() ? &whole : nullptr, B, T);
  // This rank's tokens and targets, kept in the set (the first and last stages read them).
  if (inputs) s.local_inputs = split.take(inputs, B, T), inputs = s.local_inputs.data();
  if (targets) s.local_targets = split.take(targets, B, T), targets = s.local_targets.data();
}

k::AttentionBlock Gpt::ranged_block(const float* qkv, int B, int T) const {
  const int hs = config_.head_dim();
  const DocumentRows& d = set().documents;
  return {qkv, Ql_, qkv + Cl_, qkv + Cl_ + NKVl_ * hs, Ql_, B, T, T, NHl_, NKVl_, hs, d.key_begin.data(),
          d.key_end.data()};
}

// Under a document mask the ranged kernel runs in fp32 at every precision (docs/long_context.md).
// Attention's model FLOPs on this rank: its rows against the whole sequence's keys, the
// causal half, two products (QK^T and PV) of 2 x hs per pair and head; the backward twice.
double Gpt::attention_flops(int B, int T) const { return 2.0 * B * T * ((double)T * cp_size()) * Cl_; }

void Gpt::attend(BlockActivations& a, int B, int T) {
  const pf::Scope scope(pf::Op::kAttention, attention_flops(B, T));
  if (ulysses_)
    return ulysses_->forward(a.atty, a.att_lse, a.qkv, Ql_, B, NHl_, NKVl_, config_.head_dim(), sequence_documents(),
                             precision_);
  if (ring_)
    return ring_->forward(a.atty, a.att_lse, a.qkv, Ql_, B, NHl_, NKVl_, config_.head_dim(), set().documents,
                          set().split);
  if (gather_)
    return gather_->forward(a.atty, a.att_lse, a.qkv, Ql_, B, NHl_, NKVl_, config_.head_dim(), set().documents,
                            set().split);
  if (!document_mask()) return k::attention_forward(a.atty, a.att_lse, a.qkv, B, T, Cl_, NHl_, NKVl_, precision_);
  k::attention_ranged_forward(a.atty, Cl_, a.att_lse, ranged_block(a.qkv, B, T));
}

void Gpt::attend_backward(const BlockActivations& a, int B, int T) {
  const pf::Scope scope(pf::Op::kAttention, 2 * attention_flops(B, T));
  if (ulysses_)
    return ulysses_->backward(dqkv_, datty_, a.qkv, a.atty, a.att_lse, Ql_, B, NHl_, NKVl_, config_.head_dim(),
                              sequence_documents(), precision_);
  if (ring_)
    return ring_->backward(dqkv_, datty_, a.qkv, a.atty, a.att_lse, Ql_, B, NHl_, NKVl_, config_.head_dim(),
                           set().documents, set().split);
  if (gather_)
    return gather_->backward(dqkv_, datty_, a.qkv, a.atty, a.att_lse, Ql_, B, NHl_, NKVl_, config_.head_dim(),
                             set().documents, set().split);
  if (!document_mask())
    return k::attention_backward(dqkv_, datty_, a.qkv, a.atty, a.att_lse, B, T, Cl_, NHl_, NKVl_, precision_);
  std::fill(dqkv_, dqkv_ + (size_t)B * T * Ql_, 0.0f);  // the ranged backward adds
  const int CK = NKVl_ * config_.head_dim();
  k::attention_ranged_backward(dqkv_, Ql_, dqkv_ + Cl_, dqkv_ + Cl_ + CK, Ql_, datty_, a.atty, Cl_, a.att_lse,
                               ranged_block(a.qkv, B, T));
}

float* Gpt::params() {
  CHECK_MSG(local_, "model has no local parameter buffer (sharded state)");
  return local_->params();
}
const float* Gpt::params() const { return const_cast<Gpt*>(this)->params(); }
float* Gpt::grads() {
  CHECK_MSG(has_local_grads(), "model has no local gradient buffer (sharded state)");
  return local_->grads();
}

void Gpt::set_param_store(ParamStore* store) { store_ = store ? store : local_.get(); }

void Gpt::set_from_global(const float* global) {
  const ParamLayout whole(config_);
  for (const ParamTensor& t : layout_.tensors())
    global_to_local(t, tp_size_, tp_rank_, global + whole.find(t.name)->offset, params() + t.offset);
}

void Gpt::init_weights(uint64_t seed) {
  if (tp_size_ > 1 || !layout_.is_whole_model()) {
    // Every rank draws the whole model's weights (same seed), then keeps its slice (tp)
    // and its stages (pp): the same initial model as one rank.
    Gpt whole(config_, LocalState::kParamsOnly);
    whole.init_weights(seed);
    set_from_global(whole.params());
    return;
  }
  std::mt19937_64 rng(seed);
  for (const ParamTensor& t : layout_.tensors()) draw_initial_tensor(config_, layout_, t, rng, params() + t.offset);
}

int64_t ActivationInventory::block(Recompute mode, bool moe) const {
  switch (mode) {
    case Recompute::kNone: return moe ? moe_block_none : block_none;
    case Recompute::kSelective: return moe ? moe_block_selective : block_selective;
    case Recompute::kFull: return block_full;
  }
  return 0;
}

int64_t ActivationInventory::recompute_scratch(Recompute mode) const {
  switch (mode) {
    case Recompute::kNone: return 0;
    case Recompute::kSelective: return recompute_selective;
    case Recompute::kFull: return recompute_full;
  }
  return 0;
}

int64_t moe_expert_rows(const GptConfig& config, int B, int T, int ep, double capacity_factor, int replicas, int cp) {
  const int64_t N = (int64_t)B * T, k = config.moe.top_k, El = config.moe.experts / ep;
  int64_t rows = ep * N * std::min(k, El);
  if (capacity_factor > 0) {
    const int64_t cap = (int64_t)std::ceil(k * (double)T * cp * capacity_factor / config.moe.experts);
    rows = std::min(rows, ep * El * cap * B);
  }
  if (replicas > 1) rows = (rows + replicas - 1) / replicas + ep;
  return rows;
}

ActivationInventory activation_inventory(const GptConfig& config, int B, int T, int tp, bool sequence_parallel,
                                         int ep, double capacity_factor, ExpertTp expert_tp, int cp) {
  const int64_t N = (int64_t)B * T, C = config.dim, Cl = C / tp, NHl = config.heads / tp;
  const int64_t Ql = config.qkv_dim_per_rank(tp), Fcl = config.fc_dim() / tp, Fl = config.ffn() / tp;
  const int64_t stats = config.norm == Norm::kLayerNorm ? 2 : 1;  // mean and rstd, or rstd
  const int64_t Vl = config.padded_vocab() / tp;
  const bool sp = sequence_parallel && tp > 1;
  const int64_t Nl = sp ? N / tp : N;
  ActivationInventory a;
  const int64_t attention_core = N * Cl + N * NHl;  // atty, att_lse
  a.block_none = Nl * C * 4 + N * Ql + N * Cl + N * Fcl + N * Fl + Nl * 2 * stats + N * NHl;
  a.block_selective = a.block_none - attention_core;
  a.block_full = Nl * C;  // the block's output only
  a.set_input = Nl * C;
  a.head = Nl * C + stats * Nl + (sp ? N * C : 0) + N * Vl + 3 * N;
  a.recompute_selective = attention_core;
  a.recompute_full = a.block_none;
  // The routed experts' widths on this rank and the rows they see (moe_expert_rows), whether
  // rows move between ranks, and a shared expert's widths.
  const int replicas = expert_tp == ExpertTp::kReplicated && tp > 1 ? tp : 1;
  const int64_t Fcel = config.expert_fc_dim() / (tp / replicas), Fel = config.expert_ffn() / (tp / replicas);
  const int64_t R = config.is_moe() ? moe_expert_rows(config, B, T, ep, capacity_factor, replicas, cp) : 0;
  const bool dispatched = ep > 1 || replicas > 1;
  const int64_t Fcsl = config.expert_fc_dim() / tp, Fsl = config.expert_ffn() / tp;
  if (config.is_moe()) {
    const int64_t E = config.moe.experts, k = config.moe.top_k, S = config.moe.shared_experts, Nk = N * k;
    const int64_t in = dispatched ? R * C : 0;
    const int64_t mlp = N * E + 4 * Nk + (E + 1) + E + R * (Fcel + Fel) + in + Nk * C + N * S * (Fcsl + Fsl);
    a.moe_block_none = a.block_none - N * Fcl - N * Fl + mlp;
    a.moe_block_selective = a.moe_block_none - attention_core;
    const bool dense_layers = config.moe_layers() < config.layers;
    a.recompute_full = std::max(dense_layers ? a.block_none : 0, a.moe_block_none);
  }
  // dresidual, dln, dbranch [Nl,C]; partial, gathered [N,C]; datty, dqkv; dfch, dfch_gelu;
  // with replicated key/value heads, every head's k and v gradient [heads,N,2hs] for the
  // exchange between a head's ranks.
  a.gradient_scratch = Nl * C * 3 + N * C * 2 + N * Cl + N * Ql + N * Fcl + N * Fl;
  if (config.kv_replicas(tp) > 1) a.gradient_scratch += N * 2 * (int64_t)config.kv_dim();
  // MoE, with Rs = max(Nk, R) rows: dispatched rows and their gradients [Rs,C] x 2 (and an
  // exchange buffer [Rs,C] when rows move between ranks), hidden gradients of the experts
  // [R, Fcel + Fel] or of the shared experts [N, S*(Fcsl + Fsl)], whichever is larger
  // (each of the two buffers), dweight [Nk], dlogits [N,E].
  if (config.is_moe()) {
    const int64_t E = config.moe.experts, k = config.moe.top_k, S = config.moe.shared_experts;
    const int64_t Rs = std::max(N * k, R);
    a.gradient_scratch += (dispatched ? 3 : 2) * Rs * C + std::max(Rs * Fel, N * S * Fsl) +
                          std::max(Rs * Fcel, N * S * Fcsl) + N * k + N * E;
  }
  return a;
}

void Gpt::ensure_activations(int B, int T) {
  CHECK_MSG(T <= config_.max_seq_len, "sequence longer than the position embedding");
  if (B == B_ && T == T_) return;
  B_ = B, T_ = T;
  CHECK_MSG(!sp_ || (B * T) % tp_size_ == 0, "sequence parallelism needs B*T divisible by tp");
  const size_t N = (size_t)B * T, C = config_.dim, NH = NHl_, Cl = Cl_;
  const size_t Nl = sp_ ? N / tp_size_ : N;
  Nl_ = (int)Nl;
  inventory_ = activation_inventory(config_, B, T, tp_size_, sp_, layout_.ep(), moe_training_.capacity_factor,
                                    layout_.expert_tp(), cp_size());
  const bool reuse = within_reserve();
  if (reuse) {
    // Every tensor grows with T at a fixed B: the reserved shape's sizes hold this one's.
    reserved_ = activation_inventory(config_, reserved_B_, reserved_T_, tp_size_, sp_, layout_.ep(),
                                     moe_training_.capacity_factor, layout_.expert_tp(), cp_size());
  }
  pipeline_.sets().reshape(reuse);
  // Recomputed tensors live once, here, instead of once per block and micro-batch; so do
  // the gradients of one block's intermediates in backward.
  const size_t shared = inventory_.recompute_scratch(recompute_) + inventory_.gradient_scratch;
  const size_t capacity =
      reuse ? std::max<size_t>(shared, reserved_.recompute_scratch(recompute_) + reserved_.gradient_scratch) : shared;
  if (shared_.size() != capacity) shared_.allocate(MemCategory::kActivations, capacity);
  float* cursor = shared_.data();
  auto take = [&](size_t n) {
    float* p = cursor;
    cursor += n;
    return p;
  };
  scratch_ = BlockActivations{};
  if (recompute_ == Recompute::kSelective) scratch_.atty = take(N * Cl), scratch_.att_lse = take(N * NH);
  if (recompute_ == Recompute::kFull) {  // one block's worth, dense or MoE (aliased)
    float* start = cursor;
    if (config_.is_moe()) take_block(moe_scratch_, take, true, true, true);
    cursor = start;
    take_block(scratch_, take, true, true, false);
    cursor = start + inventory_.recompute_full;
  }
  dresidual_ = take(Nl * C), dln_ = take(Nl * C), partial_ = take(N * C), gathered_ = take(N * C);
  dbranch_ = take(Nl * C);
  datty_ = take(N * Cl), dqkv_ = take(N * Ql_), dfch_ = take(N * Fcl_), dfch_gelu_ = take(N * Fl_);
  kv_exchange_ = kv_replicas_ > 1 ? take(N * 2 * (size_t)config_.kv_dim()) : nullptr;
  if (config_.is_moe()) {
    const size_t k = config_.moe.top_k, S = config_.moe.shared_experts, E = config_.moe.experts;
    const size_t Rs = std::max<size_t>(N * k, moe_expert_rows(config_, B, T, layout_.ep(), moe_training_.capacity_factor,
                                                              expert_replicas(), cp_size()));
    moe_rows_ = take(Rs * C), moe_dy_ = take(Rs * C), moe_xchg_ = ep_ ? take(Rs * C) : nullptr;
    moe_dact_ = take(std::max(Rs * Fel_, N * S * Fsl_)), moe_dfch_ = take(std::max(Rs * Fcel_, N * S * Fcsl_));
    moe_dweight_ = take(N * k), moe_dlogits_ = take(N * E);
    if (recompute_ == Recompute::kSelective) moe_scratch_.atty = scratch_.atty, moe_scratch_.att_lse = scratch_.att_lse;
  }
  CHECK(cursor <= shared_.data() + shared_.size());
}

// One micro-batch's set for chunk c: its input, its blocks, and the head's tensors.
size_t Gpt::set_floats(int c, const ActivationInventory& inventory) const {
  int64_t n = inventory.set_input;
  for (int l = chunks_[c].begin; l < chunks_[c].end; l++)
    n += inventory.block(recompute_of(l), config_.is_moe_layer(l));
  if (is_last_stage(c)) n += inventory.head;
  return (size_t)n;
}

size_t Gpt::set_capacity(int c) const {
  const size_t here = set_floats(c, inventory_);
  return within_reserve() ? std::max(here, set_floats(c, reserved_)) : here;
}

template <typename Take>
void Gpt::take_block(BlockActivations& a, Take& take, bool with_core, bool with_output, bool moe) const {
  const size_t N = (size_t)B_ * T_, C = config_.dim, Nl = Nl_;
  const bool mean = config_.norm == Norm::kLayerNorm;
  a.ln1 = take(Nl * C), a.ln1_mean = mean ? take(Nl) : nullptr, a.ln1_rstd = take(Nl);
  a.qkv = take(N * Ql_);
  if (with_core) a.atty = take(N * Cl_), a.att_lse = take(N * NHl_);
  a.residual2 = take(Nl * C), a.ln2 = take(Nl * C), a.ln2_mean = mean ? take(Nl) : nullptr, a.ln2_rstd = take(Nl);
  if (moe) {
    const size_t E = config_.moe.experts, Nk = N * config_.moe.top_k, S = config_.moe.shared_experts;
    const size_t R =
        moe_expert_rows(config_, B_, T_, layout_.ep(), moe_training_.capacity_factor, expert_replicas(), cp_size());
    auto ints = [&](size_t n) { return reinterpret_cast<int*>(take(n)); };  // 4-byte slots
    a.router_logits = take(N * E);
    a.route.expert = ints(Nk), a.route.weight = take(Nk), a.route.slot = ints(Nk), a.route.order = ints(Nk);
    a.route.offsets = ints(E + 1);
    a.received = ints(E);
    a.fch = take(R * Fcel_), a.fch_gelu = take(R * Fel_);
    a.expert_in = ep_ ? take(R * C) : nullptr;
    a.expert_out = take(Nk * C);
    a.shared_fch = S > 0 ? take(N * S * Fcsl_) : nullptr, a.shared_act = S > 0 ? take(N * S * Fsl_) : nullptr;
  } else {
    a.fch = take(N * Fcl_), a.fch_gelu = take(N * Fl_);
  }
  if (with_output) a.residual3 = take(Nl * C);
}

void Gpt::layout_set(int c, ActivationSet& s) {
  const size_t N = (size_t)B_ * T_, C = config_.dim, Nl = Nl_;
  if (s.data.size() != set_capacity(c)) s.data.allocate(MemCategory::kActivations, set_capacity(c));
  s.chunk = c;
  float* cursor = s.data.data();
  auto take = [&](size_t n) {
    float* p = cursor;
    cursor += n;
    return p;
  };
  s.input = take(Nl * C);
  s.blocks.assign(chunks_[c].end - chunks_[c].begin, BlockActivations{});
  for (int l = chunks_[c].begin; l < chunks_[c].end; l++) {
    BlockActivations& a = s.blocks[l - chunks_[c].begin];
    const bool moe = config_.is_moe_layer(l);
    switch (recompute_of(l)) {
      case Recompute::kNone: take_block(a, take, true, true, moe); break;
      case Recompute::kSelective:
        take_block(a, take, false, true, moe);
        a.atty = scratch_.atty, a.att_lse = scratch_.att_lse;
        break;
      case Recompute::kFull: {
        float* output = take(Nl * C);
        a = moe ? moe_scratch_ : scratch_;  // everything but the output is recomputed into the shared set
        a.residual3 = output;
        break;
      }
    }
  }
  if (is_last_stage(c)) {
    s.lnf = take(Nl * C), s.lnf_mean = config_.norm == Norm::kLayerNorm ? take(Nl) : nullptr, s.lnf_rstd = take(Nl);
    s.lnf_full = sp_ ? take(N * C) : s.lnf;
    s.logits = take(N * Vl_);
    s.lse = take(N), s.target_logit = take(N), s.losses = take(N);
  }
  CHECK(cursor <= s.data.data() + s.data.size());
}

int64_t Gpt::activation_set_bytes(int c) const { return (int64_t)(set_capacity(c) * sizeof(float)); }

size_t Gpt::boundary_elements(int B, int T) const { return local_boundary_elements(B, T / cp_size()); }

size_t Gpt::local_boundary_elements(int B, int Tl) const {
  return (size_t)B * Tl / (sp_ ? tp_size_ : 1) * config_.dim;
}

// Megatron's block: column-parallel QKV and fc (no communication), row-parallel output
// projections whose partial sums are all-reduced over tp before the bias and residual
// ("g": all-reduce forward, identity backward); "f" (identity forward, all-reduce
// backward) sits on the inputs of the column-parallel linears.
// A residual branch's output: + bias (replicated, added once after the tp reduction), then
// dropout, in place on this rank's rows.
void Gpt::branch_with_dropout(float* x, const float* bias, int rows, int site) {
  const int C = config_.dim;
  const pf::Scope scope(pf::Op::kResidual, 0, bias || dropout_p_ > 0 ? 8.0 * rows * C : 0);
  if (bias) {
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; r++)
      for (int c = 0; c < C; c++) x[(size_t)r * C + c] += bias[c];
  }
  dropout(x, rows, site);
}

k::GemmInput Gpt::gemm_weight(int u, const float* unit_base, const ParamTensor& t) const {
  if (const uint16_t* half = store_->acquired_bf16(u)) return k::GemmInput(half + layout_.offset_in_unit(t));
  return param(u, unit_base, t);
}

// A key/value head replicated on several tp ranks (fewer heads than ranks): each rank's k
// and v see only its own query heads, so each rank's weight gradient of the head is a part
// of the head's; the rest is the other replicas' dk, dv times the same input. One tp
// all-reduce of every head's [N, 2hs] (a rank writes its own head's slot, zeros elsewhere)
// gives each head's total; a weight-gradient-only GEMM adds total minus own. The input
// gradient needs nothing: the tp reduction of the column-parallel input gradient already
// sums every replica's part.
void Gpt::add_kv_replica_grads(k::GradOutput dqkv_weight, float* dqkv_bias, const float* inp, int N) {
  const size_t hs = config_.head_dim(), row = 2 * hs, C = config_.dim, Cl = Cl_;
  const int head = tp_rank_ / kv_replicas_;
  float* slots = kv_exchange_;
  std::fill(slots, slots + (size_t)N * 2 * config_.kv_dim(), 0.0f);
  float* mine = slots + (size_t)head * N * row;
  for (int n = 0; n < N; n++) {
    const float* src = dqkv_ + (size_t)n * Ql_ + Cl;  // this row's k then v gradient (one head each)
    std::copy(src, src + row, mine + (size_t)n * row);
  }
  tp_all_reduce(slots, (size_t)N * 2 * config_.kv_dim());
  for (int n = 0; n < N; n++) {  // the other replicas' part: the total less this rank's own
    const float* own = dqkv_ + (size_t)n * Ql_ + Cl;
    for (size_t j = 0; j < row; j++) mine[(size_t)n * row + j] -= own[j];
  }
  // The k and v rows follow q's Cl rows in the fused weight (and bias) gradient.
  if (dqkv_weight.fp32) dqkv_weight.fp32 += Cl * C;
  else dqkv_weight.bf16 += Cl * C;
  k::matmul_backward(nullptr, dqkv_weight, dqkv_bias ? dqkv_bias + Cl : nullptr, mine, inp, k::GemmInput(inp), N,
                     (int)C, (int)row, precision_);
}

k::GradOutput Gpt::weight_grad(int u, float* unit_base, const ParamTensor& t) const {
  if (uint16_t* half = store_->acquired_grads_bf16(u)) return k::GradOutput(half + layout_.offset_in_unit(t));
  return grad(u, unit_base, t);
}

k::GemmInput Gpt::activation_into(BlockActivations& a, int N) const { return activate(a.fch, a.fch_gelu, N, Fl_); }

// GELU(fc) or SwiGLU(fc) of `rows` rows of hidden width F into out: bf16 words in its first
// half for bf16 GEMMs (rounded once here), else fp32.
k::GemmInput Gpt::activate(const float* fc, float* out, int rows, int F) const {
  const bool bf16 = precision_ == k::Precision::kBf16;
  const bool swiglu = config_.mlp == Mlp::kSwiGlu;
  // fc read (gate and up: twice F), the activation written (16-bit words for bf16 GEMMs)
  const pf::Scope scope(pf::Op::kActivation, 0, (double)rows * F * ((swiglu ? 8 : 4) + (bf16 ? 2 : 4)));
  uint16_t* half = reinterpret_cast<uint16_t*>(out);
  if (swiglu) {
    if (bf16) k::swiglu_forward(half, fc, rows, F);
    else k::swiglu_forward(out, fc, rows, F);
  } else {
    if (bf16) k::gelu_forward(half, fc, (size_t)rows * F);
    else k::gelu_forward(out, fc, (size_t)rows * F);
  }
  return hidden_input(out);
}

k::GemmInput Gpt::hidden_input(const float* out) const {
  if (precision_ == k::Precision::kBf16) return k::GemmInput(reinterpret_cast<const uint16_t*>(out));
  return out;
}

void Gpt::activation_backward(float* dfc, const float* fc, const float* dout, int rows, int F) const {
  const int fc_width = config_.mlp == Mlp::kSwiGlu ? 2 : 1;  // fc and dfc: gate and up
  const pf::Scope scope(pf::Op::kActivation, 0, 4.0 * rows * F * (2 * fc_width + 1));
  if (config_.mlp == Mlp::kSwiGlu) k::swiglu_backward(dfc, fc, dout, rows, F);
  else k::gelu_backward(dfc, fc, dout, (size_t)rows * F);
}

k::GemmInput Gpt::mlp_hidden(const BlockActivations& a) const { return hidden_input(a.fch_gelu); }

void Gpt::block_forward(int l, const float* residual, int B, int T, bool recomputing) {
  const int N = B * T, C = config_.dim, Nl = Nl_;
  count_block_flops(l, B, T, recomputing, false);
  const int u = layout_.block_unit(l);
  const float* unit = store_->acquire_params(u);
  // W: a tensor the architecture may lack (null then); Wg: a GEMM weight.
  auto W = [&](LayerTensor t) { return layout_.has(l, t) ? param(u, unit, layout_.layer(l, t)) : nullptr; };
  auto Wg = [&](LayerTensor t) { return gemm_weight(u, unit, layout_.layer(l, t)); };
  BlockActivations& a = acts(l);
  auto gemm = [&](pf::Op site, float* out, k::GemmInput inp, LayerTensor w, const float* bias, int in, int out_cols) {
    const pf::Scope scope(site, 2.0 * N * in * out_cols);
    k::matmul_forward(out, inp, Wg(w), bias, N, in, out_cols, precision_);
  };
  norm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, residual, W(kLn1W), W(kLn1B), Nl);
  gemm(pf::Op::kQkv, a.qkv, gather_rows(a.ln1, gathered_), kQkvW, W(kQkvB), C, Ql_);
  rotate_qk(a.qkv, B, T, false);
  attend(a, B, T);
  gemm(pf::Op::kAttnProj, partial_, a.atty, kAttProjW, nullptr, Cl_, C);
  float* proj = const_cast<float*>(reduce_rows(partial_, gathered_));  // g
  branch_with_dropout(proj, W(kAttProjB), Nl, 1 + 2 * l);
  residual_add(a.residual2, residual, proj, Nl);
  norm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.residual2, W(kLn2W), W(kLn2B), Nl);
  if (config_.is_moe_layer(l)) {
    const pf::Scope scope(pf::Op::kExperts);
    moe_forward(l, u, unit, a, B, T, recomputing);
  } else {
    gemm(pf::Op::kFc1, a.fch, gather_rows(a.ln2, gathered_), kFcW, W(kFcB), C, Fcl_);
    const k::GemmInput hidden = activation_into(a, N);
    gemm(pf::Op::kFc2, partial_, hidden, kFcProjW, nullptr, Fl_, C);
  }
  proj = const_cast<float*>(reduce_rows(partial_, gathered_));  // g
  branch_with_dropout(proj, W(kFcProjB), Nl, 2 + 2 * l);
  residual_add(a.residual3, a.residual2, proj, Nl);
  store_->release_params(u);
}

void Gpt::residual_add(float* out, const float* residual, const float* branch, int rows) const {
  const pf::Scope scope(pf::Op::kResidual, 0, 12.0 * rows * config_.dim);
  k::bias_residual_forward(out, residual, branch, nullptr, rows, config_.dim);
}

// Vocabulary-parallel embedding: each rank looks up the tokens of its slice (rank 0 adds
// the position embedding); summing over tp assembles the embedding (of this rank's rows).
void Gpt::embedding_forward(const int* inputs, int B, int T) {
  const int E = layout_.embedding_unit();
  const pf::Scope scope(pf::Op::kEmbedding, 0, 8.0 * B * T * config_.dim);
  const float* emb = store_->acquire_params(E);
  set().inputs.assign(inputs, inputs + (size_t)B * T);
  float* embedded = sp_ ? partial_ : set().input;  // all rows; input keeps this rank's
  const float* wpe = tp_rank_ == 0 && layout_.has_wpe() ? param(E, emb, layout_.wpe()) : nullptr;
  const k::GemmInput wte = gemm_weight(E, emb, layout_.wte());
  if (wte.bf16) k::encoder_forward(embedded, inputs, wte.bf16, wpe, B, T, config_.dim, vb_, Vl_, row_positions());
  else k::encoder_forward(embedded, inputs, wte.fp32, wpe, B, T, config_.dim, vb_, Vl_, row_positions());
  store_->release_params(E);
  reduce_rows(embedded, set().input);
  dropout(set().input, Nl_, 0);
}

const float* Gpt::blocks_forward(int c, const float* residual, int B, int T) {
  for (int l = chunks_[c].begin; l < chunks_[c].end; l++) {
    block_forward(l, residual, B, T);
    residual = acts(l).residual3;
  }
  return residual;
}

// Final norm and the LM head (tied: wte) over this rank's real vocabulary columns: logits[N, vn]
// with row stride Vl.
void Gpt::head_forward(const float* residual, int B, int T) {
  const int N = B * T, C = config_.dim, F = layout_.final_unit();
  const float* fin = store_->acquire_params(F);
  norm_forward(set().lnf, set().lnf_mean, set().lnf_rstd, residual, param(F, fin, layout_.lnf_w()),
               layout_.has_lnf_b() ? param(F, fin, layout_.lnf_b()) : nullptr, Nl_);
  gather_rows(set().lnf, set().lnf_full);
  auto head_gemm = [&](const k::GemmInput& w) {
    const pf::Scope scope(pf::Op::kHead, 2.0 * N * vn_ * C);
    k::gemm(precision_, false, true, N, vn_, C, 1.0f, set().lnf_full, C, w, C, 0.0f, set().logits, logits_ld());
  };
  if (layout_.has_untied_head()) {  // in the final norm's unit
    head_gemm(gemm_weight(F, fin, layout_.head()));
    store_->release_params(F);
    return;
  }
  store_->release_params(F);
  const int E = layout_.embedding_unit();
  head_gemm(gemm_weight(E, store_->acquire_params(E), layout_.wte()));
  store_->release_params(E);
}

float Gpt::forward_chunk(int c, int mb, const int* inputs, const int* targets, const float* input,
                         int B, int T) {
  CHECK_MSG(store_, "no parameter store");
  const int T_whole = T;
  T /= cp_size();  // this rank's rows of each sequence
  if (ring_) ring_->set_sequence(T_whole);
  if (ulysses_) ulysses_->set_sequence(T_whole);
  if (gather_) gather_->set_sequence(T_whole);
  ensure_activations(B, T);
  cur_chunk_ = c;
  ActivationSet& opened =
      pipeline_.sets().open(c, mb, set_capacity(c), [this](int chunk, ActivationSet& s) { layout_set(chunk, s); });
  opened.step = step_, opened.first_token_row = first_token_row_;
  if (rows_placed()) place_rows(opened, inputs, targets, B, T_whole);
  store_->begin_pass(Pass::kForward);
  const bool first = is_first_stage(c), last = is_last_stage(c);
  // The embedding unit stays acquired for the whole chunk when it serves both ends.
  const int E = first && last ? layout_.embedding_unit() : -1;
  if (E >= 0) store_->acquire_params(E);
  if (first) embedding_forward(inputs, B, T);
  else {
    CHECK_MSG(input, "a stage after the first needs the previous stage's output");
    std::memcpy(set().input, input, sizeof(float) * local_boundary_elements(B, T));
  }
  const float* out = blocks_forward(c, set().input, B, T);
  float loss = 0;
  if (last) {
    head_forward(out, B, T);
    if (targets) {
      const int N = B * T;
      set().targets.assign(targets, targets + N);
      vocab_parallel_loss(N);
      double sum = 0;
      for (int i = 0; i < N; i++) sum += set().losses[i];
      if (cp_) cp_->all_reduce_f64(&sum, 1, comm::ReduceOp::kSum);  // the whole sequences' tokens
      loss = static_cast<float>(sum / ((double)N * cp_size()));
    }
  }
  if (E >= 0) store_->release_params(E);
  return loss;
}

const float* Gpt::chunk_output(int c, int mb) const {
  return pipeline_.sets().find(c, mb).blocks.back().residual3;
}

const float* Gpt::forward_logits(const int* inputs, int B, int T) {
  CHECK_MSG(tp_size_ == 1, "forward_logits returns whole-vocabulary logits: tp = 1 only");
  CHECK_MSG(layout_.is_whole_model(), "forward_logits needs the whole model");
  CHECK_MSG(!cp_, "forward_logits (decoding) does not run under context parallelism");
  forward_chunk(0, 0, inputs, nullptr, nullptr, B, T);
  // Rows move from the packed stride out to Vp, last row first (each moves up).
  float* logits = set().logits;
  for (int n = B * T - 1; n > 0; n--)
    std::memmove(logits + (size_t)n * Vl_, logits + (size_t)n * logits_ld(), sizeof(float) * vn_);
  return logits;
}

// Vocabulary-parallel cross-entropy: no rank holds all logits; the log-sum-exp is combined
// from each rank's (max-shifted) partial sums, the target logit from the rank that has it.
void Gpt::vocab_parallel_loss(int N) {
  float *lse = set().lse, *target_logit = set().target_logit;
  const pf::Scope scope(pf::Op::kCrossEntropy, 0, 4.0 * N * vn_);  // the logits read
  k::crossentropy_forward(lse, target_logit, set().logits, set().targets.data(), N, vn_, logits_ld(), vb_);
  if (tp_) {
    std::vector<float> global_max(lse, lse + N), scaled(N);
    tp_all_reduce(global_max.data(), N, comm::ReduceOp::kMax);
    for (int i = 0; i < N; i++) scaled[i] = std::exp(lse[i] - global_max[i]);  // 0 for -inf
    tp_all_reduce(scaled.data(), N);
    for (int i = 0; i < N; i++) lse[i] = global_max[i] + std::log(scaled[i]);
    tp_all_reduce(target_logit, N);
  }
  for (int i = 0; i < N; i++) set().losses[i] = lse[i] - target_logit[i];
}

float Gpt::forward(const int* inputs, const int* targets, int B, int T) {
  CHECK_MSG(layout_.holds_every_layer(), "forward() runs the whole model; use forward_chunk()");
  return forward_chunk(0, 0, inputs, targets, nullptr, B, T);
}

void Gpt::block_backward(int l, const float* block_in, int B, int T) {
  const int N = B * T, C = config_.dim, Nl = Nl_;
  const Recompute mode = recompute_of(l);
  if (mode == Recompute::kFull) block_forward(l, block_in, B, T, /*recomputing=*/true);
  // Backward costs twice the forward's FLOPs.
  {
    FlopCounts before = flops_;
    count_block_flops(l, B, T, false, false);
    flops_.model = before.model + 2 * (flops_.model - before.model);
  }
  const int u = layout_.block_unit(l);
  const float* unit = store_->acquire_params(u);
  float* gunit = store_->acquire_grads(u);
  // W, G: a tensor the architecture may lack (null then); Wg, Gw: a GEMM weight's.
  auto W = [&](LayerTensor t) { return layout_.has(l, t) ? param(u, unit, layout_.layer(l, t)) : nullptr; };
  auto Wg = [&](LayerTensor t) { return gemm_weight(u, unit, layout_.layer(l, t)); };
  auto G = [&](LayerTensor t) { return layout_.has(l, t) ? grad(u, gunit, layout_.layer(l, t)) : nullptr; };
  auto Gw = [&](LayerTensor t) { return weight_grad(u, gunit, layout_.layer(l, t)); };
  auto T_ = [&](LayerTensor t) { return layout_.has(l, t) ? &layout_.layer(l, t) : nullptr; };
  auto linear = [&](float* dinp, LayerTensor w, LayerTensor b, const float* dout, k::GemmInput inp, int in, int out,
                    const float* local_rows = nullptr) {
    // The input's gradient now, the weight's too unless a zero-bubble W defers it.
    const pf::Scope scope(gemm_site(w), (pipeline_.weights().deferring() ? 2.0 : 4.0) * N * in * out);
    linear_backward(dinp, u, gunit, layout_.layer(l, w), T_(b), dout, inp, Wg(w), N, in, out, local_rows);
  };
  BlockActivations& a = acts(l);
  // MLP: dresidual is d(residual3); it passes unchanged to residual2 via the skip. Row-
  // parallel backward needs every row of it (the conjugate of the forward reduction).
  if (config_.is_moe_layer(l)) {
    const pf::Scope scope(pf::Op::kExperts);
    moe_backward(l, u, unit, gunit, a, B, T);
  } else {
    linear(dfch_gelu_, kFcProjW, kFcProjB, gather_rows(dropout_grad(dresidual_, 2 + 2 * l), gathered_),
           mlp_hidden(a), Fl_, C);
    activation_backward(dfch_, a.fch, dfch_gelu_, N, Fl_);
    // The weight gradient needs the fc input of every row: gathered again (not stored).
    linear(partial_, kFcW, kFcB, dfch_, gather_rows(a.ln2, gathered_), C, Fcl_, sp_ ? a.ln2 : nullptr);
  }
  const float* dln = reduce_rows(partial_, dln_);  // f
  norm_backward_tp(dresidual_, G(kLn2W), G(kLn2B), dln, a.residual2, W(kLn2W), a.ln2_mean, a.ln2_rstd, Nl);
  // Attention: dresidual is now d(residual2).
  if (mode == Recompute::kSelective) {  // the attention core, from the stored qkv
    attend(a, B, T);
    count_block_flops(l, B, T, true, true);
  }
  linear(datty_, kAttProjW, kAttProjB, gather_rows(dropout_grad(dresidual_, 1 + 2 * l), gathered_), a.atty, Cl_, C);
  attend_backward(a, B, T);
  rotate_qk(dqkv_, B, T, /*inverse=*/true);  // to the gradients of the unrotated q and k
  const float* ln1_rows = gather_rows(a.ln1, gathered_);
  linear(partial_, kQkvW, kQkvB, dqkv_, ln1_rows, C, Ql_, sp_ ? a.ln1 : nullptr);
  if (kv_replicas_ > 1) add_kv_replica_grads(Gw(kQkvW), G(kQkvB), ln1_rows, N);
  dln = reduce_rows(partial_, dln_);  // f
  norm_backward_tp(dresidual_, G(kLn1W), G(kLn1B), dln, block_in, W(kLn1W), a.ln1_mean, a.ln1_rstd, Nl);
  store_->release_params(u);
  if (!pipeline_.weights().deferring()) store_->release_grads(u);  // else its W does, after adding the rest
}

void Gpt::linear_backward(float* dinp, int u, float* gunit, const ParamTensor& w, const ParamTensor* b,
                          const float* dout, k::GemmInput inp, k::GemmInput weight, int N, int C, int OC,
                          const float* local_rows) {
  if (!pipeline_.weights().deferring()) {
    k::matmul_backward(dinp, weight_grad(u, gunit, w), b ? grad(u, gunit, *b) : nullptr, dout, inp, weight, N, C, OC,
                       precision_);
    return;
  }
  // At bf16 the weight GEMM reads dout rounded once (matmul_backward): W keeps those words,
  // half the bytes, for the same product; the bias's gradient, an fp32 sum of dout, is
  // taken here in B (into the unit's gradient, in the order the Ws would add it).
  const bool bf16 = precision_ == k::Precision::kBf16;
  k::matmul_backward(dinp, k::GradOutput(static_cast<float*>(nullptr)), bf16 && b ? grad(u, gunit, *b) : nullptr, dout,
                     inp, weight, N, C, OC, precision_);
  DeferredWeights::Work d;
  d.unit = u;
  k::GemmInput kept_dout((const float*)nullptr);
  if (bf16) {
    d.dout16.allocate(MemCategory::kActivations, (size_t)N * OC);
    k::to_bf16(dout, d.dout16.data(), (size_t)N * OC);
    kept_dout = k::GemmInput((const uint16_t*)d.dout16.data());
  } else {
    d.dout.allocate(MemCategory::kActivations, (size_t)N * OC);
    std::memcpy(d.dout.data(), dout, sizeof(float) * N * OC);
    kept_dout = k::GemmInput((const float*)d.dout.data());
  }
  k::GemmInput kept = inp;
  const bool regather = local_rows && set().holds(local_rows);
  if (regather || set().holds(inp.bf16 ? (const void*)inp.bf16 : (const void*)inp.fp32)) {
    // In the set, which stays until the W (no copy); gathered rows are gathered again there.
  } else if (inp.bf16) {
    d.inp16.allocate(MemCategory::kActivations, (size_t)N * C);
    std::memcpy(d.inp16.data(), inp.bf16, sizeof(uint16_t) * N * C);
    kept = k::GemmInput((const uint16_t*)d.inp16.data());
  } else {
    d.inp.allocate(MemCategory::kActivations, (size_t)N * C);
    std::memcpy(d.inp.data(), inp.fp32, sizeof(float) * N * C);
    kept = k::GemmInput((const float*)d.inp.data());
  }
  // The buffers move with d, their data does not.
  const float* rows = regather ? local_rows : nullptr;
  d.add = [this, u, &w, b, bf16, kept_dout, kept, rows, N, C, OC](float* g) {
    const k::GemmInput in = rows ? k::GemmInput(gather_rows(rows, gathered_)) : kept;
    k::matmul_backward_weight(weight_grad(u, g, w), kept_dout, in, N, C, OC, precision_);
    if (b && !bf16) {  // fp32: the bias's gradient from the kept dout (bf16: added in B)
      k::matmul_backward(nullptr, k::GradOutput(static_cast<float*>(nullptr)), grad(u, g, *b), kept_dout.fp32, in,
                         k::GemmInput((const float*)nullptr), N, C, OC, precision_);
    }
  };
  pipeline_.weights().keep(std::move(d));
}

// Head: logits = lnf @ wte^T over this rank's vocabulary slice, then the final norm; leaves
// the gradient of the chunk's output in dresidual_. The embedding unit's gradient is
// complete for the micro-batch here unless this rank also runs the first stage.
void Gpt::head_backward(int c, int B, int T, float loss_scale) {
  const int N = B * T, C = config_.dim;
  const int E = layout_.has_untied_head() ? -1 : layout_.embedding_unit(), F = layout_.final_unit();
  // dlogits replace the logits in place: bf16 GEMMs get them already rounded (half the
  // bytes to read, no second rounding), others in fp32.
  k::GemmInput dlogits(set().logits);
  int ld = logits_ld();
  // The logits read, their gradient written in their place (16-bit words for bf16 GEMMs).
  std::optional<pf::Scope> ce(std::in_place, pf::Op::kCrossEntropy, 0,
                              (double)N * vn_ * (precision_ == k::Precision::kBf16 ? 6 : 8));
  if (precision_ == k::Precision::kBf16) {
    dlogits = k::GemmInput(k::crossentropy_backward_bf16_inplace(
        set().logits, set().lse, set().targets.data(), loss_scale, N, vn_, ld, vb_));
    ld *= 2;  // in 16-bit words
  } else {
    k::crossentropy_backward(set().logits, set().logits, set().lse, set().targets.data(), loss_scale,
                             N, vn_, ld, vb_);
  }
  // The head's weight: wte (tied, the embedding unit) or its own (the final norm's unit).
  const bool untied = layout_.has_untied_head();
  const int H = untied ? F : E;
  const ParamTensor& head = untied ? layout_.head() : layout_.wte();
  ce.reset();
  const float* hp = store_->acquire_params(H);
  float* hg = store_->acquire_grads(H);
  {
    const pf::Scope scope(pf::Op::kHead, 2.0 * N * C * vn_);
    k::gemm(precision_, false, false, N, C, vn_, 1.0f, dlogits, ld, gemm_weight(H, hp, head), C, 0.0f, partial_, C);
  }
  const float* dlnf = reduce_rows(partial_, dln_);  // f on the head's input
  // The head's weight gradient reads dlogits and lnf_full, both in the set, kept until W
  // (checked below: a copy would be N x vocabulary).
  const float* lnf = set().lnf_full;
  auto head_weight = [this, dlogits, ld, lnf, N, C](float* dst) {
    const pf::Scope scope(pf::Op::kHead, 2.0 * N * C * vn_);
    k::gemm(precision_, true, false, vn_, C, N, 1.0f, dlogits, ld, lnf, C, 1.0f, dst, C);
  };
  const bool defer_head = pipeline_.weights().deferring() && (untied || !layout_.has_layer(0));
  if (defer_head) {
    CHECK(set().holds(lnf) && set().holds(dlogits.bf16 ? (const void*)dlogits.bf16 : (const void*)dlogits.fp32));
    DeferredWeights::Work d;
    d.unit = H;
    d.add = [this, head_weight, H, tensor = &head](float* g) { head_weight(grad(H, g, *tensor)); };
    pipeline_.weights().keep(std::move(d));
  } else if (pipeline_.tied_head().separate()) {
    head_weight(pipeline_.tied_head().sum(head.numel));
  } else {
    head_weight(grad(H, hg, head));
  }
  if (!untied) {
    store_->release_params(E);
    // Else embedding_backward() does, or the W after the head's weight gradient.
    if (!layout_.has_layer(0) && !defer_head) store_->release_grads(E);
  }

  std::memset(dresidual_, 0, sizeof(float) * Nl_ * C);
  const float* fin = untied ? hp : store_->acquire_params(F);
  float* gfin = untied ? hg : store_->acquire_grads(F);
  norm_backward_tp(dresidual_, grad(F, gfin, layout_.lnf_w()),
                   layout_.has_lnf_b() ? grad(F, gfin, layout_.lnf_b()) : nullptr, dlnf,
                   set().blocks.back().residual3, param(F, fin, layout_.lnf_w()), set().lnf_mean, set().lnf_rstd,
                   Nl_);
  store_->release_params(F);
  if (!(untied && defer_head)) store_->release_grads(F);  // else the W after the head's
}

// The embedding's gradient is whole on every tp rank (after gathering the rows): each rank
// adds its vocabulary rows and all of dwpe.
void Gpt::embedding_backward(int B, int T) {
  const int E = layout_.embedding_unit();
  const pf::Scope scope(pf::Op::kEmbedding, 0, 8.0 * B * T * config_.dim);
  float* gemb = store_->acquire_grads(E);
  float* gwte = grad(E, gemb, layout_.wte());
  k::encoder_backward(gwte, layout_.has_wpe() ? grad(E, gemb, layout_.wpe()) : nullptr,
                      gather_rows(dropout_grad(dresidual_, 0), gathered_), set().inputs.data(), B,
                      T, config_.dim, vb_, Vl_, row_positions());
  if (pipeline_.tied_head().separate()) pipeline_.tied_head().join(set().micro_batch, gwte);
  store_->release_grads(E);
}

void Gpt::backward_chunk(int c, int mb, const float* dout, float loss_scale, bool defer_weights) {
  const int B = B_, T = T_;
  cur_chunk_ = c;
  loss_scale_ = loss_scale;
  pipeline_.sets().use(c, mb);
  pipeline_.weights().begin_backward(c, mb, defer_weights);
  store_->begin_pass(Pass::kBackward);
  if (is_last_stage(c)) {
    CHECK_MSG(!set().targets.empty(), "backward of a forward that computed no loss");
    head_backward(c, B, T, loss_scale);
  } else if (dout != dresidual_) {  // the next chunk on this rank leaves it in place
    std::memcpy(dresidual_, dout, sizeof(float) * local_boundary_elements(B, T));
  }
  const ModelPart::Chunk& ch = chunks_[c];
  for (int l = ch.end - 1; l >= ch.begin; l--)
    block_backward(l, l == ch.begin ? set().input : acts(l - 1).residual3, B, T);
  if (is_first_stage(c)) embedding_backward(B, T);
  pipeline_.weights().end_backward();
  if (!defer_weights) pipeline_.sets().release(c, mb);
}

void Gpt::backward(float loss_scale) {
  CHECK_MSG(layout_.holds_every_layer(), "backward() runs the whole model; use backward_chunk()");
  backward_chunk(0, 0, nullptr, loss_scale);
}

// Sites: 0 the embedding, 1 + 2l block l's attention branch, 2 + 2l its MLP branch.
void Gpt::dropout(float* x, int rows, int site) const {
  if (dropout_p_ <= 0) return;
  const uint64_t key = dropout_seed_ * 0x9E3779B97F4A7C15ull ^ (uint64_t)set().step * 0xC2B2AE3D27D4EB4Full ^
                       (uint64_t)site * 0x165667B19E3779F9ull;
  // This rank's residual rows start at its share of the micro-batch under sequence parallelism.
  const int64_t first = sp_ ? (int64_t)tp_rank_ * Nl_ : 0, C = config_.dim;
  if (!cp_) return k::dropout_forward(x, rows, (int)C, dropout_p_, key, set().first_token_row + first);
  // Under cp a rank's rows of each sequence are chunks of it: each run of them takes the
  // masks of its rows' places in the whole micro-batch, so that every layout drops what one
  // rank drops.
  const CpSplit& split = set().split;
  const int Tl = T_, T = T_ * cp_->size(), c = split.chunk(T);
  for (int64_t i = first; i < first + rows;) {
    const int64_t b = i / Tl;
    const int t = (int)(i % Tl);
    const int64_t end = std::min<int64_t>(first + rows, b * Tl + (t / c + 1) * c);
    const int64_t row0 = set().first_token_row + b * T + split.sequence_index(t, T, (int)b);
    k::dropout_forward(x + (i - first) * C, (int)(end - i), (int)C, dropout_p_, key, row0);
    i = end;
  }
}

const float* Gpt::dropout_grad(const float* dresidual, int site) {
  if (dropout_p_ <= 0) return dresidual;
  const pf::Scope scope(pf::Op::kResidual, 0, 8.0 * Nl_ * config_.dim);
  std::memcpy(dbranch_, dresidual, sizeof(float) * Nl_ * config_.dim);
  dropout(dbranch_, Nl_, site);
  return dbranch_;
}

int64_t Gpt::stored_activation_bytes(int B, int T) {
  ensure_activations(B, T / cp_size());
  int64_t bytes = shared_activation_bytes() - (int64_t)sizeof(float) * inventory_.gradient_scratch;
  for (int c = 0; c < num_chunks(); c++) bytes += activation_set_bytes(c);
  return bytes;
}

void Gpt::zero_grads() { zero_bytes(grads(), sizeof(float) * layout_.total()); }

// An untied embedding table is only looked up (no multiply): it is left out of N, so MFU
// counts the work the model does (a tied wte is the head's GEMM weight and counts).
double Gpt::flops_per_token(int T) const {
  const double lookup_only = config_.tied_head ? 0.0 : (double)config_.vocab * config_.dim;
  // An MoE model counts the parameters a token uses (its top-k experts, not all of them).
  return 6.0 * ((double)num_active_parameters(config_) - lookup_only) + 6.0 * config_.layers * (double)T * config_.dim;
}

}  // namespace meshtrain::model
