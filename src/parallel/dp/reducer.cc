#include "parallel/dp/reducer.h"

#include <algorithm>
#include <cstring>

#include "core/check.h"
#include "parallel/dp/quantized_comm.h"

namespace meshtrain::parallel {

void FullGradient::read(size_t offset, size_t n, float* out) const {
  if (is_half()) kernels::from_half(precision, half + offset, out, n);
  else std::memcpy(out, fp32 + offset, sizeof(float) * n);
}

void FullGradient::write(size_t offset, size_t n, const float* values) const {
  if (is_half()) kernels::to_half(precision, values, half + offset, n);
  else std::memcpy(fp32 + offset, values, sizeof(float) * n);
}

// ---------------------------------------------------------------- buckets

BucketAllReduce::BucketAllReduce(comm::Group& group, const model::ParamLayout& layout, const std::vector<int>& units,
                                 double bucket_mb, bool overlap, FullGradient grads, BufferPool<float>& pool,
                                 comm::Group* replicas)
    : group_(group), replicas_(replicas && replicas->size() > 1 ? replicas : nullptr), overlap_(overlap),
      grads_(grads), pool_(pool) {
  CHECK_MSG(grads.fp32 || grads.half, "a bucketed all-reduce needs the full gradient");
  // Backward finishes units in descending index order (final norm, blocks L-1..0,
  // embeddings), and consecutive units in that order are adjacent in memory.
  const size_t bucket_elems = std::max<size_t>(1, (size_t)(bucket_mb * 1024 * 1024 / 4));
  bucket_of_unit_.assign(layout.num_units(), -1);
  Bucket current;
  for (size_t i = units.size(); i-- > 0;) {
    const model::ParamUnit& unit = layout.units()[units[i]];
    if (current.units.empty()) current.end = unit.offset + unit.numel;
    current.units.push_back(units[i]);
    current.begin = unit.offset;
    bucket_of_unit_[units[i]] = (int)buckets_.size();
    const bool run_ends = i == 0 || [&] {
      const model::ParamUnit& before = layout.units()[units[i - 1]];
      return before.offset + before.numel != unit.offset;
    }();
    if (current.end - current.begin >= bucket_elems || run_ends) {
      max_bucket_ = std::max(max_bucket_, current.end - current.begin);
      buckets_.push_back(std::move(current));
      current = Bucket{};
    }
  }
  state_.resize(buckets_.size());
}

BucketAllReduce::~BucketAllReduce() {
  for (size_t b = 0; b < buckets_.size(); b++) complete(b);
}

void BucketAllReduce::begin_step() {
  for (InFlight& s : state_) {
    CHECK_MSG(!s.request, "a bucket's reduction outlived its step");
    s.ready = 0, s.started = false;
  }
}

void BucketAllReduce::unit_final(int u) {
  const int b = bucket_of_unit_[u];
  if (++state_[b].ready == (int)buckets_[b].units.size() && overlap_) start(b);
}

void BucketAllReduce::finish() {
  for (size_t b = 0; b < buckets_.size(); b++) {
    if (!state_[b].started) start(b);
    complete(b);
  }
}

void BucketAllReduce::start(size_t b) {
  const Bucket& bk = buckets_[b];
  InFlight& s = state_[b];
  const size_t n = bk.end - bk.begin;
  s.started = true;
  // One rank and no replicas: the gradient is already the sum (16-bit: no round trip).
  if (group_.size() == 1 && !replicas_) return;
  float* data = grads_.fp32 ? grads_.fp32 + bk.begin : nullptr;
  if (grads_.is_half()) {
    // One fp32 copy in flight: finish the earlier buckets (their reductions ran during the
    // backward of this bucket's units) before widening this one.
    for (size_t e = 0; e < buckets_.size(); e++)
      if (e != b) complete(e);
    s.staging = pool_.take(MemCategory::kComm, max_bucket_, false);  // one size: reused
    grads_.read(bk.begin, n, s.staging.data());
    data = s.staging.data();
  }
  // The replicas' parts first, blocking: every replica reaches this bucket at the same point
  // of the same backward, so their group's collectives stay in one order.
  if (replicas_) replicas_->all_reduce(data, n, comm::ReduceOp::kSum);
  if (group_.size() > 1) s.request = group_.iall_reduce(data, n, comm::ReduceOp::kSum);
  if (!overlap_ || !s.request) complete(b);
}

void BucketAllReduce::complete(size_t b) {
  InFlight& s = state_[b];
  if (s.request) {
    s.request->wait();
    s.request.reset();
  }
  if (s.staging.empty()) return;
  grads_.write(buckets_[b].begin, buckets_[b].end - buckets_[b].begin, s.staging.data());
  pool_.give(std::move(s.staging));
}

// ---------------------------------------------------------------- reduce-scatter

ShardReduceScatter::ShardReduceScatter(comm::Group& group, const ShardLayout& shards, int in_flight, bool overlap,
                                       BufferPool<float>& pool, Sink sink, comm::Group* replicas,
                                       size_t int8_block)
    : group_(group),
      replicas_(replicas && replicas->size() > 1 ? replicas : nullptr),
      shards_(shards),
      in_flight_(in_flight),
      overlap_(overlap),
      pool_(pool),
      sink_(std::move(sink)),
      int8_block_(group.size() > 1 ? int8_block : 0) {}

Buffer<float> ShardReduceScatter::staging(int u) {
  return pool_.take(MemCategory::kComm, shards_.units()[u].padded, true);
}

void ShardReduceScatter::start(int u, Buffer<float>&& padded) {
  const UnitShard& s = shards_.units()[u];
  CHECK(padded.size() == s.padded);
  CHECK_MSG(group_.size() == s.world && group_.rank() == s.rank, "the reduction group is not the unit's partition");
  Pending p;
  p.unit = u;
  p.send = std::move(padded);
  p.recv = pool_.take(MemCategory::kComm, s.shard, false);
  if (replicas_) replicas_->all_reduce(p.send.data(), s.padded, comm::ReduceOp::kSum);  // as BucketAllReduce
  p.request = int8_block_ ? ireduce_scatter_int8(group_, p.send.data(), s.shard, int8_block_, p.recv.data())
                         : group_.ireduce_scatter(p.send.data(), p.recv.data(), s.shard, comm::ReduceOp::kSum);
  pending_.push_back(std::move(p));
  // The older reductions retire now (theirs had this unit's backward to finish), so
  // in_flight units' buffers are in flight, not the whole model's gradient at the
  // micro-batch's end. Each unit's shard goes to the sink alone: the order changes no bit.
  while (in_flight_ > 0 && (int)pending_.size() > in_flight_) {
    retire(pending_.front());
    pending_.erase(pending_.begin());
  }
  if (!overlap_) retire(pending_.back()), pending_.pop_back();
}

void ShardReduceScatter::start_from(int u, const FullGradient& full) {
  const UnitShard& s = shards_.units()[u];
  Buffer<float> send = staging(u);  // zero-padded
  full.read(s.global_offset, s.numel, send.data());
  start(u, std::move(send));
}

void ShardReduceScatter::retire(Pending& p) {
  p.request->wait();
  sink_(p.unit, p.recv.data());
  pool_.give(std::move(p.send));
  pool_.give(std::move(p.recv));
}

void ShardReduceScatter::wait_all() {
  for (Pending& p : pending_) retire(p);
  pending_.clear();
}

}  // namespace meshtrain::parallel
