// Block-wise symmetric int8 quantization: the wire format of ZeRO++'s quantized weight
// all-gather (qwZ) and quantized gradient reduce-scatter (qgZ) (Wang et al. 2023, "ZeRO++:
// Extremely Efficient Collective Communication for Giant Model Training", Section 3).
//
// n values travel in blocks of `block` values (the last block may be shorter). A block has
// one fp32 scale s = max|x| / 127 and one int8 code per value, q = round(x / s) (ties away
// from zero), which decodes to q * s: every value within s / 2 of what was sent, and a
// block's largest magnitude exact. A block of zeros has s = 0. A non-finite value makes its
// block's scale non-finite, so the decoded block is too (the step's non-finite check sees it).
// Layout of n values: the ceil(n / block) scales, then the n codes.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/ops.h"

namespace meshtrain::compress {

inline size_t int8_blocks(size_t n, size_t block) { return (n + block - 1) / block; }
inline size_t int8_bytes(size_t n, size_t block) { return int8_blocks(n, block) * sizeof(float) + n; }

// The encoder and decoder are kernel ops (a backend runs them where the values are); they
// are named here, beside the format, for the collectives that send it.
// quantize_int8(x, n, block, out): x[0, n) into out (int8_bytes(n, block) bytes), block >= 1.
// dequantize_int8(in, n, block, out, accumulate): out[i] = element i's decoded value (+=).
using kernels::dequantize_int8;
using kernels::quantize_int8;

}  // namespace meshtrain::compress
