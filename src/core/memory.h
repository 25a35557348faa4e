// Tracked memory: every buffer the engine allocates belongs to a category, and the
// tracker keeps current and peak bytes per category, so reports are measured, not guessed.
#pragma once
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <new>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace meshtrain {

// kGathered: ZeRO-3's working set of all-gathered units, kept apart from kParams so that
// sharded parameter bytes stay exactly 4Ψ/N. kComm: reduction buckets and staging buffers.
enum class MemCategory : int {
  kParams, kGrads, kOptim, kActivations, kWorkspace, kComm, kGathered, kCount
};
inline constexpr int kNumMemCategories = static_cast<int>(MemCategory::kCount);
std::string_view mem_category_name(MemCategory c);

struct MemStats {
  std::array<int64_t, kNumMemCategories> current{};
  std::array<int64_t, kNumMemCategories> peak{};
  int64_t total_current = 0;
  int64_t total_peak = 0;  // peak of the sum, not the sum of peaks
};

// The process's peak resident set so far (getrusage's ru_maxrss), in bytes: everything,
// tracked or not (the tracker counts this engine's buffers only).
int64_t peak_rss_bytes();

class MemoryTracker {
 public:
  static MemoryTracker& instance();
  void on_alloc(MemCategory c, int64_t bytes);
  void on_free(MemCategory c, int64_t bytes);
  MemStats stats() const;
  // Starts a new measurement window: peaks are set to current values.
  void reset_peaks();

 private:
  MemStats stats_;
};

// An owning, 64-byte aligned, zero-initialised array of T whose bytes are tracked.
template <typename T>
class Buffer {
 public:
  Buffer() = default;
  Buffer(MemCategory category, size_t count) { allocate(category, count); }
  ~Buffer() { release(); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  Buffer(Buffer&& o) noexcept { *this = static_cast<Buffer&&>(o); }
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      release();
      data_ = o.data_, count_ = o.count_, category_ = o.category_;
      o.data_ = nullptr, o.count_ = 0;
    }
    return *this;
  }

  void allocate(MemCategory category, size_t count);
  void release();

  T* data() { return data_; }
  const T* data() const { return data_; }
  MemCategory category() const { return category_; }
  size_t size() const { return count_; }
  int64_t bytes() const { return static_cast<int64_t>(count_ * sizeof(T)); }
  bool empty() const { return count_ == 0; }
  T& operator[](size_t i) { return data_[i]; }
  const T& operator[](size_t i) const { return data_[i]; }
  T* begin() { return data_; }
  T* end() { return data_ + count_; }
  const T* begin() const { return data_; }
  const T* end() const { return data_ + count_; }

 private:
  T* data_ = nullptr;
  size_t count_ = 0;
  MemCategory category_ = MemCategory::kWorkspace;
};

// memset(p, 0, bytes), split over the OpenMP threads when large (a serial memset of the
// per-step gradient buffers kept one core busy while the other waited).
void zero_bytes(void* p, size_t bytes);

// Keeps freed buffers for reuse by the next request of the same category and size: a
// buffer allocated and freed many times per step (a unit's widened weights, its gradient
// accumulator) would otherwise fault in and zero fresh pages every time. Spares stay
// allocated, and tracked, until clear(), until more than `max_spares` are kept, or until a
// buffer of the same category and another size is asked for (so a spare of one size, such
// as the embeddings' after the forward pass, does not sit beside the next buffers of
// another). Buffers under 64 KiB are not kept: their pages cost little.
template <typename T>
class BufferPool {
 public:
  explicit BufferPool(size_t max_spares = 6) : max_spares_(max_spares) {}
  // A buffer of `count` elements: a spare if one fits exactly (zeroed when `zero`), else new
  // (always zero).
  Buffer<T> take(MemCategory category, size_t count, bool zero) {
    for (size_t i = 0; i < spares_.size(); i++) {
      if (spares_[i].category() != category || spares_[i].size() != count) continue;
      Buffer<T> b = static_cast<Buffer<T>&&>(spares_[i]);
      spares_.erase(spares_.begin() + (long)i);
      if (zero) zero_bytes(b.data(), b.bytes());
      return b;
    }
    std::erase_if(spares_, [&](const Buffer<T>& s) { return s.category() == category; });
    return Buffer<T>(category, count);
  }
  void give(Buffer<T>&& b) {
    if (b.bytes() < kMinBytes) return b.release();
    spares_.push_back(static_cast<Buffer<T>&&>(b));
    if (spares_.size() > max_spares_) spares_.erase(spares_.begin());  // the oldest goes
  }
  void clear() { spares_.clear(); }

 private:
  static constexpr int64_t kMinBytes = 64 * 1024;
  size_t max_spares_;
  std::vector<Buffer<T>> spares_;
};

// A tracked allocation that failed: a std::bad_alloc whose what() names the buffer's
// category and size and what the tracked buffers held then, so that the error a user sees
// says which allocation ran out of memory rather than "std::bad_alloc".
class AllocationError : public std::bad_alloc {
 public:
  explicit AllocationError(std::string message) : message_(std::move(message)) {}
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  std::string message_;
};

// "the tracked buffers held 1.2 GB (params 0.4 GB, ...); peak resident set 1.5 GB": the
// words for an out-of-memory error from an allocation outside the tracker (a std::vector,
// a library), which cannot name itself.
std::string describe_tracked_memory();

// Throws AllocationError when the memory is not there.
void* tracked_alloc(MemCategory category, size_t bytes);
void tracked_free(MemCategory category, void* ptr, size_t bytes);

template <typename T>
void Buffer<T>::allocate(MemCategory category, size_t count) {
  release();
  category_ = category;
  count_ = count;
  data_ = static_cast<T*>(tracked_alloc(category, count * sizeof(T)));
}

template <typename T>
void Buffer<T>::release() {
  if (data_) tracked_free(category_, data_, count_ * sizeof(T));
  data_ = nullptr;
  count_ = 0;
}

}  // namespace meshtrain
