// Optimizer state on disk (ZeRO-Infinity's NVMe offload, Rajbhandari et al. 2021): AdamW's
// two moments of this rank's shard live in one file, [m | v], and each optimizer step
// streams them through a few chunk-sized buffers. The next chunk is read and the previous
// one written by a background I/O task while the current chunk is updated (three buffers
// rotate: reading, updating, writing), so disk time overlaps the update.
//
// I/O is pread/pwrite through the page cache; O_DIRECT is not used (the buffers would need
// 4 KiB alignment and sizes); the resident set is what the tracker counts, the chunk
// buffers, not the file.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "core/memory.h"
#include "core/status.h"

namespace meshtrain::optim {

struct OffloadStats {
  int64_t bytes_read = 0, bytes_written = 0;
  double io_s = 0;       // time the I/O task spent in pread/pwrite
  double wait_s = 0;     // time the update waited for I/O (not hidden)
};

class OffloadedMoments {
 public:
  // Creates (truncates) DIR/adam_moments_rank<R>.bin for `n` elements of m and of v, all
  // zero, streamed `chunk` elements at a time (at most n/16, rounded up).
  static Status create(const std::string& dir, int rank, size_t n, size_t chunk,
                       std::unique_ptr<OffloadedMoments>* out);
  ~OffloadedMoments();

  size_t size() const { return n_; }
  const std::string& path() const { return path_; }
  // Calls update(begin, end, m, v) for every chunk [begin, end) of the state in order, with
  // m and v pointing at the chunk's elements in memory; writes them back afterwards.
  void for_each_chunk(const std::function<void(size_t begin, size_t end, float* m, float* v)>& update);
  // Whole-state copies (checkpoints): kind 0 is m, 1 is v.
  void read(int kind, float* dst);
  void write(int kind, const float* src);
  const OffloadStats& stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }

 private:
  OffloadedMoments(int fd, std::string path, size_t n, size_t chunk);
  void io(bool write, int kind, size_t begin, size_t count, float* buf);

  int fd_;
  std::string path_;
  size_t n_, chunk_;
  Buffer<float> slots_[3][2];  // three rotating (m, v) chunk buffers
  OffloadStats stats_;
};

}  // namespace meshtrain::optim
