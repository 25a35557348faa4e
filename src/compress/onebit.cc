#include "compress/onebit.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/check.h"
#include "optim/adamw.h"

namespace meshtrain::compress {

void compress_onebit(const float* x, float* error, size_t n, uint8_t* block) {
  // error becomes v = x + error, the values compressed; then what the block leaves out.
  if (x) {
#pragma omp parallel for schedule(static) if (n >= (1 << 16))
    for (size_t i = 0; i < n; i++) error[i] += x[i];
  }
  const float scale = n == 0 ? 0.f : (float)std::sqrt(optim::sum_of_squares(error, n) / (double)n);
  std::memcpy(block, &scale, sizeof scale);
  uint8_t* signs = block + sizeof scale;
  const size_t bytes = sign_bytes(n);
#pragma omp parallel for schedule(static) if (n >= (1 << 16))
  for (size_t b = 0; b < bytes; b++) {
    uint8_t bits = 0;
    const size_t end = std::min(n, 8 * b + 8);
    for (size_t i = 8 * b; i < end; i++) {
      const bool positive = error[i] >= 0.f;
      bits |= (uint8_t)(positive ? 1u : 0u) << (i % 8);
      error[i] -= positive ? scale : -scale;
    }
    signs[b] = bits;
  }
}

void decompress_onebit(const uint8_t* block, size_t n, float* out, bool accumulate) {
  float scale;
  std::memcpy(&scale, block, sizeof scale);
  const uint8_t* signs = block + sizeof scale;
  // A byte's 8 values at a time, branch-free (bit k set: +scale), so the inner loop vectorises.
  const size_t whole = n / 8;
#pragma omp parallel for schedule(static) if (n >= (1 << 16))
  for (size_t b = 0; b < whole; b++) {
    const unsigned bits = signs[b];
    float* o = out + 8 * b;
    if (accumulate) {
      for (int k = 0; k < 8; k++) o[k] += scale * (float)(int)(((bits >> k) & 1u) * 2u - 1u);
    } else {
      for (int k = 0; k < 8; k++) o[k] = scale * (float)(int)(((bits >> k) & 1u) * 2u - 1u);
    }
  }
  for (size_t i = 8 * whole; i < n; i++) {
    const float v = (signs[i / 8] >> (i % 8)) & 1u ? scale : -scale;
    out[i] = accumulate ? out[i] + v : v;
  }
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
