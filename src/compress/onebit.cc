#include "compress/onebit.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/check.h"
#include "kernels/ops.h"
#include "optim/adamw.h"

namespace meshtrain::compress {

void compress_onebit(const float* x, float* error, size_t n, uint8_t* block) {
  // error becomes v = x + error, the values compressed; then what the block leaves out.
  if (x) kernels::add_inplace(error, x, n);
  const float scale = n == 0 ? 0.f : (float)std::sqrt(optim::sum_of_squares(error, n) / (double)n);
  std::memcpy(block, &scale, sizeof scale);
  kernels::onebit_pack(error, n, scale, block + sizeof scale);
}

void decompress_onebit(const uint8_t* block, size_t n, float* out, bool accumulate) {
  float scale;
  std::memcpy(&scale, block, sizeof scale);
  kernels::onebit_unpack(block + sizeof scale, n, scale, out, accumulate);
}

size_t onebit_chunk_bytes(size_t n, size_t scale_block) {
  if (scale_block == 0 || scale_block >= n) return onebit_block_bytes(n);
  const size_t full = n / scale_block, rest = n % scale_block;
  return full * onebit_block_bytes(scale_block) + (rest ? onebit_block_bytes(rest) : 0);
}

void compress_onebit_chunk(const float* x, float* error, size_t n, size_t scale_block, uint8_t* out) {
  const size_t b = scale_block == 0 ? n : scale_block;
  for (size_t at = 0; at < n; at += b) {
    const size_t k = std::min(b, n - at);
    compress_onebit(x ? x + at : nullptr, error + at, k, out);
    out += onebit_block_bytes(k);
  }
}

void decompress_onebit_chunk(const uint8_t* in, size_t n, size_t scale_block, float* out, bool accumulate) {
  const size_t b = scale_block == 0 ? n : scale_block;
  for (size_t at = 0; at < n; at += b) {
    const size_t k = std::min(b, n - at);
    decompress_onebit(in, k, out + at, accumulate);
    in += onebit_block_bytes(k);
  }
}

OneBitAllReduce::OneBitAllReduce(comm::Group& group, size_t chunk, size_t scale_block)
    : group_(group), chunk_(chunk), scale_block_(scale_block) {
  CHECK_MSG(scale_block % 8 == 0, "a 1-bit scale block is a multiple of 8 values");
  const size_t N = (size_t)group.size(), block = onebit_chunk_bytes(chunk, scale_block);
  send_.resize(N * block);
  recv_.resize(N * block);
  mean_.resize(chunk);
}

void OneBitAllReduce::run(const float* x, float* worker_error, float* server_error, float* out) {
  const int N = group_.size();
  const size_t block = onebit_chunk_bytes(chunk_, scale_block_);
  // 1. Worker: chunk j of x + error, compressed, goes to rank j.
  for (int j = 0; j < N; j++)
    compress_onebit_chunk(x + (size_t)j * chunk_, worker_error + (size_t)j * chunk_, chunk_, scale_block_,
                          send_.data() + j * block);
  group_.all_to_all(send_.data(), recv_.data(), block);
  // 2. Server: the mean of this rank's chunk over the workers (summed in rank order), plus
  // the server error, compressed once more and sent to everyone.
  for (int r = 0; r < N; r++) decompress_onebit_chunk(recv_.data() + r * block, chunk_, scale_block_, mean_.data(), r > 0);
  const float inv = 1.0f / (float)N;
  for (size_t i = 0; i < chunk_; i++) mean_[i] *= inv;
  uint8_t* mine = send_.data() + (size_t)group_.rank() * block;
  compress_onebit_chunk(mean_.data(), server_error, chunk_, scale_block_, mine);
  group_.all_gather(mine, recv_.data(), block);
  for (int j = 0; j < N; j++) decompress_onebit_chunk(recv_.data() + j * block, chunk_, scale_block_, out + (size_t)j * chunk_);
}

int64_t OneBitAllReduce::wire_bytes(int ranks, size_t chunk, size_t scale_block) {
  return 2 * (int64_t)(ranks - 1) * (int64_t)onebit_chunk_bytes(chunk, scale_block);
}

}  // namespace meshtrain::compress
