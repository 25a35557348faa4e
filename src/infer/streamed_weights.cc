#include "infer/streamed_weights.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "core/check.h"
#include "core/clock.h"

namespace meshtrain::infer {

namespace {

constexpr uint64_t kIoBytes = 4096;  // O_DIRECT's alignment of offsets, lengths and buffers
uint64_t aligned_bytes(size_t elements) { return (elements * sizeof(float) + kIoBytes - 1) / kIoBytes * kIoBytes; }

bool resident_unit(const model::ParamLayout& layout, int u) {
  return u == layout.embedding_unit() || u == layout.final_unit();
}

// Each layer's units (its block's and its experts'), in unit order.
std::vector<std::vector<int>> layer_units(const model::ParamLayout& layout) {
  std::vector<std::vector<int>> out;
  for (int u = 0; u < layout.num_units(); u++) {
    if (resident_unit(layout, u)) continue;
    if (layout.units()[u].expert < 0) out.emplace_back();  // a block starts a layer
    out.back().push_back(u);
  }
  return out;
}

}  // namespace

int64_t StreamedWeights::resident_bytes(const model::ParamLayout& layout) {
  int64_t bytes = 0;
  for (int u = 0; u < layout.num_units(); u++)
    if (resident_unit(layout, u)) bytes += (int64_t)layout.units()[u].numel * (int64_t)sizeof(float);
  return bytes;
}

int64_t StreamedWeights::buffer_bytes(const model::ParamLayout& layout, int read_ahead) {
  uint64_t largest = 0;
  for (const auto& units : layer_units(layout)) {
    size_t n = 0;
    for (int u : units) n += layout.units()[u].numel;
    largest = std::max(largest, aligned_bytes(n));
  }
  return (int64_t)((largest + kIoBytes) * (uint64_t)(read_ahead + 1));  // + alignment room
}

StreamedWeights::StreamedWeights(const model::ParamLayout& layout, int read_ahead)
    : layout_(layout), read_ahead_(read_ahead) {}

Status StreamedWeights::create(const model::ParamLayout& layout, const std::string& dir, int read_ahead,
                               std::unique_ptr<StreamedWeights>* out) {
  if (read_ahead < 0) return Status::error("the read-ahead must be >= 0 layers");
  std::unique_ptr<StreamedWeights> s(new StreamedWeights(layout, read_ahead));
  s->unit_layer_.assign(layout.num_units(), -1);
  s->resident_at_.assign(layout.num_units(), 0);
  size_t resident = 0;
  for (int u = 0; u < layout.num_units(); u++)
    if (resident_unit(layout, u)) s->resident_at_[u] = resident, resident += layout.units()[u].numel;
  s->resident_.allocate(MemCategory::kParams, resident);
  uint64_t file_bytes = 0, largest = 0;
  for (const auto& units : layer_units(layout)) {
    Layer l;
    l.begin = layout.units()[units[0]].offset;
    for (int u : units) {
      CHECK_MSG(layout.units()[u].offset == l.begin + l.count, "a layer's units are not contiguous");
      l.count += layout.units()[u].numel;
      s->unit_layer_[u] = (int)s->layers_.size();
    }
    l.file_offset = file_bytes;
    l.file_bytes = aligned_bytes(l.count);
    file_bytes += l.file_bytes;
    largest = std::max(largest, l.file_bytes);
    s->layers_.push_back(l);
  }
  s->path_ = dir + "/zero_inference_weights_" + std::to_string(::getpid()) + ".bin";
  s->fd_ = ::open(s->path_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (s->fd_ < 0) return Status::error("cannot create " + s->path_ + ": " + std::strerror(errno));
  if (::ftruncate(s->fd_, (off_t)file_bytes) != 0)
    return Status::error("cannot size " + s->path_ + ": " + std::strerror(errno));
  s->direct_fd_ = ::open(s->path_.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
  s->direct_ = s->direct_fd_ >= 0;  // tmpfs has no O_DIRECT: the page cache then
  if (!s->direct_) s->direct_fd_ = s->fd_;
  for (int i = 0; i <= read_ahead; i++) {
    Buffer<float> raw(MemCategory::kParams, (largest + kIoBytes) / sizeof(float));
    const uintptr_t p = reinterpret_cast<uintptr_t>(raw.data());
    s->slots_.push_back(reinterpret_cast<float*>((p + kIoBytes - 1) / kIoBytes * kIoBytes));
    s->raw_slots_.push_back(std::move(raw));
    s->free_slots_.push_back(i);
  }
  StreamedWeights* self = s.get();
  s->thread_ = std::thread([self] { self->reader(); });
  *out = std::move(s);
  return Status::ok();
}

StreamedWeights::~StreamedWeights() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (direct_ && direct_fd_ >= 0) ::close(direct_fd_);
  if (fd_ >= 0) ::close(fd_);
  if (!path_.empty()) ::unlink(path_.c_str());
}

Status StreamedWeights::write(size_t at, size_t n, const float* values) {
  while (n > 0) {
    int u = 0;  // the unit holding element `at`
    while (u + 1 < layout_.num_units() && layout_.units()[u + 1].offset <= at) u++;
    const auto& unit = layout_.units()[u];
    const size_t c = std::min(n, unit.offset + unit.numel - at);
    if (unit_layer_[u] < 0) {
      std::memcpy(resident_.data() + resident_at_[u] + (at - unit.offset), values, c * sizeof(float));
    } else {
      const Layer& l = layers_[unit_layer_[u]];
      const uint64_t offset = l.file_offset + (at - l.begin) * sizeof(float);
      for (size_t done = 0; done < c * sizeof(float);) {
        const ssize_t w = ::pwrite(fd_, reinterpret_cast<const char*>(values) + done, c * sizeof(float) - done,
                                   (off_t)(offset + done));
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return Status::error("cannot write " + path_ + ": " + std::strerror(errno));
        done += (size_t)w;
      }
    }
    at += c, n -= c, values += c;
  }
  return Status::ok();
}

Status StreamedWeights::finish_writes() {
  if (::fdatasync(fd_) != 0) return Status::error("cannot flush " + path_ + ": " + std::strerror(errno));
  ::posix_fadvise(fd_, 0, 0, POSIX_FADV_DONTNEED);
  return Status::ok();
}

void StreamedWeights::start_read(int index) {
  Layer& l = layers_[index];
  CHECK(!free_slots_.empty());
  l.slot = free_slots_.back();
  free_slots_.pop_back();
  char* dst = reinterpret_cast<char*>(slots_[l.slot]);
  const uint64_t offset = l.file_offset, bytes = l.file_bytes;
  std::lock_guard<std::mutex> lock(mu_);
  l.ticket = ++submitted_;
  queue_.push_back([this, dst, offset, bytes] {
    const auto t0 = std::chrono::steady_clock::now();
    for (uint64_t done = 0; done < bytes;) {
      const ssize_t r = ::pread(direct_fd_, dst + done, bytes - done, (off_t)(offset + done));
      if (r < 0 && errno == EINTR) continue;
      CHECK_MSG(r > 0, ("reading streamed weights from " + path_ + " failed: " + std::strerror(errno)).c_str());
      done += (uint64_t)r;
    }
    std::lock_guard<std::mutex> lock(mu_);
    stats_.layers_read++;
    stats_.bytes_read += (int64_t)bytes;
    stats_.read_s += seconds_since(t0);
  });
  cv_.notify_all();
}

void StreamedWeights::wait_ticket(uint64_t t) {
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return done_ >= t; });
  stats_.wait_s += seconds_since(t0);
}

