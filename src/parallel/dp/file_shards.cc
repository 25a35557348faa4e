#include "parallel/dp/file_shards.h"

#include <algorithm>
#include <cstring>

#include "core/check.h"

namespace meshtrain::parallel {

FileBackedShards::FileBackedShards(optim::ShardStore& store, const ShardLayout& shards,
                                   const std::vector<optim::AdamSegment>& segments, int read_ahead,
                                   kernels::Precision storage)
    : store_(store), shards_(shards), segments_(segments), read_ahead_(std::max(1, read_ahead)), storage_(storage) {
  const size_t n = shards.units().size();
  reads_.resize(n);
  grad_written_.assign(n, 0);
  segment_squares_.assign(segments.size(), 0.0);
  unit_segments_.assign(n, {});
  for (size_t i = 0; i < segments.size(); i++) unit_segments_[segments[i].unit].push_back((int)i);
}

// ---------------------------------------------------------------- parameters

void FileBackedShards::read(const std::vector<int>& units) {
  for (int u : units) {
    ShardRead& r = reads_[u];
    if (!r.buffer.empty()) continue;  // issued already
    const UnitShard& s = shards_.units()[u];
    r.buffer = take_buffer(s.shard);
    r.ticket = store_.read_async(optim::kShardParams, s.local_offset, s.shard, r.buffer.bytes());
  }
}

const void* FileBackedShards::take(int u, optim::IoBuffer* holder) {
  read({u});
  ShardRead& r = reads_[u];
  store_.wait(r.ticket);
  *holder = std::move(r.buffer);
  r = ShardRead{};
  return holder->bytes();
}

void FileBackedShards::drop_reads() {
  for (ShardRead& r : reads_) {
    if (r.buffer.empty()) continue;
    store_.wait(r.ticket);
    give_back(std::move(r.buffer));
    r = ShardRead{};
  }
}

optim::IoBuffer FileBackedShards::take_buffer(size_t n) {
  for (size_t i = 0; i < spares_.size(); i++)
    if (spares_[i].capacity() >= n) {
      optim::IoBuffer b = std::move(spares_[i]);
      spares_.erase(spares_.begin() + (ptrdiff_t)i);
      return b;
    }
  return optim::IoBuffer(MemCategory::kGathered, n, width());
}

void FileBackedShards::give_back(optim::IoBuffer&& b) {
  if (b.empty()) return;
  spares_.push_back(std::move(b));
  // As many as can be in flight: the read-ahead and the shard being gathered.
  if ((int)spares_.size() > read_ahead_ + 1) spares_.erase(spares_.begin());
}

optim::ParamsWritten FileBackedShards::hand_over(const std::vector<int>& units) {
  drop_reads();
  for (int u : units) reads_[u].buffer = take_buffer(shards_.units()[u].shard);  // ticket 0: nothing to wait for
  return [this, units](size_t begin, size_t end, const void* params) {
    const size_t w = width();
    for (int u : units) {
      const UnitShard& s = shards_.units()[u];
      const size_t lo = std::max(begin, s.local_offset), hi = std::min(end, s.local_offset + s.shard);
      if (lo < hi)
        std::memcpy(static_cast<char*>(reads_[u].buffer.bytes()) + (lo - s.local_offset) * w,
                    static_cast<const char*>(params) + (lo - begin) * w, w * (hi - lo));
    }
  };
}

// ---------------------------------------------------------------- gradients

void FileBackedShards::begin_step() { grad_written_.assign(grad_written_.size(), 0); }

// In pieces of the store's chunk, so a unit of any size needs two piece buffers: one being
// summed while the one before is written (one write in flight).
void FileBackedShards::add_reduced(int u, const float* reduced) {
  const UnitShard& s = shards_.units()[u];
  const size_t owned = shards_.own_end(u) - shards_.own_begin(u), piece = store_.chunk();
  std::vector<optim::SumOfSquaresStream> squares;
  for (int i : unit_segments_[u]) squares.emplace_back(segments_[i].count);
  for (size_t b = 0; b < owned; b += piece) {
    const size_t n = std::min(piece, owned - b);
    // Two buffers alternate: the other one's write was waited for before this one's began.
    optim::IoBuffer& buffer = pieces_[next_piece_ ^= 1];
    if (buffer.capacity() < piece) buffer = optim::IoBuffer(MemCategory::kComm, piece, width());
    sum_piece(u, b, n, reduced + b, buffer, squares);
    if (last_write_) store_.wait(last_write_);
    last_write_ = store_.write_async(optim::kShardGrads, s.local_offset + b, n, (const void*)buffer.bytes());
  }
  grad_written_[u] = 1;
  for (size_t k = 0; k < squares.size(); k++) segment_squares_[unit_segments_[u][k]] = squares[k].total();
}

void FileBackedShards::sum_piece(int u, size_t b, size_t n, const float* r, optim::IoBuffer& piece,
                                 std::vector<optim::SumOfSquaresStream>& squares) {
  const UnitShard& s = shards_.units()[u];
  if (grad_written_[u]) store_.wait(store_.read_async(optim::kShardGrads, s.local_offset + b, n, piece.bytes()));
  if (half()) {  // the in-memory words start at zero: the same rounding of the same sum
    if (!grad_written_[u]) zero_bytes(piece.words(), n * optim::kWord);
    kernels::add_to_half(storage_, piece.words(), r, n);
  } else if (grad_written_[u]) {
    float* g = piece.data();
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) g[i] += r[i];
  } else {  // the in-memory shard starts at zero: the same addition
    float* g = piece.data();
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) g[i] = 0.0f + r[i];
  }
  // The piece's part of each segment, in order (segments tile the unit's owned range), as
  // the values were stored.
  constexpr size_t kBlock = 1024;
  float widened[kBlock];
  for (size_t k = 0; k < squares.size(); k++) {
    const optim::AdamSegment& seg = segments_[unit_segments_[u][k]];
    const size_t from = seg.grad_offset - s.local_offset;
    const size_t lo = std::max(from, b), hi = std::min(from + seg.count, b + n);
    if (lo >= hi) continue;
    if (!half()) {
      squares[k].add(piece.data() + (lo - b), hi - lo);
      continue;
    }
    for (size_t i = lo; i < hi; i += kBlock) {  // widened a block at a time
      const size_t m = std::min(kBlock, hi - i);
      kernels::from_half(storage_, piece.words() + (i - b), widened, m);
      squares[k].add(widened, m);
    }
  }
}

