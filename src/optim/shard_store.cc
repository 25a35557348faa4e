#include "optim/shard_store.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "core/check.h"

namespace meshtrain::optim {

namespace {
double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

const char* shard_array_name(ShardArray a) {
  static const char* names[kShardArrays] = {"adam_m", "adam_v", "master_weights", "params", "grads"};
  return names[a];
}

IoBuffer::IoBuffer(MemCategory category, size_t count, size_t width) : count_(count), width_(width) {
  // 4 KiB more, to start on a 4 KiB boundary; whole alignment units after it.
  raw_.allocate(category, (ShardStore::aligned(count) * width + kIoBytes) / kFloat);
  const uintptr_t p = reinterpret_cast<uintptr_t>(raw_.data());
  data_ = reinterpret_cast<void*>((p + kIoBytes - 1) / kIoBytes * kIoBytes);
}

ShardStore::ShardStore(size_t n) : n_(n), stride_(aligned(n)), chunk_(aligned(std::max<size_t>(1, (n + 15) / 16))) {}

ShardStore::~ShardStore() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  for (Array& a : arrays_) {
    if (a.fd < 0) continue;
    ::close(a.stream_fd);
    ::close(a.fd);
    std::error_code ec;
    std::filesystem::remove(a.path, ec);
  }
}

void ShardStore::add(ShardArray a, MemCategory category, size_t width) {
  CHECK(!arrays_[a].present && (width == kFloat || width == kWord));
  arrays_[a].present = true;
  arrays_[a].width = width;
  arrays_[a].memory.allocate(category, n_ * width / kWord);
}

unsigned ShardStore::arrays() const {
  unsigned mask = 0;
  for (int a = 0; a < kShardArrays; a++)
    if (arrays_[a].present) mask |= bit((ShardArray)a);
  return mask;
}

Status ShardStore::add_state(bool master_weights, const StateFiles* files) {
  if (files) set_chunk(files->chunk);
  for (ShardArray a : {kMomentM, kMomentV, kMasterWeights}) {
    if (a == kMasterWeights && !master_weights) break;
    if (!files || a == kMasterWeights) {
      add(a, MemCategory::kOptim);
      continue;
    }
    RETURN_IF_ERROR(add_file(a, files->dir, files->rank, files->direct));
  }
  return Status::ok();
}

Status ShardStore::move_state_to_files(const std::string& dir, int rank, size_t chunk, bool direct) {
  set_chunk(chunk);
  for (ShardArray a : {kMomentM, kMomentV, kMasterWeights})
    if (has(a) && !in_file(a)) RETURN_IF_ERROR(move_to_file(a, dir, rank, direct));
  return Status::ok();
}

bool ShardStore::any_in_file(unsigned mask) const {
  for (int a = 0; a < kShardArrays; a++)
    if ((mask & (1u << a)) && arrays_[a].fd >= 0) return true;
  return false;
}

Status ShardStore::open_file(ShardArray a, const std::string& dir, int rank, bool direct) {
  Array& arr = arrays_[a];
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  const std::string path = (std::filesystem::path(dir) /
                            (std::string(shard_array_name(a)) + "_rank" + std::to_string(rank) + ".bin")).string();
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return Status::error("--offload-dir: cannot create " + path + ": " + std::strerror(errno));
  // Whole alignment units: the last chunk's tail is padding inside the file. Sparse: a
  // zero array costs no disk until it is written.
  if (::ftruncate(fd, (off_t)(stride_ * arr.width)) != 0) {
    const std::string why = std::strerror(errno);
    ::close(fd);
    return Status::error("--offload-dir: cannot size " + path + ": " + why);
  }
  // The per-step descriptor bypasses the page cache where the file system allows it
  // (tmpfs does not: then it is an ordinary one).
  int stream = direct ? ::open(path.c_str(), O_RDWR | O_DIRECT) : -1;
  arr.direct = stream >= 0;
  if (stream < 0) stream = ::open(path.c_str(), O_RDWR);
  if (stream < 0) {
    const std::string why = std::strerror(errno);
    ::close(fd);
    return Status::error("--offload-dir: cannot open " + path + ": " + why);
  }
  arr.fd = fd, arr.stream_fd = stream, arr.path = path;
  return Status::ok();
}

Status ShardStore::add_file(ShardArray a, const std::string& dir, int rank, bool direct, size_t width) {
  CHECK(!arrays_[a].present && (width == kFloat || width == kWord));
  arrays_[a].width = width;
  RETURN_IF_ERROR(open_file(a, dir, rank, direct));
  arrays_[a].present = true;
  return Status::ok();
}

Status ShardStore::move_to_file(ShardArray a, const std::string& dir, int rank, bool direct) {
  Array& arr = arrays_[a];
  CHECK_MSG(arr.present && arr.fd < 0, "move_to_file: the array is absent or already in a file");
  RETURN_IF_ERROR(open_file(a, dir, rank, direct));
  // A zero array stays a hole; anything else is written once.
  const auto* bytes = reinterpret_cast<const unsigned char*>(arr.memory.data());
  if (std::any_of(bytes, bytes + (size_t)arr.memory.bytes(), [](unsigned char b) { return b != 0; }))
    io(a, arr.fd, true, 0, n_, arr.memory.data(), nullptr);
  arr.memory.release();
  return Status::ok();
}

void ShardStore::set_chunk(size_t chunk) {
  chunk_ = aligned(std::max<size_t>(1, std::min(chunk, (n_ + 15) / 16)));
  for (Array& a : arrays_)
    for (IoBuffer& s : a.slots) s.release();
}

// Moves count elements of array a at element `begin` between its file and buf; a disk error
// ends the job (training cannot continue without its state).
void ShardStore::io(ShardArray a, int fd, bool write, size_t begin, size_t count, void* buf,
                    const Traffic* traffic) {
  const double t0 = now_s();
  const size_t width = arrays_[a].width;
  char* p = static_cast<char*>(buf);
  size_t left = count * width;
  off_t at = (off_t)(begin * width);
  while (left > 0) {
    const ssize_t done = write ? ::pwrite(fd, p, left, at) : ::pread(fd, p, left, at);
    if (done < 0 && errno == EINTR) continue;
    CHECK_MSG(done > 0, "offloaded shard: pread/pwrite failed (disk full or file removed?)");
    p += done, left -= (size_t)done, at += done;
  }
  if (!traffic) return;
  const double dt = now_s() - t0;
  const auto bytes = (int64_t)(count * width);
  std::lock_guard<std::mutex> lock(mu_);
  for (IoStats* st : {(IoStats*)&stats_, &stats_.by[(int)*traffic]}) {
    (write ? st->bytes_written : st->bytes_read) += bytes;
    st->io_s += dt;
  }
}

ShardStore::Ticket ShardStore::submit(std::function<void()> job) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!thread_.joinable()) thread_ = std::thread([this] { worker(); });
  queue_.push_back(std::move(job));
  cv_.notify_all();
  return ++submitted_;
}

