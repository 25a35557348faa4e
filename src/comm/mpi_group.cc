#include "comm/mpi_group.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "core/check.h"
#include "core/clock.h"
#include "core/profile.h"
#include "trace/trace.h"

namespace meshtrain::comm {

using Clock = std::chrono::steady_clock;

namespace {

MPI_Op to_mpi(ReduceOp op) { return op == ReduceOp::kSum ? MPI_SUM : MPI_MAX; }

// MPI counts are int. Collectives whose buffers exceed that are a configuration we do not
// support yet (all_reduce and broadcast are split into chunks instead).
int to_count(size_t n, const char* what) {
  CHECK_MSG(n <= static_cast<size_t>(INT_MAX), what);
  return static_cast<int>(n);
}
constexpr size_t kMaxChunk = size_t{1} << 30;

}  // namespace

// One operation on the comm thread: either a blocking body (collectives, split, free) or
// a post function that starts a non-blocking point-to-point op completed by polling.
struct CommTask {
  const char* name = "";
  std::function<void()> body;
  std::function<void(MPI_Request*)> post;
  bool is_recv = false;
  size_t recv_count = 0;
  int peer = -1, tag = -1;
  std::string axis;  // for error messages

  Clock::time_point posted;  // comm thread only
  double busy_s = 0;         // written before `finished` is set
  std::atomic<bool> started{false};  // a post function has run (the op is in flight)
  std::atomic<bool> finished{false};
  std::mutex mu;
  std::condition_variable cv;

  int64_t bytes = -1;        // traffic counted for the stats (-1: untracked, not traced)

  void mark_started() {
    {
      std::lock_guard<std::mutex> lk(mu);
      started.store(true, std::memory_order_release);
    }
    cv.notify_all();
  }
  // Blocks until the comm thread has posted this op.
  void wait_started() {
    std::unique_lock<std::mutex> lk(mu);
    cv.wait(lk, [&] { return started.load(std::memory_order_acquire); });
  }

  void finish(double busy) {
    busy_s = busy;
    auto& tracer = trace::Tracer::instance();
    if (bytes >= 0 && tracer.enabled()) {
      const double end = trace::Tracer::now_us();
      tracer.record(trace::Lane::kComm, std::string(name) + " " + axis,
                    post ? trace::category::kP2p : trace::category::kCollective, end - busy * 1e6,
                    end, {{"axis", axis}, {"bytes", bytes}});
    }
    {
      std::lock_guard<std::mutex> lk(mu);
      finished.store(true, std::memory_order_release);
    }
    cv.notify_all();
  }
};

namespace {

// Whether this process runs on cores of its own: its affinity mask holds fewer CPUs than the
// machine (the launcher binds ranks only when each has its own cores; oversubscribed ranks
// share every CPU).
bool bound_to_own_cores() {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) return false;
  return CPU_COUNT(&allowed) < (int)std::thread::hardware_concurrency();
}

// The communication thread and its FIFO queue (see mpi_group.h).
class CommEngine {
 public:
  CommEngine() : own_cores_(bound_to_own_cores()), thread_([this] { loop(); }) {}

  // Queues `task`; true when the comm thread will reach it within microseconds: no blocking
  // operation (a collective) is queued or running before it, only posts of point-to-point
  // ops, which never block, and the process has cores of its own (oversubscribed, the
  // thread may wait for a core as long as for anything else).
  bool submit(std::shared_ptr<CommTask> task) {
    bool idle;
    {
      std::lock_guard<std::mutex> lk(mu_);
      CHECK_MSG(!stop_, "communication after finalize()");
      idle = own_cores_ && blocking_ == 0;
      if (!task->post) ++blocking_;
      queue_.push_back(std::move(task));
    }
    cv_.notify_one();
    return idle;
  }

