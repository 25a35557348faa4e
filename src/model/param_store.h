// Where the model finds its parameters and puts its gradients, unit by unit (see
// ParamUnit). The model brackets every use: acquire_params(u) ... release_params(u), and
// acquire_grads(u) (any number of times within a micro-batch) ... release_grads(u) once
// the unit's contributions for the micro-batch are complete. A local store simply hands
// out slices of full buffers; a ZeRO store gathers, prefetches, reduces and frees.
//
// Order of calls in one micro-batch (E = embeddings, F = final norm, B_l = block l):
//   forward:  acquire_params(E), B_0..B_{L-1} (acquire/release each), F, release_params(E)
//   backward: acquire_params(E), acquire_grads(E), release_params(E), F (params+grads),
//             B_{L-1}..B_0 (params+grads), acquire_grads(E), release_grads(E)
#pragma once
#include "core/memory.h"
#include "model/param_layout.h"

namespace meshtrain::model {

enum class Pass { kForward, kBackward };
// PipeDream-2BW's two weight versions (parallel::pp, the 2bw schedule): the ones the
// optimizer updates, and the ones before its last update, which a step's own micro-batches
// compute with.
enum class WeightVersion { kCurrent, kPrevious };

class ParamStore {
 public:
  virtual ~ParamStore() = default;
  // Announces the pass about to run, so a store can prefetch in the right direction.
  virtual void begin_pass(Pass pass) {}
  // Which weight version acquire_params hands out from now on (a store that keeps one
  // version has only the current).
  virtual void use_weights(WeightVersion version) {}
  // Full parameters of unit u, laid out as the unit's slice of the flat layout.
  virtual const float* acquire_params(int u) = 0;
  virtual void release_params(int u) {}
  // Unit u's parameters in bfloat16 while acquired, when the store keeps them so (16-bit
  // storage, kBf16). The fp32 unit from acquire_params then holds only the tensors that are
  // not GEMM weights (ParamTensor::gemm_weight), packed: the model reads the weights from
  // here, and neither widens a weight that the bf16 GEMMs would round again nor holds an
  // fp32 copy of it. Null: the fp32 unit is complete.
  virtual const uint16_t* acquired_bf16(int u) const { return nullptr; }
  // Where tensor t of unit u starts in `unit`, the fp32 parameters acquire_params(u)
  // returned: at the tensor's offset in the unit's slice of the flat layout, unless the
  // store packs the unit (see acquired_bf16).
  virtual const float* fp32_tensor(const float* unit, int u, const ParamTensor& t,
                                   const ParamLayout& layout) const {
    return unit + layout.offset_in_unit(t);
  }
  // Rows [first_row, first_row + rows) of tensor t's dim 0, where they start: for a store that
  // holds only some rows (a tensor-parallel decoding rank's share). The rows may run on into
  // the tensors after t in the layout (a fused operand: Llama's q, k and v projections).
  virtual const float* fp32_rows(const float* unit, int u, const ParamTensor& t, int64_t first_row, int64_t rows,
                                 const ParamLayout& layout) const {
    return fp32_tensor(unit, u, t, layout) + first_row * (int64_t)(t.numel / t.shape[0]);
  }
  // The unit's gradient accumulation buffer (same layout); contributions are added (+=).
  virtual float* acquire_grads(int u) = 0;
  virtual void release_grads(int u) {}
  // Unit u's 16-bit (bf16) gradient while its gradients are acquired, when the GEMMs add
  // the gradients of its linear weights (ParamTensor::gemm_grad) there themselves (sum in
  // fp32, one rounding per micro-batch, as release_grads would add them). The fp32 buffer
  // from acquire_grads then holds only the other tensors, packed (fp32_grad_tensor).
  // Null: the fp32 buffer holds the whole unit.
  virtual uint16_t* acquired_grads_bf16(int u) { return nullptr; }
  // Where tensor t of unit u starts in `unit`, the fp32 gradient acquire_grads(u) returned.
  virtual float* fp32_grad_tensor(float* unit, int u, const ParamTensor& t,
                                  const ParamLayout& layout) const {
    return unit + layout.offset_in_unit(t);
  }
};

// Full parameters and (optionally) full gradients in flat buffers: single rank, DP,
// ZeRO-1; ZeRO-2 keeps full parameters but only sharded gradients.
class LocalParamStore : public ParamStore {
 public:
  LocalParamStore(const ParamLayout& layout, bool with_grads)
      : layout_(layout), params_(MemCategory::kParams, layout.total()) {
    if (with_grads) grads_.allocate(MemCategory::kGrads, layout.total());
  }
  bool has_grads() const { return !grads_.empty(); }
  const float* acquire_params(int u) override { return params_.data() + layout_.units()[u].offset; }
  float* acquire_grads(int u) override { return grads_.data() + layout_.units()[u].offset; }
  float* params() { return params_.data(); }
  float* grads() { return grads_.data(); }

 private:
  const ParamLayout& layout_;
  Buffer<float> params_, grads_;
};

}  // namespace meshtrain::model
