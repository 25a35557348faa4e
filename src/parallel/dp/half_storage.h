// 16-bit storage (bf16 or fp16) of a data-parallel rank's parameters and gradients: the
// words the rank keeps (the whole model, or its ZeRO shard), and the fp32 views the model
// computes with. The optimizer's fp32 master weights live in the ShardStore beside its
// moments (ZeRO's mixed-precision Adam, 12 bytes per parameter there).
//  - Parameters: a unit in use is widened to fp32; with bf16 only its tensors that are not
//    GEMM weights, packed (the bf16 GEMMs read the stored words).
//  - Gradients of a full store (ZeRO 0-1): a micro-batch's fp32 gradient is added into the
//    16-bit words once (the sum in fp32, one rounding); with bf16 the linear weights' GEMMs
//    add theirs into the words themselves, and the fp32 buffer holds the other tensors,
//    packed.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "core/memory.h"
#include "kernels/ops.h"
#include "model/param_layout.h"
#include "parallel/dp/reducer.h"

namespace meshtrain::parallel {

// Some tensors of each unit, packed in the unit's order.
class PackedUnits {
 public:
  PackedUnits(const model::ParamLayout& layout, bool (*keep)(const model::ParamTensor&));
  struct Run {
    size_t from, to, n;  // from: in the unit's layout; to: in the packed buffer
  };
  const std::vector<Run>& runs(int u) const { return runs_[u]; }
  size_t size(int u) const { return size_[u]; }
  // Where tensor t starts in its unit's packed buffer (t must be kept).
  size_t offset_of(const model::ParamLayout& layout, const model::ParamTensor& t) const;

 private:
  std::vector<std::vector<Run>> runs_;
  std::vector<size_t> size_;
  std::vector<size_t> offset_;  // per tensor of the layout
};

class HalfStorage {
 public:
  // `params` and `grads`: the words kept (the full layout, or ZeRO-2's gradient shard; 0 at
  // ZeRO-3, whose words are arrays of the rank's ShardStore, in memory or in files);
  // `full_grads`: gradients in the full layout (ZeRO 0-1), accumulated per micro-batch here.
  HalfStorage(kernels::Precision precision, const model::ParamLayout& layout, size_t params, size_t grads,
              bool full_grads);
  kernels::Precision precision() const { return precision_; }
  uint16_t* params() { return params_.data(); }
  uint16_t* grads() { return grads_.data(); }
  const uint16_t* params() const { return params_.data(); }
  FullGradient full_gradient() { return {nullptr, grads_.data(), precision_}; }
  void zero_grads() { zero_bytes(grads_.data(), grads_.bytes()); }

  // The fp32 view of a unit's parameters: its size, filling it from the unit's words, and
  // where tensor t starts in it.
  bool packs_params() const { return packed_params_ != nullptr; }
  size_t fp32_unit_size(int u) const;
  void widen(int u, const uint16_t* unit, float* out) const;
  size_t param_offset(int u, const model::ParamTensor& t) const;

  // The fp32 accumulator of a unit's gradient for one micro-batch (full gradients), where
  // tensor t starts in it, and whether the GEMMs add the linear weights' own.
  bool packs_grads() const { return packed_grads_ != nullptr; }
  size_t fp32_grad_size(int u) const;
  size_t grad_offset(int u, const model::ParamTensor& t) const;
  uint16_t* unit_grads(int u) { return grads_.data() + layout_.units()[u].offset; }
  // Adds a micro-batch's fp32 gradient of unit u into the words (full gradients).
  void add_unit_grads(int u, const float* g);

 private:
  kernels::Precision precision_;
  const model::ParamLayout& layout_;
  Buffer<uint16_t> params_, grads_;
  // Parameters: all but the GEMM weights. Gradients of a full store: all but the linear
  // weights'. Null: fp32 views are whole units.
  std::unique_ptr<PackedUnits> packed_params_, packed_grads_;
};

}  // namespace meshtrain::parallel