  // A thread starts or stops waiting for a point-to-point op.
  void waiter_arrived() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      waiters_.fetch_add(1, std::memory_order_relaxed);
    }
    cv_.notify_one();
  }
  void waiter_left() { waiters_.fetch_sub(1, std::memory_order_relaxed); }
  bool waiting() const { return own_cores_ && waiters_.load(std::memory_order_relaxed) > 0; }

  // Runs everything queued, completes in-flight point-to-point ops, joins the thread.
  void stop() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }

 private:
  static constexpr int kSpinPolls = 64;        // yields before sleeping
  static constexpr int64_t kMaxSleepUs = 100;  // back-off cap while polling

  void loop() {
    pthread_setname_np(pthread_self(), "meshtrain-comm");
    int idle_polls = 0;
    for (;;) {
      std::shared_ptr<CommTask> task;
      {
        std::unique_lock<std::mutex> lk(mu_);
        if (queue_.empty()) {
          if (inflight_tasks_.empty()) {
            if (stop_) return;
            cv_.wait(lk, [&] { return !queue_.empty() || stop_; });
            continue;
          }
          lk.unlock();
          if (poll()) {
            idle_polls = 0;
            continue;
          }
          ++idle_polls;
          // A thread blocked on a point-to-point op has left its core free: poll without
          // sleeping until it is answered (a sleep would be added to its wait). Only on cores
          // of this process's own: oversubscribed, the spin would take another rank's time.
          if (idle_polls < kSpinPolls || waiting()) {
            std::this_thread::yield();
            continue;
          }
          const int shift = std::min(idle_polls - kSpinPolls, 7);
          const auto pause =
              std::chrono::microseconds(std::min<int64_t>(int64_t{1} << shift, kMaxSleepUs));
          lk.lock();
          cv_.wait_for(lk, pause, [&] { return !queue_.empty() || waiting(); });
          continue;
        }
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      idle_polls = 0;
      execute(task);
      if (!task->post) {
        std::lock_guard<std::mutex> lk(mu_);
        --blocking_;
      }
      if (!inflight_tasks_.empty()) poll();
    }
  }

  void execute(const std::shared_ptr<CommTask>& task) {
    if (task->post) {
      MPI_Request request = MPI_REQUEST_NULL;
      task->posted = Clock::now();
      task->post(&request);
      inflight_requests_.push_back(request);
      inflight_tasks_.push_back(task);
      task->mark_started();
      return;
    }
    const auto t0 = Clock::now();
    task->body();
    task->finish(seconds_since(t0));
  }

  // Tests the in-flight point-to-point ops; true when at least one completed.
  bool poll() {
    const int n = static_cast<int>(inflight_requests_.size());
    indices_.resize(n);
    statuses_.resize(n);
    int completed = 0;
    MPI_Testsome(n, inflight_requests_.data(), &completed, indices_.data(), statuses_.data());
    if (completed == MPI_UNDEFINED || completed == 0) return false;
    const auto now = Clock::now();
    for (int i = 0; i < completed; ++i) {
      const int k = indices_[i];
      std::shared_ptr<CommTask> task = std::move(inflight_tasks_[k]);
      if (task->is_recv) {
        int count = -1;
        MPI_Get_count(&statuses_[i], MPI_FLOAT, &count);
        if (count < 0 || static_cast<size_t>(count) != task->recv_count) {
          abort_job("recv on axis " + task->axis + ": expected " +
                    std::to_string(task->recv_count) + " floats from rank " +
                    std::to_string(task->peer) + " (tag " + std::to_string(task->tag) + "), got " +
                    std::to_string(count));
        }
      }
      task->finish(std::chrono::duration<double>(now - task->posted).count());
    }
    // Drop the finished entries (their requests are MPI_REQUEST_NULL now), keeping order.
    size_t out = 0;
    for (size_t k = 0; k < inflight_tasks_.size(); ++k) {
      if (!inflight_tasks_[k]) continue;
      inflight_tasks_[out] = std::move(inflight_tasks_[k]);
      inflight_requests_[out] = inflight_requests_[k];
      ++out;
    }
    inflight_tasks_.resize(out);
    inflight_requests_.resize(out);
    return true;
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<CommTask>> queue_;
  bool stop_ = false;
  int blocking_ = 0;  // collectives (tasks with a body) queued or running
  std::atomic<int> waiters_{0};  // threads blocked on a point-to-point op
  const bool own_cores_;  // bound_to_own_cores()
  // Comm thread only.
  std::vector<MPI_Request> inflight_requests_;
  std::vector<std::shared_ptr<CommTask>> inflight_tasks_;
  std::vector<int> indices_;
  std::vector<MPI_Status> statuses_;
  std::thread thread_;  // last: starts after the members above exist
};

CommEngine* g_engine = nullptr;
bool g_init_called = false;

bool mpi_running() {
  int initialised = 0, finalised = 0;
  MPI_Initialized(&initialised);
  MPI_Finalized(&finalised);
  return initialised && !finalised;
}

}  // namespace

