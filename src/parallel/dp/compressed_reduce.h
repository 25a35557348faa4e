// Compressed data-parallel gradient reduction (issue 19, docs/compression.md): the engine's
// side of compress/. It decides, step by step, whether a group's gradient goes through the
// plain reducer or through a compressor, and owns the compressor's per-rank state.
//   PowerSGD (Vogels et al. 2019): from step `start_step` (0-based; the steps before it are
//   plain all-reduces, torch's start_powerSGD_iter) the whole local gradient of the rank's
//   units is reduced once after backward as a rank-r approximation of each matrix
//   (ParamTensor with two dimensions: linear weights and the embedding), vectors exactly.
//   The result is the group's sum, as the bucket all-reduce's, so the rest of the step
//   (tied embedding, norm, clipping, AdamW) is unchanged.
// Supported: ZeRO stage 0, fp32 gradient storage, one parameter group (no experts); any tp
// and pp (each stage's dp group compresses its own units). setup refuses the rest by name.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/group.h"
#include "compress/powersgd.h"
#include "core/memory.h"
#include "core/status.h"
#include "model/param_layout.h"

namespace meshtrain::parallel {

struct Compression {
  enum class Kind { kNone, kPowerSgd, kOneBitAdam };
  Kind kind = Kind::kNone;
  // 0-based steps before this one reduce plainly (1-bit Adam: its freeze step, the plain
  // Adam steps that estimate the variance)
  int64_t start_step = 0;
  int rank = 4;            // PowerSGD's r
  size_t scale_block = 2048;  // 1-bit Adam: elements per scale
  uint64_t seed = 0;       // the first Q (the same on every rank of the group)
};

// "none", "powersgd" or "onebit-adam"; an error listing the known names otherwise.
Status parse_compression_kind(const std::string& name, Compression::Kind* out);
const char* compression_name(Compression::Kind kind);

class CompressedReduction {
 public:
  // The rank's gradient buffer in `layout` (fp32, the flat layout's `total` elements).
  CompressedReduction(comm::Group& group, const model::ParamLayout& layout, const Compression& config);

  // grads: this rank's gradient in, the group's (compressed) sum out; the error updated.
  void reduce(float* grads);

  // What one reduce() sends from this rank (the comm layer's count).
  int64_t wire_bytes() const { return powersgd_->wire_bytes(); }
  // The compressed matrices and the elements sent exactly.
  const compress::PowerSgd& powersgd() const { return *powersgd_; }
  // Per-rank state (checkpoints): the error feedback and PowerSGD's warm-start Q.
  std::vector<float>& q_memory() { return powersgd_->q_memory(); }
  float* error() { return error_.data(); }
  size_t error_size() const { return error_.size(); }

 private:
  Compression config_;
  Buffer<float> error_;
  std::unique_ptr<compress::PowerSgd> powersgd_;
};

}  // namespace meshtrain::parallel
