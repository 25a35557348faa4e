#include "model/param_layout.h"

namespace meshtrain::model {

ParamLayout::ParamLayout(const GptConfig& c) {
  const int64_t C = c.dim;
  add("wte.weight", {c.padded_vocab(), C}, true, false, -1);
  add("wpe.weight", {c.max_seq_len, C}, true, false, -1);
  for (int l = 0; l < c.layers; l++) {
    const std::string p = "h." + std::to_string(l) + ".";
    add(p + "ln_1.weight", {C}, false, false, l);
    add(p + "ln_1.bias", {C}, false, false, l);
    add(p + "attn.c_attn.weight", {3 * C, C}, true, true, l);
    add(p + "attn.c_attn.bias", {3 * C}, false, false, l);
    add(p + "attn.c_proj.weight", {C, C}, true, true, l);
    add(p + "attn.c_proj.bias", {C}, false, false, l);
    add(p + "ln_2.weight", {C}, false, false, l);
    add(p + "ln_2.bias", {C}, false, false, l);
    add(p + "mlp.c_fc.weight", {4 * C, C}, true, true, l);
    add(p + "mlp.c_fc.bias", {4 * C}, false, false, l);
    add(p + "mlp.c_proj.weight", {C, 4 * C}, true, true, l);
    add(p + "mlp.c_proj.bias", {C}, false, false, l);
  }
  add("ln_f.weight", {C}, false, false, -1);
  add("ln_f.bias", {C}, false, false, -1);
  // Units follow from the order above: [wte, wpe], each block's 12 tensors, [ln_f].
  units_.push_back({0, wte().numel + wpe().numel});
  for (int l = 0; l < c.layers; l++) {
    const ParamTensor& first = layer(l, kLn1W);
    const ParamTensor& last = layer(l, kFcProjB);
    units_.push_back({first.offset, last.offset + last.numel - first.offset});
  }
  units_.push_back({lnf_w().offset, lnf_w().numel + lnf_b().numel});
}

int ParamLayout::unit_of(const ParamTensor& t) const {
  if (t.layer >= 0) return block_unit(t.layer);
  return t.offset < units_[0].numel ? kEmbeddingUnit : final_unit();
}

size_t ParamLayout::offset_in_unit(const ParamTensor& t) const {
  return t.offset - units_[unit_of(t)].offset;
}

void ParamLayout::add(std::string name, std::vector<int64_t> shape, bool decay, bool hf_transposed,
                      int layer) {
  ParamTensor t;
  t.name = std::move(name);
  t.numel = 1;
  for (int64_t d : shape) t.numel *= (size_t)d;
  t.shape = std::move(shape);
  t.offset = total_;
  t.decay = decay;
  t.hf_transposed = hf_transposed;
  t.layer = layer;
  total_ += t.numel;
  tensors_.push_back(std::move(t));
}

const ParamTensor* ParamLayout::find(const std::string& name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

}  // namespace meshtrain::model
