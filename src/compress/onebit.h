// 1-bit compression with error feedback, and the compressed all-reduce of 1-bit Adam (Tang
// et al. 2021, "1-bit Adam: Communication Efficient Large-Scale Training with Adam's
// Convergence Speed", Section 4).
//
// A block of n values travels as n sign bits and one fp32 scale, and decompresses to
// +scale or -scale per element. The scale is the values' RMS (||v||_2 / sqrt(n)), so the
// block keeps the vector's L2 norm. Error feedback: the compressor adds what it left out
// last time (the error) to the values before compressing, and keeps what it leaves out now.
//
// The all-reduce (a mean) runs in two compressed stages over a group of N ranks, each
// rank the "server" of one chunk of the buffer (N equal chunks of c elements):
//   1. every rank compresses chunk j of (x + its worker error) and sends it to rank j
//      (an all-to-all of N blocks);
//   2. rank j averages the N blocks it received, adds its server error, compresses the
//      result and sends it to every rank (an all-gather of one block each).
// Every rank decompresses the same N blocks, so all end with the same buffer. Each rank
// sends 2 (N-1) blocks of c/8 + 4 bytes: about 1/32 of an fp32 all-reduce's 2 (N-1) c x 4
// (with a scale per b elements, c/8 + 4 ceil(c/b)).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "comm/group.h"

namespace meshtrain::compress {

// Bytes of the packed signs of n values (8 to a byte, element i in bit i % 8 of byte i / 8;
// a set bit is +, for values >= 0), and of a whole block (the fp32 scale first).
inline size_t sign_bytes(size_t n) { return (n + 7) / 8; }
inline size_t onebit_block_bytes(size_t n) { return sizeof(float) + sign_bytes(n); }

// Compresses x + error into `block` (onebit_block_bytes(n) bytes) and sets error to
// (x + error) - decompressed block. x null: zeros. The scale's sum of squares is taken in
// double in a fixed order: the block is the same for any thread count.
void compress_onebit(const float* x, float* error, size_t n, uint8_t* block);
// out[i] = the block's value of element i (+= with accumulate).
void decompress_onebit(const uint8_t* block, size_t n, float* out, bool accumulate = false);

// A chunk of n values compressed in pieces of `scale_block` values (a multiple of 8; 0: one
// piece), each with its own scale: the pieces' blocks back to back. Finer scales follow the
// values' magnitude where it varies (a norm's gains beside a weight matrix) for 4 bytes per
// piece.
size_t onebit_chunk_bytes(size_t n, size_t scale_block);
void compress_onebit_chunk(const float* x, float* error, size_t n, size_t scale_block, uint8_t* out);
void decompress_onebit_chunk(const uint8_t* in, size_t n, size_t scale_block, float* out, bool accumulate = false);

class OneBitAllReduce {
 public:
  // Buffers of group.size() chunks of `chunk` elements each, each chunk compressed with one
  // scale per `scale_block` elements (0: one per chunk).
  OneBitAllReduce(comm::Group& group, size_t chunk, size_t scale_block = 0);

  size_t chunk() const { return chunk_; }
  size_t scale_block() const { return scale_block_; }
  size_t size() const { return chunk_ * (size_t)group_.size(); }

  // out = the compressed mean over the group of every rank's x (size() elements each).
  // worker_error: this rank's, size() elements; server_error: this rank's chunk, chunk()
  // elements; both updated. out may alias x.
  void run(const float* x, float* worker_error, float* server_error, float* out);

  // What one run sends from each rank, in bytes: the all-to-all's N-1 blocks and the
  // all-gather's block to each of N-1 ranks (the comm layer counts the same).
  static int64_t wire_bytes(int ranks, size_t chunk, size_t scale_block = 0);

  // After run(): the N blocks every rank received from the all-gather (block j: chunk j of
  // `out`, compressed; onebit_block_bytes(chunk()) bytes each). Decompressed they are `out`,
  // so 1-bit Adam keeps its momentum as these blocks between steps.
  const uint8_t* gathered(int j) const { return recv_.data() + (size_t)j * onebit_chunk_bytes(chunk_, scale_block_); }

 private:
  comm::Group& group_;
  size_t chunk_, scale_block_;
  std::vector<uint8_t> send_, recv_;
  std::vector<float> mean_;
};

}  // namespace meshtrain::compress
