#include "parallel/dp/quantized_comm.h"

#include <cstring>
#include <vector>

#include "compress/int8_blocks.h"
#include "core/check.h"
#include "core/memory.h"

namespace meshtrain::parallel {
namespace {

using compress::int8_bytes;

// A byte exchange in flight and what decodes it: decode() runs once, in the first wait().
class DecodingRequest : public comm::Request {
 public:
  // The byte buffers go as soon as they are decoded (a gathered unit keeps its request
  // while in use).
  void wait() override {
    inner_->wait();
    if (decoded_) return;
    decoded_ = true;
    decode();
    send_.release();
    recv_.release();
  }
  bool done() override { return inner_->done(); }

 protected:
  virtual void decode() = 0;
  comm::RequestPtr inner_;
  Buffer<uint8_t> send_, recv_;

 private:
  bool decoded_ = false;
};

class GatherInt8 final : public DecodingRequest {
 public:
  GatherInt8(comm::Group& group, const float* shard, size_t n, size_t block, float* out, kernels::Precision p,
             uint16_t* out_half)
      : ranks_(group.size()), n_(n), block_(block), out_(out), out_half_(out_half), precision_(p) {
    const size_t m = int8_bytes(n, block);
    send_.allocate(MemCategory::kComm, m);
    recv_.allocate(MemCategory::kComm, m * (size_t)ranks_);
    compress::quantize_int8(shard, n, block, send_.data());
    inner_ = group.iall_gather(send_.data(), recv_.data(), m);
  }

 private:
  void decode() override {
    const size_t m = int8_bytes(n_, block_);
    Buffer<float> widened(MemCategory::kComm, out_half_ ? n_ : 0);
    for (int r = 0; r < ranks_; r++) {
      const uint8_t* in = recv_.data() + (size_t)r * m;
      if (!out_half_) {
        compress::dequantize_int8(in, n_, block_, out_ + (size_t)r * n_);
      } else {
        compress::dequantize_int8(in, n_, block_, widened.data());
        kernels::to_half(precision_, widened.data(), out_half_ + (size_t)r * n_, n_);
      }
    }
  }
  int ranks_;
  size_t n_, block_;
  float* out_;
  uint16_t* out_half_;
  kernels::Precision precision_;
};

class ReduceScatterInt8 final : public DecodingRequest {
 public:
  ReduceScatterInt8(comm::Group& group, const float* send, size_t n, size_t block, float* out)
      : ranks_(group.size()), rank_(group.rank()), n_(n), block_(block), out_(out), own_(send + (size_t)rank_ * n) {
    const size_t m = int8_bytes(n, block);
    send_.allocate(MemCategory::kComm, m * (size_t)ranks_);
    recv_.allocate(MemCategory::kComm, m * (size_t)ranks_);
    for (int j = 0; j < ranks_; j++)
      if (j != rank_) compress::quantize_int8(send + (size_t)j * n, n, block, send_.data() + (size_t)j * m);
    inner_ = group.iall_to_all(send_.data(), recv_.data(), m);
  }

 private:
  void decode() override {
    const size_t m = int8_bytes(n_, block_);
    for (int j = 0; j < ranks_; j++) {
      if (j == rank_) {
        if (j == 0) std::memcpy(out_, own_, n_ * sizeof(float));
        else for (size_t i = 0; i < n_; i++) out_[i] += own_[i];
      } else {
        compress::dequantize_int8(recv_.data() + (size_t)j * m, n_, block_, out_, /*accumulate=*/j > 0);
      }
    }
  }
  int ranks_, rank_;
  size_t n_, block_;
  float* out_;
  const float* own_;  // the caller's, untouched until wait()
};

}  // namespace

comm::RequestPtr iall_gather_int8(comm::Group& group, const float* shard, size_t n, size_t block, float* out) {
  CHECK(block >= 1);
  return std::make_unique<GatherInt8>(group, shard, n, block, out, kernels::Precision::kFp32, nullptr);
}

comm::RequestPtr iall_gather_int8(comm::Group& group, kernels::Precision p, const uint16_t* shard, size_t n,
                                  size_t block, uint16_t* out) {
  CHECK(block >= 1);
  Buffer<float> widened(MemCategory::kComm, n);
  kernels::from_half(p, shard, widened.data(), n);
  return std::make_unique<GatherInt8>(group, widened.data(), n, block, nullptr, p, out);
}

comm::RequestPtr ireduce_scatter_int8(comm::Group& group, const float* send, size_t n, size_t block, float* out) {
  CHECK(block >= 1);
  return std::make_unique<ReduceScatterInt8>(group, send, n, block, out);
}

int64_t int8_collective_bytes(int ranks, size_t n, size_t block) {
  return (int64_t)(ranks - 1) * (int64_t)int8_bytes(n, block);
}

}  // namespace meshtrain::parallel