void FileBackedShards::fill_unwritten() {
  for (size_t u = 0; u < grad_written_.size(); u++) {
    if (grad_written_[u]) continue;
    Buffer<float> zero(MemCategory::kComm, shards_.units()[u].shard);
    add_reduced((int)u, zero.data());
  }
}

void FileBackedShards::set_squares(int u, const void* shard) {
  const size_t base = shards_.units()[u].local_offset;
  for (int i : unit_segments_[u]) {
    const optim::AdamSegment& seg = segments_[i];
    const size_t at = seg.grad_offset - base;
    segment_squares_[i] = half() ? optim::sum_of_squares(storage_, static_cast<const uint16_t*>(shard) + at, seg.count)
                                 : optim::sum_of_squares(static_cast<const float*>(shard) + at, seg.count);
  }
}

void FileBackedShards::wait_writes() {
  store_.wait_all();
  last_write_ = 0;
}

// ---------------------------------------------------------------- working memory

size_t FileBackedShards::io_buffer_bytes(optim::ShardArray a) const {
  size_t max_shard = 0;
  for (const UnitShard& s : shards_.units()) max_shard = std::max(max_shard, s.shard);
  const size_t unit = optim::ShardStore::aligned(max_shard) * width() + optim::kIoBytes;
  return a == optim::kShardParams ? (size_t)(read_ahead_ + 1) * unit : 2 * piece_bytes();
}

size_t FileBackedShards::piece_bytes() const {
  return optim::ShardStore::aligned(store_.chunk()) * width() + optim::kIoBytes;
}

}  // namespace meshtrain::parallel