// ---- Request ----

class MpiRequest final : public Request {
 public:
  MpiRequest(MpiGroup* group, std::shared_ptr<CommTask> task, bool track)
      : group_(group), task_(std::move(task)), track_(track) {}
  ~MpiRequest() override { wait(); }

  void wait() override {
    if (accounted_) return;
    const profile::Scope blocked(profile::Op::kCommWait);
    const auto t0 = Clock::now();
    if (!task_->finished.load(std::memory_order_acquire)) {
      const double timeout = detail::comm_timeout();
      auto is_done = [&] { return task_->finished.load(std::memory_order_acquire); };
      detail::WaitScope waiting(task_->name, group_->axis());
      const bool p2p = task_->post && g_engine != nullptr;
      if (p2p) g_engine->waiter_arrived();
      struct Left {
        bool p2p;
        ~Left() {
          if (p2p) g_engine->waiter_left();
        }
      } left{p2p};
      std::unique_lock<std::mutex> lk(task_->mu);
      if (timeout > 0) {
        if (!task_->cv.wait_for(lk, std::chrono::duration<double>(timeout), is_done)) {
          lk.unlock();
          detail::timeout_abort(task_->name, group_->axis(), timeout);
        }
      } else {
        task_->cv.wait(lk, is_done);
      }
    }
    account(seconds_since(t0));
  }

  bool done() override {
    if (accounted_) return true;
    if (!task_->finished.load(std::memory_order_acquire)) return false;
    account(0.0);
    return true;
  }

 private:
  void account(double wait_s) {
    accounted_ = true;
    if (!track_) return;
    group_->stats_.wait_s += wait_s;
    group_->stats_.busy_s += task_->busy_s;
    if (task_->bytes >= kRateMinBytes && task_->busy_s > 0)
      group_->stats_.best_bytes_per_s = std::max(group_->stats_.best_bytes_per_s, task_->bytes / task_->busy_s);
  }

  MpiGroup* group_;
  std::shared_ptr<CommTask> task_;
  bool track_;
  bool accounted_ = false;
};

// ---- MpiGroup ----

MpiGroup::MpiGroup(MPI_Comm comm, int rank, int size, std::string axis, bool owns_comm)
    : Group(std::move(axis)), comm_(comm), rank_(rank), size_(size), owns_comm_(owns_comm) {}

MpiGroup::~MpiGroup() {
  if (!owns_comm_ || g_engine == nullptr) return;  // after finalize() MPI freed it already
  auto task = std::make_shared<CommTask>();
  task->name = "comm_free";
  MPI_Comm comm = comm_;
  task->body = [comm]() mutable { MPI_Comm_free(&comm); };
  g_engine->submit(std::move(task));  // not waited: nothing refers to it any more
}

