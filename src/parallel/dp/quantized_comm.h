// ZeRO++'s quantized collectives for the ZeRO stages' parameter gathers and gradient
// reductions (Wang et al. 2023): the values travel as int8 blocks with one fp32 scale each
// (compress/int8_blocks.h), decoded on arrival.
//   qwZ  iall_gather_int8: each rank quantizes its shard, the blocks are all-gathered, and
//        every rank decodes every shard, its own included, so all ranks compute with the
//        same weights. A shard of n values sends int8_bytes(n, block) bytes to each of the
//        N-1 others: about 1/4 of an fp32 gather and 1/2 of a 16-bit one.
//   qgZ  ireduce_scatter_int8: each rank quantizes the N chunks of its gradient, an
//        all-to-all sends chunk j to rank j, and rank j sums the N chunks in rank order,
//        its own exact. One quantization per value, where a ring reduce-scatter would round
//        at each of its N-1 hops (which is why ZeRO++ replaces it by an all-to-all). The
//        same bytes as qwZ's gather per chunk.
// Both return a request whose wait() completes the exchange and decodes; as with every
// collective (comm/group.h), the buffers stay untouched until then. A group of one rank
// sends nothing: the callers do not quantize there.
#pragma once
#include <cstddef>
#include <cstdint>

#include "comm/group.h"
#include "kernels/ops.h"

namespace meshtrain::parallel {

// Which of the ZeRO stages' collectives are quantized (DpConfig::quantized, and the
// planner's layouts): stage 3's parameter gathers (qwZ, `weights`), stages 1-3's gradient
// reduce-scatters (qgZ, `grads`), in int8 blocks of `block` values.
struct QuantizedComm {
  bool weights = false, grads = false;
  size_t block = 256;
  bool any() const { return weights || grads; }
};

// out[r*n, (r+1)*n) = rank r's `shard` (n values) as decoded from its int8 blocks.
comm::RequestPtr iall_gather_int8(comm::Group& group, const float* shard, size_t n, size_t block, float* out);
// The same for 16-bit words of precision p: widened, quantized, decoded and rounded back.
comm::RequestPtr iall_gather_int8(comm::Group& group, kernels::Precision p, const uint16_t* shard, size_t n,
                                  size_t block, uint16_t* out);
// out[n] = the sum over the group's ranks of chunk rank() of their `send` (N chunks of n),
// every chunk but this rank's own decoded from int8 blocks.
comm::RequestPtr ireduce_scatter_int8(comm::Group& group, const float* send, size_t n, size_t block, float* out);

// Bytes one rank sends in either collective, for n values per chunk (the comm layer's
// count: N-1 chunks of int8_bytes(n, block)).
int64_t int8_collective_bytes(int ranks, size_t n, size_t block);

}  // namespace meshtrain::parallel
