// A rank's shard of the model states: AdamW's moments, its fp32 master weights, and (ZeRO-3)
// the parameter and gradient shards, n elements each, every array either in memory or in a
// file of its own (ZeRO-Infinity's NVMe tier, Rajbhandari et al. 2021). The arrays share
// their indexing, so one streaming pass can update several of them chunk by chunk.
//
// An array holds fp32 values (4-byte elements) or 16-bit words (2-byte elements: a bf16 or
// fp16 run's ZeRO-3 parameter and gradient shards); element i of every array belongs to
// the same parameter.
//
// The store hands its shards to an optimizer step run by run (for_each_run): the step owns
// no storage, and the same step runs on arrays in memory or streamed from files.
//
// File-backed arrays are moved with pread/pwrite by one background I/O thread, in the order
// the requests were made (a read issued after a write of the same range sees it). Per-step
// traffic (streaming, the asynchronous per-unit reads and writes) uses O_DIRECT where the
// file system supports it, so the states do not sit in the page cache either: its ranges
// and lengths are whole kAlign elements (4 KiB of 16-bit words, 8 KiB of floats) and its
// buffers 4 KiB aligned (IoBuffer). Whole-array copies for setup and checkpoints go through
// the page cache at any alignment; Linux keeps the two views coherent. The resident set is
// what the tracker counts: buffers, not files.
#pragma once
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/memory.h"
#include "core/status.h"

namespace meshtrain::optim {

// The arrays of a shard store; the first three are the optimizer's state.
enum ShardArray : int { kMomentM = 0, kMomentV = 1, kMasterWeights = 2, kShardParams = 3, kShardGrads = 4 };
constexpr int kShardArrays = 5;
constexpr unsigned bit(ShardArray a) { return 1u << a; }
const char* shard_array_name(ShardArray a);

struct IoStats {
  int64_t bytes_read = 0, bytes_written = 0;
  double io_s = 0;    // time the I/O thread spent in pread/pwrite
  double wait_s = 0;  // time compute waited for I/O (exposed); io_s - wait_s was hidden
};
// Per-unit traffic (ZeRO-3's parameter reads and gradient writes during forward and
// backward, hidden behind the units' compute) and the update's streaming (hidden behind
// AdamW's arithmetic, which is far cheaper than the bytes it touches).
enum class Traffic : int { kUnits = 0, kUpdate = 1 };
struct OffloadStats : IoStats {  // the totals
  IoStats by[2];                 // per Traffic
};

constexpr size_t kIoBytes = 4096;  // O_DIRECT's alignment of offsets, lengths and buffers
constexpr size_t kFloat = 4, kWord = 2;  // element widths: fp32 values, 16-bit words

// A buffer of `count` elements of `width` bytes whose start is 4 KiB aligned, with room for
// whole kAlign elements (ShardStore::aligned(count)), for O_DIRECT transfers.
class IoBuffer {
 public:
  IoBuffer() = default;
  IoBuffer(MemCategory category, size_t count, size_t width = kFloat);
  IoBuffer(IoBuffer&& o) noexcept { *this = static_cast<IoBuffer&&>(o); }
  IoBuffer& operator=(IoBuffer&& o) noexcept {  // the source is left empty
    raw_ = static_cast<Buffer<float>&&>(o.raw_);
    data_ = o.data_, count_ = o.count_, width_ = o.width_;
    o.data_ = nullptr, o.count_ = 0;
    return *this;
  }
  void* bytes() const { return data_; }
  float* data() const { return static_cast<float*>(data_); }          // fp32 elements
  uint16_t* words() const { return static_cast<uint16_t*>(data_); }   // 16-bit elements
  size_t size() const { return count_; }
  size_t width() const { return width_; }
  // Elements of this width it can hold (whole alignment units).
  size_t capacity() const { return data_ ? ((size_t)raw_.bytes() - kIoBytes) / width_ : 0; }
  bool empty() const { return data_ == nullptr; }
  void release() { raw_.release(), data_ = nullptr, count_ = 0; }