RequestPtr MpiGroup::submit(std::shared_ptr<CommTask> task, CommOp op, size_t n, size_t elem_bytes,
                            bool track, bool* idle) {
  CHECK_MSG(g_engine != nullptr, "communication after finalize()");
  task->axis = axis_;
  if (track) {
    task->bytes = comm_bytes(op, n, size_, elem_bytes);
    stats_.bytes += task->bytes;
    stats_.calls += 1;
  }
  auto request = std::make_unique<MpiRequest>(this, task, track);
  const bool was_idle = g_engine->submit(std::move(task));
  if (idle) *idle = was_idle;
  return request;
}

std::shared_ptr<CommTask> MpiGroup::collective(const char* name, std::function<void()> body) {
  auto task = std::make_shared<CommTask>();
  task->name = name;
  task->body = std::move(body);
  return task;
}

RequestPtr MpiGroup::iall_reduce(float* buf, size_t n, ReduceOp op) {
  MPI_Comm comm = comm_;
  MPI_Op mop = to_mpi(op);
  return submit(collective("all_reduce",
                           [=] {
                             size_t off = 0;
                             do {  // one call when n == 0: every rank takes part
                               const size_t count = std::min(kMaxChunk, n - off);
                               MPI_Allreduce(MPI_IN_PLACE, buf + off, static_cast<int>(count),
                                             MPI_FLOAT, mop, comm);
                               off += count;
                             } while (off < n);
                           }),
                CommOp::kAllReduce, n, sizeof(float));
}

RequestPtr MpiGroup::ireduce_scatter(const float* send, float* recv, size_t n, ReduceOp op) {
  to_count(n * static_cast<size_t>(size_), "reduce_scatter larger than 2^31 elements");
  const auto s0 = reinterpret_cast<uintptr_t>(send), r0 = reinterpret_cast<uintptr_t>(recv);
  CHECK_MSG(n == 0 || r0 + n * sizeof(float) <= s0 || s0 + n * size_ * sizeof(float) <= r0,
            "reduce_scatter: recv may not alias send");
  MPI_Comm comm = comm_;
  MPI_Op mop = to_mpi(op);
  const int block = static_cast<int>(n);
  return submit(
      collective("reduce_scatter",
                 [=] { MPI_Reduce_scatter_block(send, recv, block, MPI_FLOAT, mop, comm); }),
      CommOp::kReduceScatter, n, sizeof(float));
}

template <typename T>
RequestPtr MpiGroup::all_gather_of(const T* send, T* recv, size_t n, MPI_Datatype type) {
  to_count(n * static_cast<size_t>(size_), "all_gather larger than 2^31 elements");
  MPI_Comm comm = comm_;
  const int block = static_cast<int>(n);
  const bool in_place = send == recv + static_cast<size_t>(rank_) * n;
  return submit(collective("all_gather",
                           [=] {
                             if (in_place) {
                               MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, block,
                                             type, comm);
                             } else {
                               MPI_Allgather(send, block, type, recv, block, type, comm);
                             }
                           }),
                CommOp::kAllGather, n, sizeof(T));
}

RequestPtr MpiGroup::iall_gather(const float* send, float* recv, size_t n) {
  return all_gather_of(send, recv, n, MPI_FLOAT);
}

RequestPtr MpiGroup::iall_gather(const uint16_t* send, uint16_t* recv, size_t n) {
  return all_gather_of(send, recv, n, MPI_UINT16_T);
}

RequestPtr MpiGroup::iall_gather(const uint8_t* send, uint8_t* recv, size_t n) {
  return all_gather_of(send, recv, n, MPI_UINT8_T);
}

RequestPtr MpiGroup::ibroadcast(float* buf, size_t n, int root) {
  CHECK_MSG(root >= 0 && root < size_, "broadcast root out of range");
  MPI_Comm comm = comm_;
  return submit(collective("broadcast",
                           [=] {
                             size_t off = 0;
                             do {
                               const size_t count = std::min(kMaxChunk, n - off);
                               MPI_Bcast(buf + off, static_cast<int>(count), MPI_FLOAT, root, comm);
                               off += count;
                             } while (off < n);
                           }),
                CommOp::kBroadcast, n, sizeof(float));
}

