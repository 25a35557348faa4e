#include "model/gpt.h"

#include <cmath>
#include <cstring>
#include <random>

#include "core/check.h"
#include "kernels/ops.h"

namespace meshtrain::model {

namespace k = meshtrain::kernels;

Gpt::Gpt(const GptConfig& config, LocalState local) : config_(config), layout_(config) {
  if (local != LocalState::kNone)
    local_ = std::make_unique<LocalParamStore>(layout_, local == LocalState::kParamsAndGrads);
  store_ = local_.get();
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

void Gpt::init_weights(uint64_t seed) {
  std::mt19937_64 rng(seed);
  const float residual_std = 0.02f / std::sqrt(2.0f * config_.layers);
  float* p = params();
  std::memset(p, 0, sizeof(float) * layout_.total());
  for (const ParamTensor& t : layout_.tensors()) {
    float* w = p + t.offset;
    if (t.shape.size() == 1) {
      bool is_norm_weight = t.name.find("ln_") != std::string::npos &&
                            t.name.ends_with(".weight");
      if (is_norm_weight) std::fill(w, w + t.numel, 1.0f);
      continue;  // biases stay zero
    }
    bool residual_proj = t.name.ends_with("c_proj.weight");
    std::normal_distribution<float> dist(0.0f, residual_proj ? residual_std : 0.02f);
    size_t n = t.numel;
    if (&t == &layout_.wte()) n = (size_t)config_.vocab * config_.dim;  // padding stays zero
    for (size_t i = 0; i < n; i++) w[i] = dist(rng);
  }
}

void Gpt::ensure_activations(int B, int T) {
  CHECK_MSG(T <= config_.max_seq_len, "sequence longer than the position embedding");
  if (B == B_ && T == T_) return;
  B_ = B, T_ = T;
  const size_t N = (size_t)B * T, C = config_.dim, NH = config_.heads, Vp = config_.padded_vocab();
  const size_t per_block = N * C * 16 + N * 4 + N * NH;  // see BlockActivations
  const size_t total = N * C + config_.layers * per_block + N * C + 2 * N + N * Vp + N;
  acts_.allocate(MemCategory::kActivations, total);
  float* cursor = acts_.data();
  auto take = [&](size_t n) {
    float* p = cursor;
    cursor += n;
    return p;
  };
  encoded_ = take(N * C);
  blocks_.resize(config_.layers);
  for (auto& a : blocks_) {
    a.ln1 = take(N * C), a.ln1_mean = take(N), a.ln1_rstd = take(N);
    a.qkv = take(N * 3 * C), a.atty = take(N * C), a.att_lse = take(N * NH);
    a.residual2 = take(N * C), a.ln2 = take(N * C), a.ln2_mean = take(N), a.ln2_rstd = take(N);
    a.fch = take(N * 4 * C), a.fch_gelu = take(N * 4 * C), a.residual3 = take(N * C);
  }
  lnf_ = take(N * C), lnf_mean_ = take(N), lnf_rstd_ = take(N);
  logits_ = take(N * Vp);
  lse_ = take(N);
  CHECK(cursor == acts_.data() + total);
  losses_.allocate(MemCategory::kActivations, N);

  // Backward scratch: gradients w.r.t. the residual stream and one block's intermediates.
  grad_acts_.allocate(MemCategory::kActivations, N * C * 4 + N * 3 * C + N * 4 * C * 2);
  cursor = grad_acts_.data();
  dresidual_ = take(N * C), dln_ = take(N * C), datty_ = take(N * C), dqkv_ = take(N * 3 * C);
  dfch_ = take(N * 4 * C), dfch_gelu_ = take(N * 4 * C);
}

void Gpt::block_forward(int l, const float* residual, int B, int T) {
  const int N = B * T, C = config_.dim, NH = config_.heads;
  const int u = ParamLayout::block_unit(l);
  const float* unit = store_->acquire_params(u);
  auto W = [&](LayerTensor t) { return tensor(unit, layout_.layer(l, t)); };
  BlockActivations& a = blocks_[l];
  k::layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, residual, W(kLn1W), W(kLn1B), N, C);
  k::matmul_forward(a.qkv, a.ln1, W(kQkvW), W(kQkvB), N, C, 3 * C);
  k::attention_forward(a.atty, a.att_lse, a.qkv, B, T, C, NH);
  // residual2 temporarily holds the attention projection, then the residual sum.
  k::matmul_forward(a.residual2, a.atty, W(kAttProjW), W(kAttProjB), N, C, C);
  k::residual_forward(a.residual2, a.residual2, residual, (size_t)N * C);
  k::layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.residual2, W(kLn2W), W(kLn2B), N, C);
  k::matmul_forward(a.fch, a.ln2, W(kFcW), W(kFcB), N, C, 4 * C);
  k::gelu_forward(a.fch_gelu, a.fch, (size_t)N * 4 * C);
  k::matmul_forward(a.residual3, a.fch_gelu, W(kFcProjW), W(kFcProjB), N, 4 * C, C);
  k::residual_forward(a.residual3, a.residual3, a.residual2, (size_t)N * C);
  store_->release_params(u);
}

