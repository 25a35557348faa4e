#include "infer/decoder.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "core/check.h"
#include "kernels/ops.h"

namespace meshtrain::infer {

namespace k = meshtrain::kernels;
using model::LayerTensor;

KvCacheDecoder::KvCacheDecoder(const model::Gpt& gpt)
    : gpt_(gpt),
      k_cache_(MemCategory::kActivations,
               (size_t)gpt.config().layers * gpt.config().max_seq_len * gpt.config().dim),
      v_cache_(MemCategory::kActivations, k_cache_.size()),
      logits_(MemCategory::kActivations, gpt.config().vocab) {}

void KvCacheDecoder::embed(std::span<const int> tokens, float* x) const {
  const int C = gpt_.config().dim;
  const float* wte = gpt_.params() + gpt_.layout().wte().offset;
  const float* wpe = gpt_.params() + gpt_.layout().wpe().offset;
  for (size_t i = 0; i < tokens.size(); i++)
    for (int c = 0; c < C; c++)
      x[i * C + c] = wte[(size_t)tokens[i] * C + c] + wpe[(pos_ + i) * C + c];
}

// One transformer block on n rows at positions pos_.., appending their keys and values.
void KvCacheDecoder::block(int l, float* x, int n) {
  const auto& cfg = gpt_.config();
  const int C = cfg.dim, NH = cfg.heads;
  auto W = [&](LayerTensor t) { return gpt_.params() + gpt_.layout().layer(l, t).offset; };
  std::vector<float> ln((size_t)n * C), mean(n), rstd(n), qkv((size_t)n * 3 * C),
      att((size_t)n * C), proj((size_t)n * C), h((size_t)n * 4 * C), hg((size_t)n * 4 * C);
  float* kc = k_cache_.data() + (size_t)l * cfg.max_seq_len * C;
  float* vc = v_cache_.data() + (size_t)l * cfg.max_seq_len * C;

  k::layernorm_forward(ln.data(), mean.data(), rstd.data(), x, W(model::kLn1W), W(model::kLn1B), n, C);
  k::matmul_forward(qkv.data(), ln.data(), W(model::kQkvW), W(model::kQkvB), n, C, 3 * C);
  for (int i = 0; i < n; i++) {
    std::memcpy(kc + (size_t)(pos_ + i) * C, qkv.data() + (size_t)i * 3 * C + C, C * sizeof(float));
    std::memcpy(vc + (size_t)(pos_ + i) * C, qkv.data() + (size_t)i * 3 * C + 2 * C, C * sizeof(float));
  }
  k::attention_cached_forward(att.data(), qkv.data(), 3 * C, kc, vc, pos_, n, C, NH, NH);
  k::matmul_forward(proj.data(), att.data(), W(model::kAttProjW), W(model::kAttProjB), n, C, C);
  k::residual_forward(x, x, proj.data(), (size_t)n * C);
  k::layernorm_forward(ln.data(), mean.data(), rstd.data(), x, W(model::kLn2W), W(model::kLn2B), n, C);
  k::matmul_forward(h.data(), ln.data(), W(model::kFcW), W(model::kFcB), n, C, 4 * C);
  k::gelu_forward(hg.data(), h.data(), (size_t)n * 4 * C);
  k::matmul_forward(proj.data(), hg.data(), W(model::kFcProjW), W(model::kFcProjB), n, 4 * C, C);
  k::residual_forward(x, x, proj.data(), (size_t)n * C);
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
  float mean, rstd;
  const float* p = gpt_.params();
  k::layernorm_forward(ln.data(), &mean, &rstd, x.data() + (size_t)(n - 1) * C,
                       p + gpt_.layout().lnf_w().offset, p + gpt_.layout().lnf_b().offset, 1, C);
  k::gemm(false, true, 1, cfg.vocab, C, 1.0f, ln.data(), C, p + gpt_.layout().wte().offset, C, 0.0f,
          logits_.data(), cfg.vocab);
  pos_ += n;
  return logits_.data();
}

int sample_token(const float* logits, int V, const SampleOptions& o, std::mt19937_64& rng) {
  if (o.temperature <= 0) return (int)(std::max_element(logits, logits + V) - logits);
  std::vector<int> ids(V);
  std::iota(ids.begin(), ids.end(), 0);
  int keep = (o.top_k > 0 && o.top_k < V) ? o.top_k : V;
  // Ties broken by id so the order, and hence the draw, is fully deterministic.
  auto by_logit = [&](int a, int b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  std::partial_sort(ids.begin(), ids.begin() + keep, ids.end(), by_logit);
  const float mx = logits[ids[0]];
  std::vector<double> w(keep);
  double sum = 0;
  for (int i = 0; i < keep; i++) sum += (w[i] = std::exp((logits[ids[i]] - mx) / o.temperature));
  // 53 random bits -> uniform in [0, 1): the same on every standard library.
  double u = (double)(rng() >> 11) * 0x1.0p-53 * sum;
  for (int i = 0; i < keep; i++) {
    if (u < w[i]) return ids[i];
    u -= w[i];
  }
  return ids[keep - 1];
}

}  // namespace meshtrain::infer