template <typename T>
RequestPtr MpiGroup::all_to_all_of(const T* send, T* recv, size_t n, MPI_Datatype type) {
  to_count(n * static_cast<size_t>(size_), "all_to_all larger than 2^31 elements");
  MPI_Comm comm = comm_;
  const int block = static_cast<int>(n);
  const bool in_place = send == recv;
  return submit(collective("all_to_all",
                           [=] {
                             if (in_place) {
                               MPI_Alltoall(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, block, type, comm);
                             } else {
                               MPI_Alltoall(send, block, type, recv, block, type, comm);
                             }
                           }),
                CommOp::kAllToAll, n, sizeof(T));
}

RequestPtr MpiGroup::iall_to_all(const float* send, float* recv, size_t n) {
  return all_to_all_of(send, recv, n, MPI_FLOAT);
}

RequestPtr MpiGroup::iall_to_all(const uint8_t* send, uint8_t* recv, size_t n) {
  return all_to_all_of(send, recv, n, MPI_UINT8_T);
}

RequestPtr MpiGroup::iall_to_allv(const float* send, const size_t* send_counts, float* recv,
                                  const size_t* recv_counts) {
  // MPI's counts and displacements are ints: every total must stay below 2^31 elements.
  auto layout = [&](const size_t* counts, std::vector<int>* c, std::vector<int>* d) {
    size_t at = 0;
    for (int j = 0; j < size_; j++) {
      c->push_back(to_count(counts[j], "all_to_allv block larger than 2^31 elements"));
      d->push_back(to_count(at, "all_to_allv larger than 2^31 elements"));
      at += counts[j];
    }
  };
  auto sc = std::make_shared<std::vector<int>>(), sd = std::make_shared<std::vector<int>>();
  auto rc = std::make_shared<std::vector<int>>(), rd = std::make_shared<std::vector<int>>();
  layout(send_counts, sc.get(), sd.get());
  layout(recv_counts, rc.get(), rd.get());
  size_t others = 0;
  for (int j = 0; j < size_; j++) others += j == rank_ ? 0 : send_counts[j];
  MPI_Comm comm = comm_;
  return submit(collective("all_to_allv",
                           [=] {
                             MPI_Alltoallv(send, sc->data(), sd->data(), MPI_FLOAT, recv, rc->data(), rd->data(),
                                           MPI_FLOAT, comm);
                           }),
                CommOp::kAllToAllV, others, sizeof(float));
}

RequestPtr MpiGroup::isend(const float* buf, size_t n, int peer, int tag) {
  CHECK_MSG(peer >= 0 && peer < size_, "send: peer out of range");
  CHECK_MSG(tag >= 0 && tag <= 32767, "send: tag out of range [0, 32767]");
  const int count = to_count(n, "send larger than 2^31 elements");
  MPI_Comm comm = comm_;
  auto task = std::make_shared<CommTask>();
  task->name = "send";
  task->peer = peer;
  task->tag = tag;
  task->post = [=](MPI_Request* r) { MPI_Isend(buf, count, MPI_FLOAT, peer, tag, comm, r); };
  // Posted before returning when the comm thread will reach it at once (CommEngine::submit):
  // otherwise, on a core it shares with this thread's next pass, the scheduler could leave
  // it waiting for the core for milliseconds, and the peer waiting for the message (seen:
  // pp 2 1F1B sends posted 1-3 ms after their pass, on the critical path; docs/pipeline.md).
  std::shared_ptr<CommTask> posted = task;
  bool idle = false;
  RequestPtr request = submit(std::move(task), CommOp::kSend, n, sizeof(float), true, &idle);
  if (idle) posted->wait_started();
  return request;
}

