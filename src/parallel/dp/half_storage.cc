#include "parallel/dp/half_storage.h"

#include "core/check.h"

namespace meshtrain::parallel {

PackedUnits::PackedUnits(const model::ParamLayout& layout, bool (*keep)(const model::ParamTensor&)) {
  runs_.resize(layout.num_units());
  size_.assign(layout.num_units(), 0);
  offset_.assign(layout.tensors().size(), 0);
  for (size_t i = 0; i < layout.tensors().size(); i++) {
    const model::ParamTensor& t = layout.tensors()[i];
    if (!keep(t)) continue;
    const int u = layout.unit_of(t);
    const size_t from = layout.offset_in_unit(t);
    offset_[i] = size_[u];
    std::vector<Run>& runs = runs_[u];
    if (!runs.empty() && runs.back().from + runs.back().n == from) runs.back().n += t.numel;
    else runs.push_back({from, size_[u], t.numel});
    size_[u] += t.numel;
  }
}

size_t PackedUnits::offset_of(const model::ParamLayout& layout, const model::ParamTensor& t) const {
  const ptrdiff_t i = &t - layout.tensors().data();
  CHECK(i >= 0 && i < (ptrdiff_t)layout.tensors().size());
  return offset_[i];
}

HalfStorage::HalfStorage(kernels::Precision precision, const model::ParamLayout& layout, size_t params, size_t grads,
                         bool full_grads)
    : precision_(precision), layout_(layout) {
  CHECK_MSG(precision != kernels::Precision::kFp32, "16-bit storage of fp32 values");
  params_.allocate(MemCategory::kParams, params);
  grads_.allocate(MemCategory::kGrads, grads);
  if (precision != kernels::Precision::kBf16) return;  // fp16 GEMMs read fp32: whole units
  packed_params_ = std::make_unique<PackedUnits>(layout, [](const model::ParamTensor& t) { return !t.gemm_weight; });
  if (full_grads)
    packed_grads_ = std::make_unique<PackedUnits>(layout, [](const model::ParamTensor& t) { return !t.gemm_grad; });
}

size_t HalfStorage::fp32_unit_size(int u) const {
  return packed_params_ ? packed_params_->size(u) : layout_.units()[u].numel;
}

void HalfStorage::widen(int u, const uint16_t* unit, float* out) const {
  if (!packed_params_) return kernels::from_half(precision_, unit, out, layout_.units()[u].numel);
  for (const PackedUnits::Run& r : packed_params_->runs(u)) kernels::from_half(precision_, unit + r.from, out + r.to, r.n);
}

size_t HalfStorage::param_offset(int u, const model::ParamTensor& t) const {
  if (!packed_params_) return layout_.offset_in_unit(t);
  CHECK_MSG(!t.gemm_weight, "bf16 storage keeps no fp32 copy of a GEMM weight: read acquired_bf16");
  return packed_params_->offset_of(layout_, t);
}

size_t HalfStorage::fp32_grad_size(int u) const {
  return packed_grads_ ? packed_grads_->size(u) : layout_.units()[u].numel;
}

size_t HalfStorage::grad_offset(int u, const model::ParamTensor& t) const {
  if (!packed_grads_) return layout_.offset_in_unit(t);
  CHECK_MSG(!t.gemm_grad, "a linear weight's gradient goes to acquired_grads_bf16");
  return packed_grads_->offset_of(layout_, t);
}

void HalfStorage::add_unit_grads(int u, const float* g) {
  uint16_t* words = unit_grads(u);
  if (!packed_grads_) return kernels::add_to_half(precision_, words, g, layout_.units()[u].numel);
  // The linear weights' GEMMs have added theirs already.
  for (const PackedUnits::Run& r : packed_grads_->runs(u)) kernels::add_to_half(precision_, words + r.from, g + r.to, r.n);
}

}  // namespace meshtrain::parallel
