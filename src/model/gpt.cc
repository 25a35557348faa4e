#include "model/gpt.h"

#include <cmath>
#include <cstring>
#include <random>

#include "core/check.h"
#include "kernels/ops.h"

namespace meshtrain::model {

namespace k = meshtrain::kernels;

Gpt::Gpt(const GptConfig& config)
    : config_(config),
      layout_(config),
      params_(MemCategory::kParams, layout_.total()),
      grads_(MemCategory::kGrads, layout_.total()) {}

void Gpt::init_weights(uint64_t seed) {
  std::mt19937_64 rng(seed);
  const float residual_std = 0.02f / std::sqrt(2.0f * config_.layers);
  float* p = params_.data();
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

void Gpt::forward_to_lnf(const int* inputs, int B, int T) {
  ensure_activations(B, T);
  const int N = B * T, C = config_.dim, NH = config_.heads;
  const float* p = params_.data();
  auto W = [&](int l, LayerTensor t) { return p + layout_.layer(l, t).offset; };
  inputs_.assign(inputs, inputs + N);

  k::encoder_forward(encoded_, inputs, p + layout_.wte().offset, p + layout_.wpe().offset, B, T, C);
  const float* residual = encoded_;
  for (int l = 0; l < config_.layers; l++) {
    BlockActivations& a = blocks_[l];
    k::layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, residual, W(l, kLn1W), W(l, kLn1B), N, C);
    k::matmul_forward(a.qkv, a.ln1, W(l, kQkvW), W(l, kQkvB), N, C, 3 * C);
    k::attention_forward(a.atty, a.att_lse, a.qkv, B, T, C, NH);
    // residual2 temporarily holds the attention projection, then the residual sum.
    k::matmul_forward(a.residual2, a.atty, W(l, kAttProjW), W(l, kAttProjB), N, C, C);
    k::residual_forward(a.residual2, a.residual2, residual, (size_t)N * C);
    k::layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.residual2, W(l, kLn2W), W(l, kLn2B), N, C);
    k::matmul_forward(a.fch, a.ln2, W(l, kFcW), W(l, kFcB), N, C, 4 * C);
    k::gelu_forward(a.fch_gelu, a.fch, (size_t)N * 4 * C);
    k::matmul_forward(a.residual3, a.fch_gelu, W(l, kFcProjW), W(l, kFcProjB), N, 4 * C, C);
    k::residual_forward(a.residual3, a.residual3, a.residual2, (size_t)N * C);
    residual = a.residual3;
  }
  k::layernorm_forward(lnf_, lnf_mean_, lnf_rstd_, residual, p + layout_.lnf_w().offset,
                       p + layout_.lnf_b().offset, N, C);
  // Tied LM head over the real vocabulary only: logits[N, V] with row stride Vp.
  k::gemm(false, true, N, config_.vocab, C, 1.0f, lnf_, C, p + layout_.wte().offset, C, 0.0f,
          logits_, config_.padded_vocab());
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

void Gpt::backward(float loss_scale) {
  CHECK_MSG(!targets_.empty(), "backward() without forward()");
  const int B = B_, T = T_, N = B * T, C = config_.dim, NH = config_.heads;
  const int V = config_.vocab, Vp = config_.padded_vocab();
  const float* p = params_.data();
  float* g = grads_.data();
  auto W = [&](int l, LayerTensor t) { return p + layout_.layer(l, t).offset; };
  auto G = [&](int l, LayerTensor t) { return g + layout_.layer(l, t).offset; };

  float* dlogits = logits_;  // in place
  k::crossentropy_backward(dlogits, logits_, lse_, targets_.data(), loss_scale, N, V, Vp);
  float* dwte = g + layout_.wte().offset;
  k::gemm(false, false, N, C, V, 1.0f, dlogits, Vp, p + layout_.wte().offset, C, 0.0f, dln_, C);
  k::gemm(true, false, V, C, N, 1.0f, dlogits, Vp, lnf_, C, 1.0f, dwte, C);

  std::memset(dresidual_, 0, sizeof(float) * N * C);
  const float* last = config_.layers > 0 ? blocks_.back().residual3 : encoded_;
  k::layernorm_backward(dresidual_, g + layout_.lnf_w().offset, g + layout_.lnf_b().offset, dln_,
                        last, p + layout_.lnf_w().offset, lnf_mean_, lnf_rstd_, N, C);

  for (int l = config_.layers - 1; l >= 0; l--) {
    BlockActivations& a = blocks_[l];
    const float* block_in = l == 0 ? encoded_ : blocks_[l - 1].residual3;
    // MLP: dresidual is d(residual3); it passes unchanged to residual2 via the skip.
    k::matmul_backward(dfch_gelu_, G(l, kFcProjW), G(l, kFcProjB), dresidual_, a.fch_gelu,
                       W(l, kFcProjW), N, 4 * C, C);
    k::gelu_backward(dfch_, a.fch, dfch_gelu_, (size_t)N * 4 * C);
    k::matmul_backward(dln_, G(l, kFcW), G(l, kFcB), dfch_, a.ln2, W(l, kFcW), N, C, 4 * C);
    k::layernorm_backward(dresidual_, G(l, kLn2W), G(l, kLn2B), dln_, a.residual2, W(l, kLn2W),
                          a.ln2_mean, a.ln2_rstd, N, C);
    // Attention: dresidual is now d(residual2).
    k::matmul_backward(datty_, G(l, kAttProjW), G(l, kAttProjB), dresidual_, a.atty,
                       W(l, kAttProjW), N, C, C);
    k::attention_backward(dqkv_, datty_, a.qkv, a.atty, a.att_lse, B, T, C, NH);
    k::matmul_backward(dln_, G(l, kQkvW), G(l, kQkvB), dqkv_, a.ln1, W(l, kQkvW), N, C, 3 * C);
    k::layernorm_backward(dresidual_, G(l, kLn1W), G(l, kLn1B), dln_, block_in, W(l, kLn1W),
                          a.ln1_mean, a.ln1_rstd, N, C);
  }
  k::encoder_backward(dwte, g + layout_.wpe().offset, dresidual_, inputs_.data(), B, T, C);
}

void Gpt::zero_grads() { std::memset(grads_.data(), 0, sizeof(float) * layout_.total()); }

double Gpt::flops_per_token(int T) const {
  return 6.0 * (double)num_parameters(config_) +
         6.0 * config_.layers * (double)T * config_.dim;
}

}  // namespace meshtrain::model
