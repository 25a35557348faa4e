// ZeRO-Inference's weights (DeepSpeed-Inference, Aminabadi et al. 2022): a model whose
// weights do not fit in memory keeps its transformer layers in a file and reads each one in
// as the decoder reaches it, `read_ahead` layers ahead so that the reading overlaps the
// previous layers' compute. Reads use O_DIRECT where the file system has it, so the layers
// do not settle in the page cache either; what is in memory is what the tracker counts.
//
// A layer is its block's unit and its routed experts' units: one contiguous range of the
// flat layout (ParamLayout's unit order), stored 4 KiB aligned in the file. The embedding
// and final-norm units (with a tied or untied head) stay in memory: every step reads them
// whole for the head. In memory at most: those units plus read_ahead + 1 buffers of the
// largest layer.
//
// The decoder reaches layers in order, wrapping from the last to the first between steps,
// and holds one at a time (its experts' units inside it): acquire_params of a block unit
// waits for its layer (reading it now if it was not read ahead), then starts reading the
// next read_ahead layers into free buffers.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/memory.h"
#include "core/status.h"
#include "model/param_store.h"

namespace meshtrain::infer {

class StreamedWeights : public model::ParamStore {
 public:
  // For the whole-model `layout` (which must outlive the store): the layers' file in `dir`
  // (created; removed with the store).
  static Status create(const model::ParamLayout& layout, const std::string& dir, int read_ahead,
                       std::unique_ptr<StreamedWeights>* out);
  ~StreamedWeights() override;

  // What it keeps in memory, computed before anything is allocated: the resident units, and
  // the layer buffers.
  static int64_t resident_bytes(const model::ParamLayout& layout);
  static int64_t buffer_bytes(const model::ParamLayout& layout, int read_ahead);

  // Setup: elements [at, at + n) of the flat parameters, into memory or the file.
  Status write(size_t at, size_t n, const float* values);
  // After the last write: the file's pages leave the page cache.
  Status finish_writes();

  const float* acquire_params(int u) override;
  void release_params(int u) override;
  float* acquire_grads(int u) override;  // inference only: fails

  bool direct_io() const { return direct_; }
  int read_ahead() const { return read_ahead_; }
  struct Stats {
    int64_t layers_read = 0, bytes_read = 0;
    double read_s = 0;  // the reading thread's time in pread
    double wait_s = 0;  // the decoder's time waiting for a layer (the reading not hidden)
  };
  Stats stats() const;  // after the reads in flight finish

 private:
  StreamedWeights(const model::ParamLayout& layout, int read_ahead);
  struct Layer {
    size_t begin = 0, count = 0;  // elements of the flat layout
    uint64_t file_offset = 0, file_bytes = 0;  // 4 KiB multiples
    int slot = -1;                // its buffer while read or being read
    uint64_t ticket = 0;          // its read's
    int holds = 0;                // acquisitions not released
  };
  void start_read(int l);  // into a free buffer (one must be free)
  void wait_ticket(uint64_t t);
  void reader();

  const model::ParamLayout& layout_;
  const int read_ahead_;
  std::vector<int> unit_layer_;  // per unit: its layer, or -1 (resident)
  std::vector<Layer> layers_;
  Buffer<float> resident_;           // the resident units, at their flat offsets less resident_base_
  std::vector<size_t> resident_at_;  // per unit: its offset in resident_ (resident units)
  std::vector<Buffer<float>> raw_slots_;
  std::vector<float*> slots_;        // 4 KiB aligned views into raw_slots_
  std::vector<int> free_slots_;
  std::string path_;
  int fd_ = -1, direct_fd_ = -1;
  bool direct_ = false;

  // The reading thread and its FIFO of reads.
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  uint64_t submitted_ = 0, done_ = 0;
  bool stop_ = false;
  Stats stats_;
  std::thread thread_;
};

}  // namespace meshtrain::infer