void ShardStore::worker() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, nothing left
    std::function<void()> job = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    job();
    job = nullptr;  // a write's buffer is freed before the request counts as done
    lock.lock();
    done_++;
    cv_.notify_all();
  }
}

void ShardStore::wait(Ticket t, Traffic traffic) {
  const double t0 = now_s();
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return done_ >= t; });
  const double dt = now_s() - t0;
  stats_.wait_s += dt;
  stats_.by[(int)traffic].wait_s += dt;
}

void ShardStore::wait_all(Traffic traffic) {
  Ticket t;
  {
    std::lock_guard<std::mutex> lock(mu_);
    t = submitted_;
  }
  wait(t, traffic);
}

ShardStore::Ticket ShardStore::read_async(ShardArray a, size_t begin, size_t count, void* dst, Traffic traffic) {
  CHECK(in_file(a) && begin % kAlign == 0 && begin + count <= n_);
  return submit([this, a, begin, count, dst, traffic] {
    io(a, arrays_[a].stream_fd, false, begin, aligned(count), dst, &traffic);
  });
}

ShardStore::Ticket ShardStore::write_async(ShardArray a, size_t begin, size_t count, IoBuffer&& src,
                                           Traffic traffic) {
  CHECK(in_file(a) && begin % kAlign == 0 && begin + count <= n_ && src.size() >= count &&
        src.width() == arrays_[a].width);
  auto buffer = std::make_shared<IoBuffer>(std::move(src));
  return submit([this, a, begin, count, buffer, traffic] {
    io(a, arrays_[a].stream_fd, true, begin, aligned(count), buffer->bytes(), &traffic);
    buffer->release();
  });
}

ShardStore::Ticket ShardStore::write_async(ShardArray a, size_t begin, size_t count, const void* src,
                                           Traffic traffic) {
  CHECK(in_file(a) && begin % kAlign == 0 && begin + count <= n_);
  return submit([this, a, begin, count, src, traffic] {
    io(a, arrays_[a].stream_fd, true, begin, aligned(count), const_cast<void*>(src), &traffic);
  });
}

void ShardStore::read(ShardArray a, size_t begin, size_t count, void* dst) {
  CHECK(has(a) && begin + count <= n_);
  const size_t w = arrays_[a].width;
  if (!in_file(a)) return (void)std::memcpy(dst, reinterpret_cast<const char*>(data(a)) + begin * w, count * w);
  wait_all();
  io(a, arrays_[a].fd, false, begin, count, dst, nullptr);
}

