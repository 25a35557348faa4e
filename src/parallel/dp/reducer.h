// The gradient reducer of one parameter group: it sums each unit's gradient over the group's
// ranks as soon as the unit is final, so the reductions overlap the backward pass of the
// units before it. It knows the communicator and the partition, not the ZeRO stage: where a
// gradient comes from and where its sum goes are the caller's (FullGradient, Sink).
//   BucketAllReduce     ZeRO 0: runs of units in backward order (contiguous in the flat
//                       layout) all-reduced in place once every unit of the run is final.
//   ShardReduceScatter  ZeRO 1-3: a unit's padded gradient reduce-scattered; the reduced
//                       owned shard goes to a sink when the reduction retires.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "comm/group.h"
#include "core/memory.h"
#include "kernels/ops.h"
#include "model/param_layout.h"
#include "parallel/shard_layout.h"

namespace meshtrain::parallel {

// A full gradient buffer in the flat layout (ZeRO 0-1): fp32, or 16-bit words that the
// reductions widen to fp32 and round back once.
struct FullGradient {
  float* fp32 = nullptr;
  uint16_t* half = nullptr;
  kernels::Precision precision = kernels::Precision::kFp32;

  bool is_half() const { return half != nullptr; }
  void read(size_t offset, size_t n, float* out) const;         // widened (fp32: copied)
  void write(size_t offset, size_t n, const float* values) const;  // rounded (fp32: copied)
};

class BucketAllReduce {
 public:
  // Buckets over `units` (the group's, ascending) of at least bucket_mb MiB, each a run of
  // units adjacent in the flat layout (a run's last bucket may be smaller). Without
  // `overlap` no bucket starts before finish(). `replicas`: ranks holding the same units
  // with a part of their gradient each (experts replicated over tp), summed first (null: none).
  BucketAllReduce(comm::Group& group, const model::ParamLayout& layout, const std::vector<int>& units,
                  double bucket_mb, bool overlap, FullGradient grads, BufferPool<float>& pool,
                  comm::Group* replicas = nullptr);
  ~BucketAllReduce();  // waits for the buckets in flight (starts none)

  struct Bucket {
    std::vector<int> units;  // in backward order
    size_t begin = 0, end = 0;  // flat range
  };
  const std::vector<Bucket>& buckets() const { return buckets_; }

  void begin_step();
  // Unit u's gradient is final for the step: its bucket starts once all its units are.
  void unit_final(int u);
  // Every bucket reduced, those with units never final included (their gradient is zero).
  void finish();

 private:
  struct InFlight {
    int ready = 0;
    bool started = false;
    comm::RequestPtr request;
    Buffer<float> staging;  // 16-bit gradients: the fp32 copy being reduced
  };
  void start(size_t b);
  void complete(size_t b);

  comm::Group& group_;
  comm::Group* replicas_;
  bool overlap_;
  FullGradient grads_;
  BufferPool<float>& pool_;
  std::vector<Bucket> buckets_;
  std::vector<InFlight> state_;
  std::vector<int> bucket_of_unit_;
  size_t max_bucket_ = 0;  // elements of the largest bucket
};

class ShardReduceScatter {
 public:
  // Receives unit u's reduced shard: shards.own_end(u) - shards.own_begin(u) elements (the
  // real part of this rank's shard), valid during the call.
  using Sink = std::function<void(int u, const float* reduced)>;
  // `in_flight`: reductions left running after start() (the older ones retire first);
  // 0: no limit, every one retires in wait_all(). Without `overlap` each retires at once.
  // `replicas`: as BucketAllReduce's, their sum taken before the reduce-scatter.
  // `int8_block` > 0: ZeRO++'s qgZ, the reduce-scatter as an all-to-all of int8 blocks of
  // that many values (parallel/dp/quantized_comm.h).
  ShardReduceScatter(comm::Group& group, const ShardLayout& shards, int in_flight, bool overlap,
                     BufferPool<float>& pool, Sink sink, comm::Group* replicas = nullptr, size_t int8_block = 0);
  ~ShardReduceScatter() { wait_all(); }

  // A zeroed buffer for unit u's whole gradient, padded (ShardLayout::padded).
  Buffer<float> staging(int u);
  // Reduce-scatters `padded` (from staging(u)) over the group.
  void start(int u, Buffer<float>&& padded);
  // Copies unit u's gradient out of a full buffer (ZeRO 1, which keeps it) and starts.
  void start_from(int u, const FullGradient& full);
  void wait_all();
  size_t in_flight() const { return pending_.size(); }

 private:
  struct Pending {
    int unit = -1;
    comm::RequestPtr request;
    Buffer<float> send, recv;
  };
  void retire(Pending& p);

  comm::Group& group_;
  comm::Group* replicas_;
  const ShardLayout& shards_;
  int in_flight_;
  bool overlap_;
  BufferPool<float>& pool_;
  Sink sink_;
  size_t int8_block_;
  std::vector<Pending> pending_;
};

}  // namespace meshtrain::parallel
