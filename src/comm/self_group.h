// Single-rank Group (size 1): the world of a process that was not launched by mpirun, of
// a build without MPI, and any mesh axis of size 1. Collectives are copies or no-ops that
// finish before the call returns; send/recv has no peer and is a bug (CHECK).
//
// This header also holds what every backend shares: the traffic convention (comm_bytes)
// and the process-wide watchdog state behind set_comm_timeout/set_current_step.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "comm/group.h"

namespace meshtrain::comm {

// The operations of a Group, for the byte convention and for messages.
enum class CommOp {
  kAllReduce,
  kReduceScatter,
  kAllGather,
  kBroadcast,
  kAllToAll,
  kAllToAllV,
  kSend,
  kRecv,
  kBarrier
};
const char* comm_op_name(CommOp op);  // "all_reduce", "reduce_scatter", ... as in group.h

// Bytes this rank sends for one call, by the ring algorithm's volume (the nccl-tests "bus
// bytes" convention, independent of the algorithm the MPI library really uses), with
// N = group_size and n the `n` argument of the call (elements per rank block):
//   all_reduce     2·n·(N−1)/N elements, rounded to the nearest whole element
//   reduce_scatter (N−1)·n      all_gather (N−1)·n      all_to_all (N−1)·n
//   all_to_allv    n = the elements this rank sends to the other ranks (its own block stays)
//   broadcast      n (0 when N == 1), on every rank, root included
//   send           n            recv 0                  barrier 0
// times elem_bytes (4 for float, 8 for double).
int64_t comm_bytes(CommOp op, size_t n, int group_size, size_t elem_bytes);

class SelfGroup final : public Group {
 public:
  explicit SelfGroup(std::string axis = "world");

  int rank() const override { return 0; }
  int size() const override { return 1; }

  // Stats: calls += 1, bytes by comm_bytes (0 for every collective at N = 1); the copy's
  // time is counted both as busy_s and wait_s (the caller is blocked while it runs).
  RequestPtr iall_reduce(float* buf, size_t n, ReduceOp op) override;
  RequestPtr ireduce_scatter(const float* send, float* recv, size_t n, ReduceOp op) override;
  RequestPtr iall_gather(const float* send, float* recv, size_t n) override;
  RequestPtr iall_gather(const uint16_t* send, uint16_t* recv, size_t n) override;
  RequestPtr iall_gather(const uint8_t* send, uint8_t* recv, size_t n) override;
  RequestPtr ibroadcast(float* buf, size_t n, int root) override;  // root must be 0
  RequestPtr iall_to_all(const float* send, float* recv, size_t n) override;
  RequestPtr iall_to_all(const uint8_t* send, uint8_t* recv, size_t n) override;
  RequestPtr iall_to_allv(const float* send, const size_t* send_counts, float* recv,
                          const size_t* recv_counts) override;
  RequestPtr isend(const float* buf, size_t n, int peer, int tag) override;  // CHECK-fails
  RequestPtr irecv(float* buf, size_t n, int peer, int tag) override;        // CHECK-fails
  void all_reduce_f64(double* buf, size_t n, ReduceOp op) override;
  void barrier() override;
  // Any color/key gives another single-rank group named `axis`.
  std::unique_ptr<Group> split(int color, int key, const std::string& axis) override;

 private:
  // Runs `copy` (may be empty), accounts one call of `op` and returns a finished request.
  template <typename F>
  RequestPtr run(CommOp op, size_t n, size_t elem_bytes, F&& copy);
};

// ---- process-wide state shared by the backends (implementation detail of src/comm) ----
namespace detail {
double comm_timeout();   // seconds, 0 = never (set_comm_timeout)
int64_t current_step();  // set_current_step, -1 before the first call
int world_rank();        // rank in the MPI world; -1 when MPI is not running
void set_world_rank(int rank);
// Writes "[rank R] meshtrain: error: <message>" (the prefix only when world_rank() >= 0)
// to stderr and flushes it. abort_job calls it before ending the job.
void print_error(const std::string& message);
// The watchdog message: "comm timeout: <op> on axis <axis> at step <step> on rank <rank>
// did not finish within <s> s".
std::string timeout_message(const char* op, const std::string& axis, double seconds);
// The watchdog's end: the timeout message, the timeout report, then abort_job with
// kExitCommFailure.
[[noreturn]] void timeout_abort(const char* op, const std::string& axis, double seconds);
// While alive, current_wait() says the compute thread waits in `op` on `axis`.
class WaitScope {
 public:
  WaitScope(const char* op, const std::string& axis);
  ~WaitScope();
  WaitScope(const WaitScope&) = delete;
  WaitScope& operator=(const WaitScope&) = delete;
};
}  // namespace detail

}  // namespace meshtrain::comm