void ShardStore::write(ShardArray a, size_t begin, size_t count, const void* src) {
  CHECK(has(a) && begin + count <= n_);
  const size_t w = arrays_[a].width;
  if (!in_file(a)) return (void)std::memcpy(reinterpret_cast<char*>(data(a)) + begin * w, src, count * w);
  wait_all();
  io(a, arrays_[a].fd, true, begin, count, const_cast<void*>(src), nullptr);
}

ChunkPointers ShardStore::advanced(const ChunkPointers& arrays, size_t n) const {
  ChunkPointers out;
  for (int a = 0; a < kShardArrays; a++)
    if (arrays.p[a]) out.p[a] = static_cast<char*>(arrays.p[a]) + n * arrays_[a].width;
  return out;
}

void ShardStore::for_each_chunk(unsigned mask, unsigned write_mask, const ChunkUpdate& update) {
  CHECK((write_mask & ~mask) == 0);
  const size_t chunks = (n_ + chunk_ - 1) / chunk_;
  if (chunks == 0) return;
  auto streamed = [&](int a, unsigned m) { return (m & (1u << a)) && arrays_[a].fd >= 0; };
  for (int a = 0; a < kShardArrays; a++)
    if (streamed(a, mask))
      for (IoBuffer& s : arrays_[a].slots)
        if (s.empty()) s = IoBuffer(MemCategory::kOptim, chunk_, arrays_[a].width);
  // Whole alignment units (the last chunk's tail is padding inside the file).
  auto transfer = [&](bool write, size_t i) {
    const size_t b = i * chunk_, count = std::min(n_, b + chunk_) - b;
    Ticket last = 0;
    for (int a = 0; a < kShardArrays; a++) {
      if (!streamed(a, write ? write_mask : mask)) continue;
      void* buf = arrays_[a].slots[i % 3].bytes();
      const ShardArray arr = (ShardArray)a;
      last = submit([this, arr, b, count, buf, write] {
        const Traffic update = Traffic::kUpdate;
        io(arr, arrays_[arr].stream_fd, write, b, aligned(count), buf, &update);
      });
    }
    return last;
  };
  // Three buffers rotate: chunk i is updated while i - 1 is written and i + 1 read; the
  // queue's order makes the write of i - 1 finish before i + 2 reuses its buffer.
  Ticket ready = transfer(false, 0);
  for (size_t i = 0; i < chunks; i++) {
    if (ready) wait(ready, Traffic::kUpdate);
    if (i > 0) transfer(true, i - 1);
    ready = i + 1 < chunks ? transfer(false, i + 1) : 0;
    const size_t b = i * chunk_, e = std::min(n_, b + chunk_);
    ChunkPointers ptrs;
    for (int a = 0; a < kShardArrays; a++) {
      if (!(mask & (1u << a))) continue;
      Array& arr = arrays_[a];
      ptrs.p[a] = arr.fd >= 0 ? arr.slots[i % 3].bytes() : reinterpret_cast<char*>(arr.memory.data()) + b * arr.width;
    }
    update(b, e, ptrs);
  }
  if (Ticket t = transfer(true, chunks - 1)) wait(t, Traffic::kUpdate);
}

void ShardStore::for_each_run(const std::vector<AdamSegment>& segments, unsigned mask, unsigned write_mask,
                              const RunUpdate& update, const ChunkUpdate& after_chunk) {
  if (!any_in_file(mask)) {
    ChunkPointers whole;
    for (int a = 0; a < kShardArrays; a++)
      if (mask & (1u << a)) whole.p[a] = data((ShardArray)a);
    for (const AdamSegment& s : segments) update(s, 0, s.count, advanced(whole, s.state_offset));
    if (after_chunk) after_chunk(0, size(), whole);
    return;
  }
  // Chunk by chunk of the store: the segments' parts that fall into it.
  for_each_chunk(mask, write_mask, [&](size_t begin, size_t end, const ChunkPointers& chunk) {
    for (const AdamSegment& s : segments) {
      const size_t a = std::max(begin, s.state_offset), b = std::min(end, s.state_offset + s.count);
      if (a >= b) continue;
      update(s, a - s.state_offset, b - s.state_offset, advanced(chunk, a - begin));
    }
    if (after_chunk) after_chunk(begin, end, chunk);
  });
}

size_t ShardStore::streaming_bytes(unsigned mask) const {
  size_t bytes = 0;
  for (int a = 0; a < kShardArrays; a++)
    if ((mask & (1u << a)) && arrays_[a].fd >= 0 && arrays_[a].slots[0].empty())
      bytes += 3 * (aligned(chunk_) * arrays_[a].width + kIoBytes);
  return bytes;
}

OffloadStats ShardStore::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void ShardStore::reset_stats() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_ = {};
}

}  // namespace meshtrain::optim