void Gpt::forward_to_lnf(const int* inputs, int B, int T) {
  CHECK_MSG(store_, "no parameter store");
  ensure_activations(B, T);
  const int N = B * T, C = config_.dim;
  inputs_.assign(inputs, inputs + N);
  const int E = ParamLayout::kEmbeddingUnit, F = layout_.final_unit();
  store_->begin_pass(Pass::kForward);
  const float* emb = store_->acquire_params(E);
  const float* wte = tensor(emb, layout_.wte());
  k::encoder_forward(encoded_, inputs, wte, tensor(emb, layout_.wpe()), B, T, C);
  const float* residual = encoded_;
  for (int l = 0; l < config_.layers; l++) {
    block_forward(l, residual, B, T);
    residual = blocks_[l].residual3;
  }
  const float* fin = store_->acquire_params(F);
  k::layernorm_forward(lnf_, lnf_mean_, lnf_rstd_, residual, tensor(fin, layout_.lnf_w()),
                       tensor(fin, layout_.lnf_b()), N, C);
  store_->release_params(F);
  // Tied LM head over the real vocabulary only: logits[N, V] with row stride Vp.
  k::gemm(false, true, N, config_.vocab, C, 1.0f, lnf_, C, wte, C, 0.0f, logits_,
          config_.padded_vocab());
  store_->release_params(E);
}

const float* Gpt::forward_logits(const int* inputs, int B, int T) {
  forward_to_lnf(inputs, B, T);
  return logits_;
}

float Gpt::forward(const int* inputs, const int* targets, int B, int T) {
  forward_to_lnf(inputs, B, T);
  const int N = B * T;
  targets_.assign(targets, targets + N);
  k::crossentropy_forward(losses_.data(), lse_, logits_, targets, N, config_.vocab,
                          config_.padded_vocab());
  double sum = 0;
  for (int i = 0; i < N; i++) sum += losses_[i];
  return static_cast<float>(sum / N);
}

void Gpt::block_backward(int l, const float* block_in, int B, int T) {
  const int N = B * T, C = config_.dim, NH = config_.heads;
  const int u = ParamLayout::block_unit(l);
  const float* unit = store_->acquire_params(u);
  float* gunit = store_->acquire_grads(u);
  auto W = [&](LayerTensor t) { return tensor(unit, layout_.layer(l, t)); };
  auto G = [&](LayerTensor t) { return tensor(gunit, layout_.layer(l, t)); };
  BlockActivations& a = blocks_[l];
  // MLP: dresidual is d(residual3); it passes unchanged to residual2 via the skip.
  k::matmul_backward(dfch_gelu_, G(kFcProjW), G(kFcProjB), dresidual_, a.fch_gelu, W(kFcProjW), N,
                     4 * C, C);
  k::gelu_backward(dfch_, a.fch, dfch_gelu_, (size_t)N * 4 * C);
  k::matmul_backward(dln_, G(kFcW), G(kFcB), dfch_, a.ln2, W(kFcW), N, C, 4 * C);
  k::layernorm_backward(dresidual_, G(kLn2W), G(kLn2B), dln_, a.residual2, W(kLn2W), a.ln2_mean,
                        a.ln2_rstd, N, C);
  // Attention: dresidual is now d(residual2).
  k::matmul_backward(datty_, G(kAttProjW), G(kAttProjB), dresidual_, a.atty, W(kAttProjW), N, C, C);
  k::attention_backward(dqkv_, datty_, a.qkv, a.atty, a.att_lse, B, T, C, NH);
  k::matmul_backward(dln_, G(kQkvW), G(kQkvB), dqkv_, a.ln1, W(kQkvW), N, C, 3 * C);
  k::layernorm_backward(dresidual_, G(kLn1W), G(kLn1B), dln_, block_in, W(kLn1W), a.ln1_mean,
                        a.ln1_rstd, N, C);
  store_->release_params(u);
  store_->release_grads(u);
}

void Gpt::backward(float loss_scale) {
  CHECK_MSG(!targets_.empty(), "backward() without forward()");
  const int B = B_, T = T_, N = B * T, C = config_.dim;
  const int V = config_.vocab, Vp = config_.padded_vocab();
  const int E = ParamLayout::kEmbeddingUnit, F = layout_.final_unit();

  // Head: logits = lnf @ wte^T.
  store_->begin_pass(Pass::kBackward);
  float* dlogits = logits_;  // in place
  k::crossentropy_backward(dlogits, logits_, lse_, targets_.data(), loss_scale, N, V, Vp);
  const float* emb = store_->acquire_params(E);
  float* gemb = store_->acquire_grads(E);
  float* dwte = tensor(gemb, layout_.wte());
  k::gemm(false, false, N, C, V, 1.0f, dlogits, Vp, tensor(emb, layout_.wte()), C, 0.0f, dln_, C);
  k::gemm(true, false, V, C, N, 1.0f, dlogits, Vp, lnf_, C, 1.0f, dwte, C);
  store_->release_params(E);

  std::memset(dresidual_, 0, sizeof(float) * N * C);
  const float* last = config_.layers > 0 ? blocks_.back().residual3 : encoded_;
  const float* fin = store_->acquire_params(F);
  float* gfin = store_->acquire_grads(F);
  k::layernorm_backward(dresidual_, tensor(gfin, layout_.lnf_w()), tensor(gfin, layout_.lnf_b()),
                        dln_, last, tensor(fin, layout_.lnf_w()), lnf_mean_, lnf_rstd_, N, C);
  store_->release_params(F);
  store_->release_grads(F);

  for (int l = config_.layers - 1; l >= 0; l--)
    block_backward(l, l == 0 ? encoded_ : blocks_[l - 1].residual3, B, T);

  gemb = store_->acquire_grads(E);
  k::encoder_backward(tensor(gemb, layout_.wte()), tensor(gemb, layout_.wpe()), dresidual_,
                      inputs_.data(), B, T, C);
  store_->release_grads(E);
}

void Gpt::zero_grads() { std::memset(grads(), 0, sizeof(float) * layout_.total()); }

double Gpt::flops_per_token(int T) const {
  return 6.0 * (double)num_parameters(config_) +
         6.0 * config_.layers * (double)T * config_.dim;
}

}  // namespace meshtrain::model
