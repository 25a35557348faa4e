#include "infer/decoder.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/check.h"
#include "kernels/ops.h"

namespace meshtrain::infer {

namespace k = meshtrain::kernels;
using model::LayerTensor;

KvCacheDecoder::KvCacheDecoder(const model::Gpt& gpt)
    : gpt_(gpt),
      k_cache_(MemCategory::kActivations,
               (size_t)gpt.config().layers * gpt.config().max_seq_len * gpt.config().kv_dim()),
      v_cache_(MemCategory::kActivations, k_cache_.size()),
      logits_(MemCategory::kActivations, gpt.config().vocab) {}

void KvCacheDecoder::embed(std::span<const int> tokens, float* x) const {
  const int C = gpt_.config().dim;
  const float* wte = gpt_.params() + gpt_.layout().wte().offset;
  const float* wpe = gpt_.layout().has_wpe() ? gpt_.params() + gpt_.layout().wpe().offset : nullptr;
  for (size_t i = 0; i < tokens.size(); i++)
    for (int c = 0; c < C; c++)
      x[i * C + c] = wte[(size_t)tokens[i] * C + c] + (wpe ? wpe[(pos_ + i) * C + c] : 0.0f);
}

void KvCacheDecoder::norm(float* out, const float* x, const float* w, const float* b, int n) const {
  const auto& cfg = gpt_.config();
  std::vector<float> mean(n), rstd(n);
  if (cfg.norm == model::Norm::kRmsNorm) k::rmsnorm_forward(out, rstd.data(), x, w, n, cfg.dim, cfg.norm_eps);
  else k::layernorm_forward(out, mean.data(), rstd.data(), x, w, b, n, cfg.dim);
}

// One transformer block on n rows at positions pos_.., appending their keys and values.
void KvCacheDecoder::block(int l, float* x, int n) {
  const auto& cfg = gpt_.config();
  const int C = cfg.dim, NH = cfg.heads, NKV = cfg.kv_head_count(), KV = cfg.kv_dim(), Q = cfg.qkv_dim();
  const int F = cfg.ffn(), Fc = cfg.fc_dim(), hs = cfg.head_dim();
  const auto& layout = gpt_.layout();
  auto W = [&](LayerTensor t) { return layout.has(l, t) ? gpt_.params() + layout.layer(l, t).offset : nullptr; };
  std::vector<float> ln((size_t)n * C), qkv((size_t)n * Q), att((size_t)n * C), proj((size_t)n * C),
      h((size_t)n * Fc), hg((size_t)n * F);
  float* kc = k_cache_.data() + (size_t)l * cfg.max_seq_len * KV;
  float* vc = v_cache_.data() + (size_t)l * cfg.max_seq_len * KV;

  norm(ln.data(), x, W(model::kLn1W), W(model::kLn1B), n);
  k::matmul_forward(qkv.data(), ln.data(), W(model::kQkvW), W(model::kQkvB), n, C, Q);
  if (cfg.positions == model::Positions::kRope) {  // rows at positions pos_ .. pos_ + n - 1
    k::rope_rotate(qkv.data(), n, n, Q, NH, hs, gpt_.rope_cos(), gpt_.rope_sin(), pos_, false);
    k::rope_rotate(qkv.data() + C, n, n, Q, NKV, hs, gpt_.rope_cos(), gpt_.rope_sin(), pos_, false);
  }
  for (int i = 0; i < n; i++) {
    std::memcpy(kc + (size_t)(pos_ + i) * KV, qkv.data() + (size_t)i * Q + C, KV * sizeof(float));
    std::memcpy(vc + (size_t)(pos_ + i) * KV, qkv.data() + (size_t)i * Q + C + KV, KV * sizeof(float));
  }
  k::attention_cached_forward(att.data(), qkv.data(), Q, kc, vc, pos_, n, C, NH, NKV);
  k::matmul_forward(proj.data(), att.data(), W(model::kAttProjW), W(model::kAttProjB), n, C, C);
  k::residual_forward(x, x, proj.data(), (size_t)n * C);
  norm(ln.data(), x, W(model::kLn2W), W(model::kLn2B), n);
  if (cfg.is_moe_layer(l)) {
    moe_mlp(l, ln.data(), n, proj.data());
    k::residual_forward(x, x, proj.data(), (size_t)n * C);
    return;
  }
  k::matmul_forward(h.data(), ln.data(), W(model::kFcW), W(model::kFcB), n, C, Fc);
  if (cfg.mlp == model::Mlp::kSwiGlu) k::swiglu_forward(hg.data(), h.data(), n, F);
  else k::gelu_forward(hg.data(), h.data(), (size_t)n * F);
  k::matmul_forward(proj.data(), hg.data(), W(model::kFcProjW), W(model::kFcProjB), n, F, C);
  k::residual_forward(x, x, proj.data(), (size_t)n * C);
}

// An MoE layer's MLP on n rows, as training routes them without capacity (inference drops
// nothing): each row's chosen experts, weighted, plus the shared experts.
void KvCacheDecoder::moe_mlp(int l, const float* ln, int n, float* out) const {
  const auto& cfg = gpt_.config();
  const auto& layout = gpt_.layout();
  const int C = cfg.dim, E = cfg.moe.experts, k = cfg.moe.top_k, Fe = cfg.expert_ffn(), Fce = cfg.expert_fc_dim();
  const float* p = gpt_.params();
  std::vector<float> logits((size_t)n * E), weight((size_t)n * k);
  std::vector<int> expert((size_t)n * k), slot((size_t)n * k), order((size_t)n * k), offsets(E + 1);
  k::matmul_forward(logits.data(), ln, p + layout.layer(l, model::kRouterW).offset, nullptr, n, C, E);
  model::MoeRoute route{expert.data(), weight.data(), slot.data(), order.data(), offsets.data()};
  model::MoeRouteStats unused;
  model::moe_route(cfg.moe, model::MoeTraining{0, 0, 0}, logits.data(), n, n, &route, &unused);
  auto mlp = [&](const float* fc, const float* proj, const float* in, int rows, int Fc, int F, float* y) {
    std::vector<float> h((size_t)rows * Fc), hg((size_t)rows * F);
    k::matmul_forward(h.data(), in, fc, nullptr, rows, C, Fc);
    if (cfg.mlp == model::Mlp::kSwiGlu) k::swiglu_forward(hg.data(), h.data(), rows, F);
    else k::gelu_forward(hg.data(), h.data(), (size_t)rows * F);
    k::matmul_forward(y, hg.data(), proj, nullptr, rows, F, C);
  };
  std::fill(out, out + (size_t)n * C, 0.0f);
  if (layout.has(l, model::kSharedFcW)) {
    const int S = cfg.moe.shared_experts;
    mlp(p + layout.layer(l, model::kSharedFcW).offset, p + layout.layer(l, model::kSharedProjW).offset, ln, n,
        S * Fce, S * Fe, out);
  }
  std::vector<float> y(C);
  for (int i = 0; i < n * k; i++) {
    const int e = expert[i];
    mlp(p + layout.expert_fc(l, e).offset, p + layout.expert_proj(l, e).offset, ln + (size_t)(i / k) * C, 1, Fce, Fe,
        y.data());
    for (int c = 0; c < C; c++) out[(size_t)(i / k) * C + c] += weight[i] * y[c];
  }
}

const float* KvCacheDecoder::append(std::span<const int> tokens) {
  const auto& cfg = gpt_.config();
  const int n = (int)tokens.size(), C = cfg.dim;
  CHECK(n > 0 && pos_ + n <= cfg.max_seq_len);
  std::vector<float> x((size_t)n * C);
  embed(tokens, x.data());
  for (int l = 0; l < cfg.layers; l++) block(l, x.data(), n);
  // Only the last row's logits are needed.
  std::vector<float> ln(C);
  const float* p = gpt_.params();
  const auto& layout = gpt_.layout();
  norm(ln.data(), x.data() + (size_t)(n - 1) * C, p + layout.lnf_w().offset,
       layout.has_lnf_b() ? p + layout.lnf_b().offset : nullptr, 1);
  const auto& head = layout.has_untied_head() ? layout.head() : layout.wte();
  k::gemm(false, true, 1, cfg.vocab, C, 1.0f, ln.data(), C, p + head.offset, C, 0.0f, logits_.data(), cfg.vocab);
  pos_ += n;
  return logits_.data();
}

}  // namespace meshtrain::infer