RequestPtr MpiGroup::irecv(float* buf, size_t n, int peer, int tag) {
  CHECK_MSG(peer >= 0 && peer < size_, "recv: peer out of range");
  CHECK_MSG(tag >= 0 && tag <= 32767, "recv: tag out of range [0, 32767]");
  const int count = to_count(n, "recv larger than 2^31 elements");
  MPI_Comm comm = comm_;
  auto task = std::make_shared<CommTask>();
  task->name = "recv";
  task->peer = peer;
  task->tag = tag;
  task->is_recv = true;
  task->recv_count = n;
  task->post = [=](MPI_Request* r) { MPI_Irecv(buf, count, MPI_FLOAT, peer, tag, comm, r); };
  return submit(std::move(task), CommOp::kRecv, n, sizeof(float));
}

void MpiGroup::all_reduce_f64(double* buf, size_t n, ReduceOp op) {
  const int count = to_count(n, "all_reduce_f64 larger than 2^31 elements");
  MPI_Comm comm = comm_;
  MPI_Op mop = to_mpi(op);
  submit(collective("all_reduce_f64",
                    [=] { MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_DOUBLE, mop, comm); }),
         CommOp::kAllReduce, n, sizeof(double))
      ->wait();
}

void MpiGroup::barrier() {
  MPI_Comm comm = comm_;
  submit(collective("barrier", [=] { MPI_Barrier(comm); }), CommOp::kBarrier, 0, 0)->wait();
}

std::unique_ptr<Group> MpiGroup::split(int color, int key, const std::string& axis) {
  CHECK_MSG(color >= 0, "split: color must be >= 0");
  MPI_Comm comm = comm_;
  MPI_Comm out = MPI_COMM_NULL;
  int rank = -1, size = 0;
  submit(collective("split",
                    [=, &out, &rank, &size] {
                      MPI_Comm_split(comm, color, key, &out);
                      MPI_Comm_rank(out, &rank);
                      MPI_Comm_size(out, &size);
                    }),
         CommOp::kBarrier, 0, 0, /*track=*/false)
      ->wait();
  return std::make_unique<MpiGroup>(out, rank, size, axis, /*owns_comm=*/true);
}

// ---- process-wide runtime ----

std::unique_ptr<Group> init_world(int* argc, char*** argv) {
  CHECK_MSG(!g_init_called, "init_world called twice");
  g_init_called = true;
  if (!launched_by_mpi()) return std::make_unique<SelfGroup>("world");

  int provided = 0;
  if (MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
    detail::print_error("MPI_Init_thread failed");
    std::exit(1);
  }
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  detail::set_world_rank(rank);
  if (provided < MPI_THREAD_SERIALIZED) {
    abort_job("the MPI library provides thread level " + std::to_string(provided) +
              ", below MPI_THREAD_SERIALIZED; meshtrain runs MPI on a communication thread");
  }
  g_engine = new CommEngine();
  return std::make_unique<MpiGroup>(MPI_COMM_WORLD, rank, size, "world", /*owns_comm=*/false);
}

void finalize() {
  if (g_engine != nullptr) {
    g_engine->stop();
    delete g_engine;
    g_engine = nullptr;
  }
  if (mpi_running()) MPI_Finalize();
}

[[noreturn]] void abort_job(const std::string& message, int exit_code) {
  if (!message.empty()) detail::print_error(message);
  if (mpi_running()) {
    // MPI_Abort asks the launcher to end every rank. When this rank's host cannot reach the
    // launcher (a link down), the call may never return: this rank then ends on its own.
    std::thread([exit_code] {
      std::this_thread::sleep_for(std::chrono::seconds(5));
      std::fflush(stderr);
      std::_Exit(exit_code);
    }).detach();
    MPI_Abort(MPI_COMM_WORLD, exit_code);
    std::_Exit(exit_code);  // MPI_Abort does not return; this is for the compiler and for safety
  }
  std::exit(exit_code);
}

}  // namespace meshtrain::comm
