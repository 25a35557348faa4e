#include "model/initial_weights.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"

namespace meshtrain::model {

void draw_initial_tensor(const GptConfig& c, const ParamLayout& layout, const ParamTensor& t,
                         std::mt19937_64& rng, float* w) {
  std::fill(w, w + t.numel, 0.0f);
  if (t.shape.size() == 1) {
    if (t.name.ends_with(".weight")) std::fill(w, w + t.numel, 1.0f);  // a norm's weight
    return;  // biases stay zero
  }
  const float residual_std = 0.02f / std::sqrt(2.0f * c.layers);
  // The projections that write the residual stream: attention's, the MLP's (dense, shared
  // experts, and every routed expert's w2).
  auto is = [&](LayerTensor k) { return layout.has(t.layer, k) && &t == &layout.layer(t.layer, k); };
  const bool residual_proj =
      t.layer >= 0 && (is(kAttProjW) || is(kFcProjW) || is(kSharedProjW) ||
                       (t.expert >= 0 && &t == &layout.expert_proj(t.layer, t.expert - layout.first_expert())));
  std::normal_distribution<float> dist(0.0f, residual_proj ? residual_std : 0.02f);
  size_t n = t.numel;
  if (t.vocabulary_rows()) n = (size_t)c.vocab * c.dim;  // wte, lm_head: padding stays zero
  for (size_t i = 0; i < n; i++) w[i] = dist(rng);
}

InitialWeights::InitialWeights(const GptConfig& config, uint64_t seed)
    : config_(config), seed_(seed), whole_(config), rng_(seed) {}

void InitialWeights::draw_until(size_t index) {
  if (index < next_) rng_.seed(seed_), next_ = 0;  // behind the generator: start again
  for (; next_ <= index; next_++) {
    const ParamTensor& t = whole_.tensors()[next_];
    scratch_.resize(t.numel);
    draw_initial_tensor(config_, whole_, t, rng_, scratch_.data());
  }
}

void InitialWeights::unit(const ParamLayout& layout, int u, float* out) {
  for (const ParamTensor& t : layout.tensors()) {
    if (layout.unit_of(t) != u) continue;
    const ParamTensor* w = whole_.find(t.name);
    CHECK_MSG(w, "InitialWeights: a tensor the whole model does not have");
    draw_until((size_t)(w - whole_.tensors().data()));  // scratch_ holds tensor w now
    global_to_local(t, layout.tp(), layout.tp_rank(), scratch_.data(), out + layout.offset_in_unit(t));
  }
}

}  // namespace meshtrain::model