void StreamedWeights::reader() {
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    job();
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_++;
    }
    cv_.notify_all();
  }
}

const float* StreamedWeights::acquire_params(int u) {
  const int index = unit_layer_[u];
  if (index < 0) return resident_.data() + resident_at_[u];
  Layer& l = layers_[index];
  if (l.slot < 0) {
    if (free_slots_.empty()) {  // out of order: give up a layer read ahead
      for (Layer& other : layers_)
        if (other.slot >= 0 && other.holds == 0) {
          wait_ticket(other.ticket);
          free_slots_.push_back(other.slot);
          other.slot = -1;
          break;
        }
    }
    start_read(index);
  }
  wait_ticket(l.ticket);
  if (l.holds++ == 0)  // the layer reached: read the next ones into free buffers
    for (int i = 1; i <= read_ahead_; i++) {
      const int next = (index + i) % (int)layers_.size();
      if (layers_[next].slot < 0 && !free_slots_.empty()) start_read(next);
    }
  return slots_[l.slot] + (layout_.units()[u].offset - l.begin);
}

void StreamedWeights::release_params(int u) {
  const int index = unit_layer_[u];
  if (index < 0) return;
  Layer& l = layers_[index];
  CHECK(l.holds > 0);
  if (--l.holds > 0) return;
  free_slots_.push_back(l.slot);
  l.slot = -1;
}

float* StreamedWeights::acquire_grads(int) {
  CHECK_MSG(false, "streamed weights are for inference: no gradients");
  return nullptr;
}

StreamedWeights::Stats StreamedWeights::stats() const {
  // Reads still in flight (a read-ahead past the last layer) are finished first, so what is
  // reported does not depend on how far the reading thread has got.
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return done_ >= submitted_; });
  return stats_;
}

}  // namespace meshtrain::infer
