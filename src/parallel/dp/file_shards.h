// ZeRO-Infinity's traffic for ZeRO-3 shards that live in files (ShardStore's kShardParams
// and kShardGrads: fp32 values, or a 16-bit run's bf16/fp16 words), unit by unit,
// overlapping compute:
//  - parameters: a unit's shard is read ahead of its use (each rank reads only its own
//    shard; the all-gather assembles the unit from the read buffer), and the update hands
//    the next forward's first shards over as it writes them;
//  - gradients: a unit's reduced shard is added to what the step wrote before (if anything)
//    and written back in pieces, one write in flight, its sums of squares taken on the way,
//    so the norm needs no second read. 16-bit words are summed as add_to_half sums them
//    (in fp32, rounded once) and squared as they were rounded.
// Either array may be in memory instead; the calls for it are then not made (params_in_file,
// grads_in_file). The arithmetic is the in-memory shards', element by element.
#pragma once
#include <vector>

#include "optim/adamw.h"
#include "optim/shard_store.h"
#include "parallel/shard_layout.h"

namespace meshtrain::parallel {

class FileBackedShards {
 public:
  // `segments`: the optimizer's, over the local shard (each within one unit).
  // `read_ahead`: parameter shards in flight ahead of use, in units (at least 1).
  // `storage`: the shards' element format (kFp32, or the 16-bit format of their words).
  FileBackedShards(optim::ShardStore& store, const ShardLayout& shards,
                   const std::vector<optim::AdamSegment>& segments, int read_ahead,
                   kernels::Precision storage = kernels::Precision::kFp32);

  bool params_in_file() const { return store_.in_file(optim::kShardParams); }
  bool grads_in_file() const { return store_.in_file(optim::kShardGrads); }
  int read_ahead() const { return read_ahead_; }

  // --- parameters (params_in_file) ---
  // Issues the reads of `units` whose shard is not read or being read already.
  void read(const std::vector<int>& units);
  // Unit u's shard (floats or 16-bit words), its read waited for (issued now if it was
  // not); `holder` keeps the buffer until the all-gather from it completes (then give_back it).
  const void* take(int u, optim::IoBuffer* holder);
  void give_back(optim::IoBuffer&& buffer);
  // Reads issued and not taken are dropped (before the parameters change).
  void drop_reads();
  // For the update: copies the updated shards of `units` into their read buffers as the
  // update writes them, so the next forward does not read them back.
  optim::ParamsWritten hand_over(const std::vector<int>& units);

  // --- gradients (grads_in_file) ---
  void begin_step();  // no unit's gradient written yet
  // Adds unit u's reduced fp32 shard (its owned part) to the step's sum so far and writes it.
  void add_reduced(int u, const float* reduced);
  // Writes a zero gradient for the units no backward reached this step.
  void fill_unwritten();
  // After a unit's shard was rewritten whole (the tied embedding's sum, floats or words):
  // its sums of squares.
  void set_squares(int u, const void* shard);
  // Optimizer segment i's sum of squares of the gradient written last.
  double squares(size_t segment) const { return segment_squares_[segment]; }
  void wait_writes();  // every write done (the exposed part, if any, counted so)

  // --- working memory, for a memory budget ---
  // Per-unit transfers: parameter shards read ahead and the one being gathered, or
  // gradient pieces summed and written.
  size_t io_buffer_bytes(optim::ShardArray a) const;
  size_t piece_bytes() const;  // one streamed chunk's buffer

 private:
  struct ShardRead {
    optim::IoBuffer buffer;
    optim::ShardStore::Ticket ticket = 0;
  };
  optim::IoBuffer take_buffer(size_t n);  // reused: fresh pages cost a fault each
  bool half() const { return storage_ != kernels::Precision::kFp32; }
  size_t width() const { return half() ? optim::kWord : optim::kFloat; }
  // Piece g (n elements, unit u's owned part from element b) += reduced; squares taken.
  void sum_piece(int u, size_t b, size_t n, const float* reduced, optim::IoBuffer& piece,
                 std::vector<optim::SumOfSquaresStream>& squares);

  optim::ShardStore& store_;
  const ShardLayout& shards_;
  const std::vector<optim::AdamSegment>& segments_;
  int read_ahead_;
  kernels::Precision storage_;
  std::vector<ShardRead> reads_;            // per unit
  std::vector<optim::IoBuffer> spares_;     // read buffers given back
  std::vector<char> grad_written_;          // per unit, this step
  optim::ShardStore::Ticket last_write_ = 0;
  optim::IoBuffer pieces_[2];               // summed and written in turn
  int next_piece_ = 0;
  std::vector<double> segment_squares_;
  std::vector<std::vector<int>> unit_segments_;
};

}  // namespace meshtrain::parallel
