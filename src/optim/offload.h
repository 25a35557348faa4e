// Optimizer state on disk (ZeRO-Infinity's NVMe offload, Rajbhandari et al. 2021): AdamW's
// state arrays of this rank's shard (the two moments, and the fp32 master weights of a
// mixed-precision run) live in one file, [m | v | master], and each optimizer step streams
// them through a few chunk-sized buffers. The next chunk is read and the previous
// one written by a background I/O task while the current chunk is updated (three buffers
// rotate: reading, updating, writing), so disk time overlaps the update.
//
// I/O is pread/pwrite. The streaming uses O_DIRECT where the file system supports it, so
// the state does not sit in the page cache either (chunks, buffers and the arrays' file
// offsets are 4 KiB aligned); elsewhere (tmpfs) it goes through the page cache. The
// resident set is what the tracker counts: the chunk buffers, not the file.
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

class OffloadedState {
 public:
  static constexpr int kMaxKinds = 3;
  // Creates (truncates) DIR/adam_state_rank<R>.bin for `kinds` arrays of `n` elements, all
  // zero, streamed `chunk` elements at a time (at most n/16, rounded up).
  // `direct`: stream with O_DIRECT where the file system supports it.
  static Status create(const std::string& dir, int rank, size_t n, int kinds, size_t chunk, bool direct,
                       std::unique_ptr<OffloadedState>* out);
  ~OffloadedState();

  size_t size() const { return n_; }
  const std::string& path() const { return path_; }
  int kinds() const { return kinds_; }
  bool direct_io() const { return direct_; }  // streaming bypasses the page cache
  // Calls update(begin, end, arrays) for every chunk [begin, end) of the state in order,
  // arrays[k] pointing at the chunk's elements of array k in memory; writes them back
  // afterwards.
  void for_each_chunk(const std::function<void(size_t begin, size_t end, float* const* arrays)>& update);
  // Whole-array copies (setup, checkpoints), kind in [0, kinds()); not in stats().
  void read(int kind, float* dst);
  void read(int kind, size_t begin, size_t count, float* dst);  // elements [begin, begin + count)
  void write(int kind, size_t begin, size_t count, const float* src);
  void write(int kind, const float* src);
  const OffloadStats& stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }

 private:
  static constexpr size_t kAlignFloats = 1024;  // 4 KiB, O_DIRECT's alignment
  OffloadedState(int fd, int stream_fd, bool direct, std::string path, size_t n, size_t stride,
                 int kinds, size_t chunk);
  // `counted`: part of a step's streaming (stats_), not a whole-array copy.
  void io(int fd, bool write, int kind, size_t begin, size_t count, float* buf, bool counted = true);
  float* slot(int i, int kind);  // rotating buffer i of array `kind`, 4 KiB aligned

  int fd_;         // through the page cache: setup and checkpoints
  int stream_fd_;  // O_DIRECT where supported: the per-step streaming
  bool direct_;
  std::string path_;
  size_t n_, stride_, chunk_;  // stride_: elements between arrays in the file
  int kinds_;
  Buffer<float> slots_[3][kMaxKinds];  // three rotating chunk buffers per array
  OffloadStats stats_;
};

}  // namespace meshtrain::optim
