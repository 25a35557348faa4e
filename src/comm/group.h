// Communication between ranks. A Group is one communicator of the device mesh (the world,
// or one tp / dp / pp axis group). Every call records the bytes this rank sends and the
// time it spends, under the group's axis name, so metrics report measured traffic.
//
// Collectives must be called in the same order by every rank of a group (MPI rules).
// Non-blocking calls return a Request; the buffers must stay untouched until wait().
// A wait() that exceeds the job's timeout (set_comm_timeout) aborts the whole job with a
// message naming the collective, the axis, the step and the rank.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace meshtrain::comm {

enum class ReduceOp { kSum, kMax };

// Traffic of one axis: bytes this rank sent (ring-algorithm volume, see CommStats), calls,
// and the wall time spent blocked waiting for communication.
struct AxisStats {
  int64_t bytes = 0;
  int64_t calls = 0;
  double wait_s = 0;   // time the caller spent blocked in collectives or wait()
  double busy_s = 0;   // time the communication itself took (may overlap compute)
  // The best rate any one call of at least kRateMinBytes achieved (bytes over its busy
  // time; 0: none so large). A call's busy time also holds the wait for late peers, so
  // the best call is the one that measures the link rather than the skew between ranks.
  double best_bytes_per_s = 0;
};
inline constexpr int64_t kRateMinBytes = 64 * 1024;  // smaller calls measure latency

class Request {
 public:
  virtual ~Request() = default;
  virtual void wait() = 0;  // blocks; idempotent
  virtual bool done() = 0;  // non-blocking test
};
using RequestPtr = std::unique_ptr<Request>;

class Group {
 public:
  virtual ~Group() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  const std::string& axis() const { return axis_; }

  // In-place sum/max of n floats across the group.
  virtual RequestPtr iall_reduce(float* buf, size_t n, ReduceOp op) = 0;
  // send[size()*n] -> recv[n]: rank r receives the reduced r-th block. recv may not alias send.
  virtual RequestPtr ireduce_scatter(const float* send, float* recv, size_t n, ReduceOp op) = 0;
  // send[n] -> recv[size()*n] ordered by rank. send may equal recv + rank()*n (in place).
  virtual RequestPtr iall_gather(const float* send, float* recv, size_t n) = 0;
  // The same for 16-bit words (half-precision parameters) and bytes (compressed payloads:
  // packed sign bits, int8 blocks): a bit-exact copy.
  virtual RequestPtr iall_gather(const uint16_t* send, uint16_t* recv, size_t n) = 0;
  virtual RequestPtr iall_gather(const uint8_t* send, uint8_t* recv, size_t n) = 0;
  virtual RequestPtr ibroadcast(float* buf, size_t n, int root) = 0;
  // send[size()*n] -> recv[size()*n]: block j of send goes to rank j.
  virtual RequestPtr iall_to_all(const float* send, float* recv, size_t n) = 0;
  virtual RequestPtr iall_to_all(const uint8_t* send, uint8_t* recv, size_t n) = 0;  // bytes, bit-exact
  // Blocks of varying size (MoE token dispatch): send_counts[j] floats go to rank j, the
  // blocks packed in rank order in send; recv_counts[j] come from rank j, packed in rank
  // order into recv. recv_counts[j] must equal rank j's send_counts[rank()] (an all_to_all
  // of the counts first tells every rank). recv may not alias send.
  virtual RequestPtr iall_to_allv(const float* send, const size_t* send_counts, float* recv,
                                  const size_t* recv_counts) = 0;
  virtual RequestPtr isend(const float* buf, size_t n, int peer, int tag) = 0;
  virtual RequestPtr irecv(float* buf, size_t n, int peer, int tag) = 0;
  // Doubles, for norms and loss sums that must not lose precision.
  virtual void all_reduce_f64(double* buf, size_t n, ReduceOp op) = 0;
  virtual void barrier() = 0;

  // Blocking forms.
  void all_reduce(float* buf, size_t n, ReduceOp op = ReduceOp::kSum) { iall_reduce(buf, n, op)->wait(); }
  void reduce_scatter(const float* send, float* recv, size_t n, ReduceOp op = ReduceOp::kSum) {
    ireduce_scatter(send, recv, n, op)->wait();
  }
  void all_gather(const float* send, float* recv, size_t n) { iall_gather(send, recv, n)->wait(); }
  void broadcast(float* buf, size_t n, int root) { ibroadcast(buf, n, root)->wait(); }
  void all_to_all(const float* send, float* recv, size_t n) { iall_to_all(send, recv, n)->wait(); }
  void all_to_all(const uint8_t* send, uint8_t* recv, size_t n) { iall_to_all(send, recv, n)->wait(); }
  void all_gather(const uint8_t* send, uint8_t* recv, size_t n) { iall_gather(send, recv, n)->wait(); }
  void all_to_allv(const float* send, const size_t* send_counts, float* recv, const size_t* recv_counts) {
    iall_to_allv(send, send_counts, recv, recv_counts)->wait();
  }
  void send(const float* buf, size_t n, int peer, int tag) { isend(buf, n, peer, tag)->wait(); }
  void recv(float* buf, size_t n, int peer, int tag) { irecv(buf, n, peer, tag)->wait(); }

  // Sub-group of the ranks with the same color, ordered by key, named `axis`.
  virtual std::unique_ptr<Group> split(int color, int key, const std::string& axis) = 0;

  const AxisStats& stats() const { return stats_; }
  void reset_stats() { stats_ = AxisStats{}; }

 protected:
  explicit Group(std::string axis) : axis_(std::move(axis)) {}
  std::string axis_;
  AxisStats stats_;
};

// ---- process-wide runtime ----

// Initialises MPI when the process was started by mpirun/srun (MPI_THREAD_MULTIPLE),
// otherwise a single-rank world. Returns the world group. Safe to call once.
std::unique_ptr<Group> init_world(int* argc, char*** argv);
void finalize();
bool launched_by_mpi();  // environment says this process is one rank of an MPI job

// Watchdog: a collective or wait() that takes longer than `seconds` (0 = never) aborts
// the whole job with "comm timeout: <op> on axis <axis> at step <step> on rank <rank>
// did not finish within <s> s", then what the timeout report (if set) says, with exit code
// kExitCommFailure.
void set_comm_timeout(double seconds);
void set_current_step(int64_t step);  // for the watchdog message and the heartbeat
int64_t current_step();
// Called by set_current_step when the step changes (nullptr: none), so that a flight
// recorder records a new step at once rather than at its next timed beat. It must return
// quickly: it runs on the training thread.
void set_step_listener(std::function<void()> listener);
// What this rank's compute thread is blocked in, for a flight recorder (train/heartbeat.h):
// `op` is empty while it is not waiting for communication.
struct WaitState {
  std::string op, axis;
  double waited_s = 0;  // so far
};
WaitState current_wait();
// Called once by the watchdog before it ends the job; its text (the other ranks' states,
// the newest checkpoint) follows the timeout message. Set it before training starts.
void set_timeout_report(std::string (*report)());
// Exit codes: a failure that a restart may cure (a lost rank, a link down, a stuck
// collective) ends the job with kExitCommFailure (sysexits' EX_TEMPFAIL), which the
// supervisor (--max-restarts) restarts; any other error exits 1 and is not retried.
inline constexpr int kExitCommFailure = 75;
// Ends every rank of the job with `exit_code` after printing `message` on this rank. If the
// MPI library cannot end it (a peer's host is unreachable), this rank exits on its own
// within a few seconds.
[[noreturn]] void abort_job(const std::string& message, int exit_code = 1);

}  // namespace meshtrain::comm
