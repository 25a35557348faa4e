#include "comm/self_group.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>

#include "core/check.h"
#include "core/clock.h"

namespace meshtrain::comm {

namespace {

std::atomic<double> g_comm_timeout{0.0};
std::atomic<int64_t> g_current_step{-1};
std::atomic<int> g_world_rank{-1};
std::atomic<std::string (*)()> g_timeout_report{nullptr};
// The compute thread's current wait (current_wait): set and cleared by WaitScope.
std::mutex g_wait_mu;
WaitState g_wait;
std::chrono::steady_clock::time_point g_wait_since;
// set_step_listener's callback, called under its mutex (set and called from any thread).
std::mutex g_listener_mu;
std::function<void()> g_step_listener;

// A request that was finished when it was made.
class DoneRequest final : public Request {
 public:
  void wait() override {}
  bool done() override { return true; }
};

bool env_present(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && v[0] != '\0';
}

}  // namespace

const char* comm_op_name(CommOp op) {
  switch (op) {
    case CommOp::kAllReduce:
      return "all_reduce";
    case CommOp::kReduceScatter:
      return "reduce_scatter";
    case CommOp::kAllGather:
      return "all_gather";
    case CommOp::kBroadcast:
      return "broadcast";
    case CommOp::kAllToAll:
      return "all_to_all";
    case CommOp::kAllToAllV:
      return "all_to_allv";
    case CommOp::kSend:
      return "send";
    case CommOp::kRecv:
      return "recv";
    case CommOp::kBarrier:
      return "barrier";
  }
  return "?";
}

int64_t comm_bytes(CommOp op, size_t n, int group_size, size_t elem_bytes) {
  CHECK(group_size >= 1);
  const int64_t N = group_size;
  const int64_t elems = static_cast<int64_t>(n);
  int64_t sent = 0;  // elements
  switch (op) {
    case CommOp::kAllReduce:
      sent = std::llround(2.0 * static_cast<double>(N - 1) * static_cast<double>(elems) /
                          static_cast<double>(N));
      break;
    case CommOp::kReduceScatter:
    case CommOp::kAllGather:
    case CommOp::kAllToAll:
      sent = (N - 1) * elems;
      break;
    case CommOp::kBroadcast:
      sent = N == 1 ? 0 : elems;
      break;
    case CommOp::kSend:
    case CommOp::kAllToAllV:
      sent = elems;
      break;
    case CommOp::kRecv:
    case CommOp::kBarrier:
      sent = 0;
      break;
  }
  return sent * static_cast<int64_t>(elem_bytes);
}

// ---- SelfGroup ----

SelfGroup::SelfGroup(std::string axis) : Group(std::move(axis)) {}

template <typename F>
RequestPtr SelfGroup::run(CommOp op, size_t n, size_t elem_bytes, F&& copy) {
  const auto t0 = std::chrono::steady_clock::now();
  copy();
  const double t = seconds_since(t0);
  stats_.bytes += comm_bytes(op, n, 1, elem_bytes);
  stats_.calls += 1;
  stats_.busy_s += t;
  stats_.wait_s += t;
  return std::make_unique<DoneRequest>();
}

RequestPtr SelfGroup::iall_reduce(float* buf, size_t n, ReduceOp op) {
  return run(CommOp::kAllReduce, n, sizeof(float), [] {});
}

RequestPtr SelfGroup::ireduce_scatter(const float* send, float* recv, size_t n, ReduceOp op) {
  return run(CommOp::kReduceScatter, n, sizeof(float), [&] {
    if (n > 0 && send != recv) std::memmove(recv, send, n * sizeof(float));
  });
}

RequestPtr SelfGroup::iall_gather(const float* send, float* recv, size_t n) {
  return run(CommOp::kAllGather, n, sizeof(float), [&] {
    if (n > 0 && send != recv) std::memmove(recv, send, n * sizeof(float));
  });
}

RequestPtr SelfGroup::iall_gather(const uint16_t* send, uint16_t* recv, size_t n) {
  return run(CommOp::kAllGather, n, sizeof(uint16_t), [&] {
    if (n > 0 && send != recv) std::memmove(recv, send, n * sizeof(uint16_t));
  });
}

RequestPtr SelfGroup::iall_gather(const uint8_t* send, uint8_t* recv, size_t n) {
  return run(CommOp::kAllGather, n, 1, [&] {
    if (n > 0 && send != recv) std::memmove(recv, send, n);
  });
}

RequestPtr SelfGroup::ibroadcast(float* buf, size_t n, int root) {
  CHECK_MSG(root == 0, "broadcast root out of range for a single-rank group");
  return run(CommOp::kBroadcast, n, sizeof(float), [] {});
}

RequestPtr SelfGroup::iall_to_all(const float* send, float* recv, size_t n) {
  return run(CommOp::kAllToAll, n, sizeof(float), [&] {
    if (n > 0 && send != recv) std::memmove(recv, send, n * sizeof(float));
  });
}

RequestPtr SelfGroup::iall_to_all(const uint8_t* send, uint8_t* recv, size_t n) {
  return run(CommOp::kAllToAll, n, 1, [&] {
    if (n > 0 && send != recv) std::memmove(recv, send, n);
  });
}

RequestPtr SelfGroup::iall_to_allv(const float* send, const size_t* send_counts, float* recv,
                                   const size_t* recv_counts) {
  CHECK_MSG(send_counts[0] == recv_counts[0], "all_to_allv: a single rank sends itself what it receives");
  const size_t n = send_counts[0];
  return run(CommOp::kAllToAllV, 0, sizeof(float), [&] {
    if (n > 0) std::memmove(recv, send, n * sizeof(float));
  });
}

RequestPtr SelfGroup::isend(const float* buf, size_t n, int peer, int tag) {
  CHECK_MSG(false, "send on a single-rank group: there is no peer");
  return nullptr;
}

RequestPtr SelfGroup::irecv(float* buf, size_t n, int peer, int tag) {
  CHECK_MSG(false, "recv on a single-rank group: there is no peer");
  return nullptr;
}

void SelfGroup::all_reduce_f64(double* buf, size_t n, ReduceOp op) {
  run(CommOp::kAllReduce, n, sizeof(double), [] {});
}

void SelfGroup::barrier() {
  run(CommOp::kBarrier, 0, 0, [] {});
}

std::unique_ptr<Group> SelfGroup::split(int color, int key, const std::string& axis) {
  return std::make_unique<SelfGroup>(axis);
}

// ---- process-wide state ----

void set_comm_timeout(double seconds) { g_comm_timeout.store(seconds > 0 ? seconds : 0.0); }
void set_current_step(int64_t step) {
  if (g_current_step.exchange(step) == step) return;
  std::lock_guard<std::mutex> lk(g_listener_mu);
  if (g_step_listener) g_step_listener();
}
void set_step_listener(std::function<void()> listener) {
  std::lock_guard<std::mutex> lk(g_listener_mu);
  g_step_listener = std::move(listener);
}
int64_t current_step() { return g_current_step.load(); }
void set_timeout_report(std::string (*report)()) { g_timeout_report.store(report); }

WaitState current_wait() {
  std::lock_guard<std::mutex> lk(g_wait_mu);
  WaitState w = g_wait;
  if (!w.op.empty()) w.waited_s = seconds_since(g_wait_since);
  return w;
}

bool launched_by_mpi() {
  return env_present("OMPI_COMM_WORLD_SIZE") || env_present("PMI_SIZE") ||
         env_present("PMIX_RANK") || (env_present("SLURM_NTASKS") && env_present("SLURM_PROCID"));
}

namespace detail {

double comm_timeout() { return g_comm_timeout.load(); }
int64_t current_step() { return g_current_step.load(); }
int world_rank() { return g_world_rank.load(); }
void set_world_rank(int rank) { g_world_rank.store(rank); }

void print_error(const std::string& message) {
  std::fflush(stdout);
  const int rank = world_rank();
  if (rank >= 0) {
    std::fprintf(stderr, "[rank %d] meshtrain: error: %s\n", rank, message.c_str());
  } else {
    std::fprintf(stderr, "meshtrain: error: %s\n", message.c_str());
  }
  std::fflush(stderr);
}

WaitScope::WaitScope(const char* op, const std::string& axis) {
  std::lock_guard<std::mutex> lk(g_wait_mu);
  g_wait.op = op;
  g_wait.axis = axis;
  g_wait_since = std::chrono::steady_clock::now();
}

WaitScope::~WaitScope() {
  std::lock_guard<std::mutex> lk(g_wait_mu);
  g_wait.op.clear();
  g_wait.axis.clear();
}

[[noreturn]] void timeout_abort(const char* op, const std::string& axis, double seconds) {
  print_error(timeout_message(op, axis, seconds));
  std::string (*report)() = g_timeout_report.exchange(nullptr);
  std::string text = report ? report() : "";
  if (!text.empty()) print_error(text);
  abort_job("", kExitCommFailure);
}

std::string timeout_message(const char* op, const std::string& axis, double seconds) {
  char s[32];
  std::snprintf(s, sizeof s, "%g", seconds);
  return std::string("comm timeout: ") + op + " on axis " + axis + " at step " +
         std::to_string(current_step()) + " on rank " + std::to_string(std::max(world_rank(), 0)) +
         " did not finish within " + s + " s";
}

}  // namespace detail

#ifndef MESHTRAIN_HAVE_MPI
// A build without MPI: every process is a world of its own.

namespace {
bool g_initialised = false;
}

std::unique_ptr<Group> init_world(int* argc, char*** argv) {
  CHECK_MSG(!g_initialised, "init_world called twice");
  g_initialised = true;
  if (launched_by_mpi()) {
    const char* size = std::getenv("OMPI_COMM_WORLD_SIZE");
    if (size == nullptr) size = std::getenv("PMI_SIZE");
    if (size == nullptr) size = std::getenv("SLURM_NTASKS");
    if (size != nullptr && std::atoi(size) > 1) {
      detail::print_error(
          "this meshtrain was built without MPI (MESHTRAIN_WITH_MPI=OFF) but was "
          "launched as one of " +
          std::string(size) + " ranks; rebuild with MPI or run it without mpirun");
      std::exit(1);
    }
  }
  return std::make_unique<SelfGroup>("world");
}

void finalize() {}

[[noreturn]] void abort_job(const std::string& message, int exit_code) {
  if (!message.empty()) detail::print_error(message);
  std::exit(exit_code);
}
#endif

}  // namespace meshtrain::comm
