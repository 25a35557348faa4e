#include "model/param_layout.h"

#include <algorithm>

namespace meshtrain::model {

ParamLayout::ParamLayout(const GptConfig& c, int tp, int tp_rank) : tp_(tp), tp_rank_(tp_rank) {
  using S = TpSplit;
  const int64_t C = c.dim;
  add("wte.weight", {c.padded_vocab(), C}, S::kRows, true, false, -1);
  add("wpe.weight", {c.max_seq_len, C}, S::kReplicated, true, false, -1);
  for (int l = 0; l < c.layers; l++) {
    const std::string p = "h." + std::to_string(l) + ".";
    add(p + "ln_1.weight", {C}, S::kReplicated, false, false, l);
    add(p + "ln_1.bias", {C}, S::kReplicated, false, false, l);
    add(p + "attn.c_attn.weight", {3 * C, C}, S::kQkvRows, true, true, l);
    add(p + "attn.c_attn.bias", {3 * C}, S::kQkvRows, false, false, l);
    add(p + "attn.c_proj.weight", {C, C}, S::kCols, true, true, l);
    add(p + "attn.c_proj.bias", {C}, S::kReplicated, false, false, l);
    add(p + "ln_2.weight", {C}, S::kReplicated, false, false, l);
    add(p + "ln_2.bias", {C}, S::kReplicated, false, false, l);
    add(p + "mlp.c_fc.weight", {4 * C, C}, S::kRows, true, true, l);
    add(p + "mlp.c_fc.bias", {4 * C}, S::kRows, false, false, l);
    add(p + "mlp.c_proj.weight", {C, 4 * C}, S::kCols, true, true, l);
    add(p + "mlp.c_proj.bias", {C}, S::kReplicated, false, false, l);
  }
  add("ln_f.weight", {C}, S::kReplicated, false, false, -1);
  add("ln_f.bias", {C}, S::kReplicated, false, false, -1);
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

void ParamLayout::add(std::string name, std::vector<int64_t> global_shape, TpSplit split,
                      bool decay, bool hf_transposed, int layer) {
  ParamTensor t;
  t.name = std::move(name);
  t.split = split;
  t.global_shape = global_shape;
  std::vector<int64_t> shape = global_shape;  // dims divisible by tp: validated by the caller
  if (split == TpSplit::kRows || split == TpSplit::kQkvRows) shape[0] /= tp_;
  if (split == TpSplit::kCols) shape[1] /= tp_;
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

namespace {

// Calls copy(global_offset, local_offset, count) for every contiguous run of rank r's part.
template <typename Copy>
void for_each_run(const ParamTensor& t, int tp, int r, Copy copy) {
  const auto& g = t.global_shape;
  const size_t cols = g.size() > 1 ? (size_t)g[1] : 1;
  switch (t.split) {
    case TpSplit::kReplicated:
      copy(0, 0, t.numel);
      return;
    case TpSplit::kRows: {
      const size_t rows = (size_t)g[0] / tp;
      copy((size_t)r * rows * cols, 0, rows * cols);
      return;
    }
    case TpSplit::kQkvRows: {  // [q; k; v] blocks of g[0]/3 rows each
      const size_t block = (size_t)g[0] / 3, rows = block / tp;
      for (size_t j = 0; j < 3; j++)
        copy((j * block + r * rows) * cols, j * rows * cols, rows * cols);
      return;
    }
    case TpSplit::kCols: {
      const size_t local_cols = cols / tp;
      for (size_t row = 0; row < (size_t)g[0]; row++)
        copy(row * cols + r * local_cols, row * local_cols, local_cols);
      return;
    }
  }
}

}  // namespace

void global_to_local(const ParamTensor& t, int tp, int tp_rank, const float* global, float* local) {
  for_each_run(t, tp, tp_rank, [&](size_t g, size_t l, size_t n) {
    std::copy(global + g, global + g + n, local + l);
  });
}

void local_to_global(const ParamTensor& t, int tp, int tp_rank, const float* local, float* global) {
  for_each_run(t, tp, tp_rank, [&](size_t g, size_t l, size_t n) {
    std::copy(local + l, local + l + n, global + g);
  });
}

}  // namespace meshtrain::model
