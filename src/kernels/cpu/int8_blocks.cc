// Block-wise int8 quantization, the wire format of the quantized collectives
// (compress/int8_blocks.h). Blocks are independent: a block's scale and codes come from its
// own values only, so the threads change nothing.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/ops.h"

namespace meshtrain::kernels {

namespace {
// Below this many values a parallel region costs more than the loop.
constexpr size_t kInt8Parallel = 1 << 16;
size_t block_count(size_t n, size_t block) { return (n + block - 1) / block; }
}  // namespace

void quantize_int8(const float* x, size_t n, size_t block, uint8_t* out) {
  const size_t blocks = block_count(n, block);
  uint8_t* codes = out + blocks * sizeof(float);
#pragma omp parallel for schedule(static) if (n >= kInt8Parallel)
  for (size_t b = 0; b < blocks; b++) {
    const size_t begin = b * block, end = std::min(n, begin + block);
    float peak = 0.f;
    bool finite = true;
    for (size_t i = begin; i < end; i++) {
      peak = std::max(peak, std::fabs(x[i]));
      finite = finite && std::isfinite(x[i]);
    }
    const float scale = finite ? peak / 127.f : NAN;
    std::memcpy(out + b * sizeof(float), &scale, sizeof scale);
    if (!finite || peak == 0.f) {  // zeros, or a NaN scale that decodes to NaN
      std::memset(codes + begin, 0, end - begin);
      continue;
    }
    const float inv = 127.f / peak;
    for (size_t i = begin; i < end; i++) {
      const float q = std::clamp(std::round(x[i] * inv), -127.f, 127.f);
      codes[i] = static_cast<uint8_t>(static_cast<int8_t>(q));
    }
  }
}

void dequantize_int8(const uint8_t* in, size_t n, size_t block, float* out, bool accumulate) {
  const size_t blocks = block_count(n, block);
  const uint8_t* codes = in + blocks * sizeof(float);
#pragma omp parallel for schedule(static) if (n >= kInt8Parallel)
  for (size_t b = 0; b < blocks; b++) {
    float scale;
    std::memcpy(&scale, in + b * sizeof(float), sizeof scale);
    const size_t begin = b * block, end = std::min(n, begin + block);
    if (accumulate) {
      for (size_t i = begin; i < end; i++) out[i] += scale * (float)static_cast<int8_t>(codes[i]);
    } else {
      for (size_t i = begin; i < end; i++) out[i] = scale * (float)static_cast<int8_t>(codes[i]);
    }
  }
}

}  // namespace meshtrain::kernels
