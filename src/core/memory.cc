#include "core/memory.h"

#include <omp.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>

namespace meshtrain {

namespace {
std::mutex& tracker_mutex() {
  static std::mutex m;
  return m;
}
}  // namespace

std::string_view mem_category_name(MemCategory c) {
  switch (c) {
    case MemCategory::kParams: return "params";
    case MemCategory::kGrads: return "grads";
    case MemCategory::kOptim: return "optim";
    case MemCategory::kActivations: return "activations";
    case MemCategory::kWorkspace: return "workspace";
    case MemCategory::kComm: return "comm";
    case MemCategory::kGathered: return "gathered";
    default: return "?";
  }
}

MemoryTracker& MemoryTracker::instance() {
  static MemoryTracker tracker;
  return tracker;
}

void MemoryTracker::on_alloc(MemCategory c, int64_t bytes) {
  std::lock_guard lock(tracker_mutex());
  int i = static_cast<int>(c);
  stats_.current[i] += bytes;
  if (stats_.current[i] > stats_.peak[i]) stats_.peak[i] = stats_.current[i];
  stats_.total_current += bytes;
  if (stats_.total_current > stats_.total_peak) stats_.total_peak = stats_.total_current;
}

void MemoryTracker::on_free(MemCategory c, int64_t bytes) {
  std::lock_guard lock(tracker_mutex());
  stats_.current[static_cast<int>(c)] -= bytes;
  stats_.total_current -= bytes;
}

MemStats MemoryTracker::stats() const {
  std::lock_guard lock(tracker_mutex());
  return stats_;
}

void MemoryTracker::reset_peaks() {
  std::lock_guard lock(tracker_mutex());
  stats_.peak = stats_.current;
  stats_.total_peak = stats_.total_current;
}

void zero_bytes(void* p, size_t bytes) {
  constexpr size_t kBlock = 1 << 20;
  char* c = static_cast<char*>(p);
#pragma omp parallel for schedule(static) if (bytes >= 4 * kBlock && !omp_in_parallel())
  for (size_t b = 0; b < bytes; b += kBlock) std::memset(c + b, 0, std::min(kBlock, bytes - b));
}

namespace {

std::string gb(double bytes) {
  char t[32];
  std::snprintf(t, sizeof t, bytes >= 1e8 ? "%.2f GB" : "%.3g MB", bytes >= 1e8 ? bytes / 1e9 : bytes / 1e6);
  return t;
}

std::string allocation_failure(MemCategory category, size_t bytes) {
  return "out of memory: allocating " + gb((double)bytes) + " for " + std::string(mem_category_name(category)) +
         " failed; " + describe_tracked_memory() +
         " (a smaller --micro-batch, --seq-len or model, --recompute full, or more ranks need less)";
}

}  // namespace

std::string describe_tracked_memory() {
  const MemStats s = MemoryTracker::instance().stats();
  std::string parts;
  for (int c = 0; c < kNumMemCategories; c++)
    if (s.current[c] > 0)
      parts += (parts.empty() ? "" : ", ") + std::string(mem_category_name((MemCategory)c)) + " " +
               gb((double)s.current[c]);
  return "this process's tracked buffers held " + gb((double)s.total_current) +
         (parts.empty() ? "" : " (" + parts + ")") +
         ", its peak resident set was " + gb((double)peak_rss_bytes());
}

void* tracked_alloc(MemCategory category, size_t bytes) {
  if (bytes == 0) return nullptr;
  size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded);
  if (!p) throw AllocationError(allocation_failure(category, bytes));
  zero_bytes(p, rounded);
  MemoryTracker::instance().on_alloc(category, static_cast<int64_t>(bytes));
  return p;
}

void tracked_free(MemCategory category, void* ptr, size_t bytes) {
  if (!ptr) return;
  std::free(ptr);
  MemoryTracker::instance().on_free(category, static_cast<int64_t>(bytes));
}

int64_t peak_rss_bytes() {
  struct rusage usage {};
  if (getrusage(RUSAGE_SELF, &usage) != 0) return 0;
  return (int64_t)usage.ru_maxrss * 1024;  // Linux reports KiB
}

}  // namespace meshtrain