 private:
  Buffer<float> raw_;
  void* data_ = nullptr;
  size_t count_ = 0, width_ = kFloat;
};

// Element `begin` of each array a for_each_chunk or a streamed update asks for (null where
// not asked for): fp32 arrays through f(), 16-bit ones through h().
struct ChunkPointers {
  void* p[kShardArrays] = {};
  float* f(ShardArray a) const { return static_cast<float*>(p[a]); }
  uint16_t* h(ShardArray a) const { return static_cast<uint16_t*>(p[a]); }
};

// A run of elements updated alike: param/grad/state offsets into their own buffers (a
// ZeRO shard keeps moments locally while parameters may live in a full buffer).
struct AdamSegment {
  size_t param_offset = 0, grad_offset = 0, state_offset = 0, count = 0;
  bool decay = false;
  bool tp_copy = false;  // another tensor-parallel rank holds these elements and counts them
  int unit = -1;               // the layout unit the elements belong to
};

// The parameters an update wrote, elements [begin, end) of the store (floats or 16-bit
// words), as each chunk is written.
using ParamsWritten = std::function<void(size_t begin, size_t end, const void* params)>;

class ShardStore {
 public:
  // Elements per alignment unit: 4 KiB of 16-bit words (and so 8 KiB of floats).
  static constexpr size_t kAlign = kIoBytes / kWord;
  static size_t aligned(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
  using Ticket = uint64_t;  // an asynchronous request; wait() for it

  explicit ShardStore(size_t n);
  ~ShardStore();
  ShardStore(const ShardStore&) = delete;
  ShardStore& operator=(const ShardStore&) = delete;

  size_t size() const { return n_; }
  // Adds array a in memory, all zero, counted under `category`; `width`: kFloat or kWord.
  void add(ShardArray a, MemCategory category, size_t width = kFloat);
  bool has(ShardArray a) const { return arrays_[a].present; }
  size_t width(ShardArray a) const { return arrays_[a].width; }
  bool in_file(ShardArray a) const { return arrays_[a].fd >= 0; }
  bool any_in_file(unsigned mask) const;
  bool direct_io(ShardArray a) const { return arrays_[a].direct; }
  // The array in memory; null while it is in a file. data(): an fp32 array, words(): 16-bit.
  float* data(ShardArray a) { return reinterpret_cast<float*>(arrays_[a].memory.data()); }
  const float* data(ShardArray a) const { return reinterpret_cast<const float*>(arrays_[a].memory.data()); }
  uint16_t* words(ShardArray a) { return arrays_[a].memory.data(); }
  const uint16_t* words(ShardArray a) const { return arrays_[a].memory.data(); }
  // Adds array a in a new file, all zero (a sparse file: no memory, no disk yet).
  Status add_file(ShardArray a, const std::string& dir, int rank, bool direct, size_t width = kFloat);
  // Moves array a, with its current values, into DIR/<name>_rank<R>.bin (created or
  // truncated), and frees its memory. `direct`: O_DIRECT for the per-step traffic where the
  // file system supports it. The file is removed with the store.
  Status move_to_file(ShardArray a, const std::string& dir, int rank, bool direct);
  const std::string& path(ShardArray a) const { return arrays_[a].path; }
  unsigned arrays() const;  // the mask of the arrays present

  // The optimizer's state: m and v, and with master_weights the fp32 master weights, all
  // zero, counted as optimizer memory. `files`: m and v start in files there (a model
  // larger than memory never holds them); the master weights start in memory, to be set
  // from the parameters and moved by move_state_to_files.
  struct StateFiles {
    std::string dir;
    int rank = 0;
    bool direct = true;
    size_t chunk = 0;  // streamed elements (set_chunk)
  };
  Status add_state(bool master_weights, const StateFiles* files = nullptr);
  // Moves the state not yet in files into files under `dir`, streamed `chunk` elements at a
  // time by every update; the in-memory arrays are freed. An update's arithmetic is the same
  // element by element, so losses are bit-identical.
  Status move_state_to_files(const std::string& dir, int rank, size_t chunk, bool direct = true);

  // Elements per streamed chunk (a multiple of kAlign, at most n/16 rounded up, so the three
  // rotating buffers of an array hold under a fifth of it).
  void set_chunk(size_t chunk);
  size_t chunk() const { return chunk_; }
  // The rotating buffers for_each_chunk will allocate for the file arrays of `mask` (they
  // are made on first use).
  size_t streaming_bytes(unsigned mask) const;
  // Calls update(begin, end, arrays) for every chunk [begin, end) in order, arrays pointing
  // at element `begin` of each array in `mask` (the array itself in memory, a rotating
  // buffer for a file), and writes the file arrays of `write_mask` back. The next chunk is
  // read and the previous one written while `update` runs.
  using ChunkUpdate = std::function<void(size_t begin, size_t end, const ChunkPointers& arrays)>;
  void for_each_chunk(unsigned mask, unsigned write_mask, const ChunkUpdate& update);
  // `arrays` moved on by n elements, each by its array's width.
  ChunkPointers advanced(const ChunkPointers& arrays, size_t n) const;
  // The shards handed to an update: calls update(segment, from, to, arrays) for every
  // segment's elements [from, to) in state order, arrays pointing at element `from`'s entry
  // of each array in `mask` (in memory, or in a streamed chunk); file arrays in write_mask
  // are written back. after_chunk(begin, end, arrays), if set, follows the runs of each
  // chunk (in memory: once, over the whole store).
  using RunUpdate = std::function<void(const AdamSegment& segment, size_t from, size_t to, const ChunkPointers& arrays)>;
  void for_each_run(const std::vector<AdamSegment>& segments, unsigned mask, unsigned write_mask,
                    const RunUpdate& update, const ChunkUpdate& after_chunk = {});

  // Asynchronous transfers of a file array, through the O_DIRECT descriptor: `begin` a
  // multiple of kAlign, the buffer aligned(count) elements long (whole alignment units
  // move). A write owns its buffer until it is done.
  Ticket read_async(ShardArray a, size_t begin, size_t count, void* dst, Traffic traffic = Traffic::kUnits);
  Ticket write_async(ShardArray a, size_t begin, size_t count, IoBuffer&& src, Traffic traffic = Traffic::kUnits);
  // The same from a buffer the caller keeps (aligned(count) elements, 4 KiB aligned) until
  // the write is done.
  Ticket write_async(ShardArray a, size_t begin, size_t count, const void* src, Traffic traffic = Traffic::kUnits);
  // The time spent here is the traffic's wait_s.
  void wait(Ticket t, Traffic traffic = Traffic::kUnits);
  void wait_all(Traffic traffic = Traffic::kUnits);

  // Synchronous copies of elements [begin, begin + count) at any alignment, through the
  // page cache where the array is in a file (after every asynchronous request); not in
  // stats().
  void read(ShardArray a, size_t begin, size_t count, void* dst);
  void write(ShardArray a, size_t begin, size_t count, const void* src);
  void read(ShardArray a, void* dst) { read(a, 0, n_, dst); }
  void write(ShardArray a, const void* src) { write(a, 0, n_, src); }

  OffloadStats stats() const;
  void reset_stats();

 private:
  struct Array {
    bool present = false;
    size_t width = kFloat;  // bytes per element
    Buffer<uint16_t> memory;  // n elements of `width` bytes, as 2-byte halves (exact sizes)
    int fd = -1;         // through the page cache: setup and checkpoints
    int stream_fd = -1;  // O_DIRECT where supported: per-step traffic
    bool direct = false;
    std::string path;
    IoBuffer slots[3];  // for_each_chunk's rotating chunk buffers
  };
  Status open_file(ShardArray a, const std::string& dir, int rank, bool direct);
  // traffic null: a whole-array copy, not in stats().
  void io(ShardArray a, int fd, bool write, size_t begin, size_t count, void* buf, const Traffic* traffic);
  Ticket submit(std::function<void()> job);
  void worker();

  size_t n_, stride_, chunk_;
  Array arrays_[kShardArrays];

  // The I/O thread and its FIFO queue; stats_ is guarded by mu_.
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  Ticket submitted_ = 0, done_ = 0;
  bool stop_ = false;
  std::thread thread_;
  OffloadStats stats_;
};

}  // namespace meshtrain::optim
