#include "optim/offload.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <future>

#include "core/check.h"

namespace meshtrain::optim {

namespace {
size_t round_up(size_t n, size_t unit) { return (n + unit - 1) / unit * unit; }

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

Status OffloadedState::create(const std::string& dir, int rank, size_t n, int kinds, size_t chunk,
                              bool direct, std::unique_ptr<OffloadedState>* out) {
  CHECK(kinds >= 1 && kinds <= kMaxKinds);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  const std::string path = (std::filesystem::path(dir) / ("adam_state_rank" + std::to_string(rank) + ".bin")).string();
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return Status::error("--offload-dir: cannot create " + path + ": " + std::strerror(errno));
  // Arrays start at multiples of the alignment, so every chunk's file range is aligned.
  const size_t stride = round_up(n, kAlignFloats);
  // A sparse file of zeros: the moments start at zero.
  if (::ftruncate(fd, (off_t)(kinds * stride * sizeof(float))) != 0) {
    const std::string why = std::strerror(errno);
    ::close(fd);
    return Status::error("--offload-dir: cannot size " + path + ": " + why);
  }
  // At most 1/16 of the state per chunk: the three rotating buffers then hold under 20% of
  // what offloading moves out of memory, for small models too. Whole alignment units, so
  // O_DIRECT transfers are aligned in memory, in the file and in size.
  chunk = round_up(std::max<size_t>(1, std::min(chunk, (n + 15) / 16)), kAlignFloats);
  // The streaming descriptor bypasses the page cache where the file system allows it
  // (tmpfs does not: then it is an ordinary one).
  int stream = direct ? ::open(path.c_str(), O_RDWR | O_DIRECT) : -1;
  const bool is_direct = stream >= 0;
  if (!is_direct) stream = ::open(path.c_str(), O_RDWR);
  if (stream < 0) {
    const std::string why = std::strerror(errno);
    ::close(fd);
    return Status::error("--offload-dir: cannot open " + path + ": " + why);
  }
  out->reset(new OffloadedState(fd, stream, is_direct, path, n, stride, kinds, chunk));
  return Status::ok();
}

OffloadedState::OffloadedState(int fd, int stream_fd, bool direct, std::string path, size_t n,
                               size_t stride, int kinds, size_t chunk)
    : fd_(fd), stream_fd_(stream_fd), direct_(direct), path_(std::move(path)), n_(n),
      stride_(stride), chunk_(chunk), kinds_(kinds) {
  // One alignment unit more than a chunk, to start the chunk on a 4 KiB boundary.
  for (auto& slot : slots_)
    for (int k = 0; k < kinds_; k++) slot[k].allocate(MemCategory::kOptim, chunk_ + kAlignFloats);
}

float* OffloadedState::slot(int i, int kind) {
  const uintptr_t p = reinterpret_cast<uintptr_t>(slots_[i][kind].data());
  const uintptr_t align = kAlignFloats * sizeof(float);
  return reinterpret_cast<float*>((p + align - 1) / align * align);
}

OffloadedState::~OffloadedState() {
  ::close(stream_fd_);
  ::close(fd_);
  std::error_code ec;
  std::filesystem::remove(path_, ec);
}

// Moves count floats of array `kind` at element `begin` between the file and buf; a disk
// error ends the job (the optimizer cannot continue without its state).
void OffloadedState::io(int fd, bool write, int kind, size_t begin, size_t count, float* buf,
                        bool counted) {
  const double t0 = now_s();
  char* p = reinterpret_cast<char*>(buf);
  size_t left = count * sizeof(float);
  off_t at = (off_t)(((size_t)kind * stride_ + begin) * sizeof(float));
  while (left > 0) {
    const ssize_t done = write ? ::pwrite(fd, p, left, at) : ::pread(fd, p, left, at);
    if (done < 0 && errno == EINTR) continue;
    CHECK_MSG(done > 0, "offloaded optimizer state: pread/pwrite failed (disk full or removed?)");
    p += done, left -= (size_t)done, at += done;
  }
  if (!counted) return;
  (write ? stats_.bytes_written : stats_.bytes_read) += (int64_t)(count * sizeof(float));
  stats_.io_s += now_s() - t0;
}

void OffloadedState::for_each_chunk(
    const std::function<void(size_t begin, size_t end, float* const* arrays)>& update) {
  const size_t chunks = (n_ + chunk_ - 1) / chunk_;
  auto range = [&](size_t i) { return std::pair{i * chunk_, std::min(n_, (i + 1) * chunk_)}; };
  // Whole alignment units (the last chunk's tail is padding inside the array's stride).
  auto transfer = [&](bool write, size_t i) {
    auto [b, e] = range(i);
    for (int k = 0; k < kinds_; k++)
      io(stream_fd_, write, k, b, round_up(e - b, kAlignFloats), slot(i % 3, k));
  };
  if (chunks == 0) return;
  transfer(false, 0);
  for (size_t i = 0; i < chunks; i++) {
    // In the background: write the previous chunk back, read the next one.
    auto background = std::async(std::launch::async, [&, i] {
      if (i > 0) transfer(true, i - 1);
      if (i + 1 < chunks) transfer(false, i + 1);
    });
    auto [b, e] = range(i);
    float* arrays[kMaxKinds];
    for (int k = 0; k < kinds_; k++) arrays[k] = slot(i % 3, k);
    update(b, e, arrays);
    const double t0 = now_s();
    background.get();
    stats_.wait_s += now_s() - t0;
  }
  transfer(true, chunks - 1);
}

// Through the page cache (any buffer alignment); Linux keeps it coherent with O_DIRECT.
void OffloadedState::read(int kind, float* dst) { io(fd_, false, kind, 0, n_, dst, false); }
void OffloadedState::write(int kind, size_t begin, size_t count, const float* src) {
  CHECK(begin + count <= n_);
  io(fd_, true, kind, begin, count, const_cast<float*>(src), false);
}

void OffloadedState::read(int kind, size_t begin, size_t count, float* dst) {
  CHECK(begin + count <= n_);
  io(fd_, false, kind, begin, count, dst, false);
}
void OffloadedState::write(int kind, const float* src) {
  io(fd_, true, kind, 0, n_, const_cast<float*>(src), false);
}

}  // namespace meshtrain::optim
