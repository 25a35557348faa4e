// Open MPI backend of Group (compiled only when MESHTRAIN_HAVE_MPI is defined).
//
// Progress model. Open MPI's non-blocking collectives progress only while some thread is
// inside an MPI call, so a compute thread that starts MPI_Iallreduce and then runs a GEMM
// gets no overlap at all. Instead every MPI operation of the process runs on ONE dedicated
// communication thread ("meshtrain-comm"), fed by a FIFO queue shared by the world group
// and every group split from it:
//   - the i-calls enqueue an operation and return a Request at once; blocking calls are
//     enqueue + wait. The compute thread never calls MPI itself (only init_world,
//     finalize and abort_job do, when the comm thread is not running or to end the job).
//   - the queue is processed in program order, so collectives are issued in the same
//     order on every rank as long as the program calls them in the same order (MPI's rule).
//   - a collective runs as one blocking MPI call (MPI_Allreduce, MPI_Reduce_scatter_block,
//     MPI_Allgather, MPI_Bcast, MPI_Alltoall, MPI_Barrier) on the comm thread, which uses
//     the library's tuned algorithms and progresses at full speed while compute continues.
//   - send/recv are posted with MPI_Isend/MPI_Irecv as soon as they reach the head of the
//     queue and are then completed by polling (MPI_Testsome) between later operations and
//     while the queue is empty, so the comm thread never blocks on a point-to-point op.
//     "both ranks isend then irecv", "rank 0 sends, rank 1 receives" and pipeline chains
//     therefore never deadlock (the blocking send() still waits for its matching receive
//     when the library needs a rendezvous, exactly like MPI_Send).
//   - when idle the thread sleeps on a condition variable; while point-to-point ops are in
//     flight it polls with an exponential back-off (yield, then sleeps up to 100 µs).
//   - on cores of its own (an affinity mask smaller than the machine: the launcher binds
//     ranks only when each has its cores), a send with no collective ahead of it is posted
//     before isend returns (the caller waits for the post, not the transfer), and while a
//     thread waits for a point-to-point op the comm thread polls without sleeping. Both
//     cut the hand-off between pipeline stages: a comm thread sharing a core with the next
//     pass was left waiting for it for milliseconds (docs/pipeline.md).
// Consequence of the single FIFO: an operation starts only after every earlier operation
// of this process has started, and nothing behind a collective starts before that
// collective has finished. A program must not make the completion of a collective depend
// on an operation it issues later (e.g. iall_reduce, then a send that the peers need before
// they can join that all_reduce).
//
// A Group is used from one thread at a time (its stats are not atomic); Requests must be
// waited (their destructor waits) before their Group is destroyed and before finalize().
#pragma once
#include <mpi.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "comm/group.h"
#include "comm/self_group.h"

namespace meshtrain::comm {

class MpiRequest;
struct CommTask;  // one queued operation (mpi_group.cc)

class MpiGroup final : public Group {
 public:
  // Wraps `comm`; when `owns_comm` the communicator is freed (on the comm thread) by the
  // destructor. init_world() and split() make these; nothing else needs to.
  MpiGroup(MPI_Comm comm, int rank, int size, std::string axis, bool owns_comm);
  ~MpiGroup() override;
  MpiGroup(const MpiGroup&) = delete;
  MpiGroup& operator=(const MpiGroup&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  MPI_Comm comm() const { return comm_; }

  // Stats (see comm_bytes in self_group.h): bytes and calls are added when the call is
  // made; busy_s (the operation's time on the comm thread: the MPI call for collectives,
  // post to observed completion for send/recv) and wait_s (the time this thread blocked in
  // wait() or in the blocking form) are added when the request is first seen complete.
  RequestPtr iall_reduce(float* buf, size_t n, ReduceOp op) override;
  RequestPtr ireduce_scatter(const float* send, float* recv, size_t n, ReduceOp op) override;
  RequestPtr iall_gather(const float* send, float* recv, size_t n) override;
  RequestPtr iall_gather(const uint16_t* send, uint16_t* recv, size_t n) override;
  RequestPtr iall_gather(const uint8_t* send, uint8_t* recv, size_t n) override;
  RequestPtr ibroadcast(float* buf, size_t n, int root) override;
  // send == recv is allowed (MPI_IN_PLACE).
  RequestPtr iall_to_all(const float* send, float* recv, size_t n) override;
  RequestPtr iall_to_all(const uint8_t* send, uint8_t* recv, size_t n) override;
  RequestPtr iall_to_allv(const float* send, const size_t* send_counts, float* recv,
                          const size_t* recv_counts) override;
  // 0 <= tag <= 32767 (the smallest MPI_TAG_UB the standard allows); peer may be rank().
  RequestPtr isend(const float* buf, size_t n, int peer, int tag) override;
  // The matching send must have exactly n elements (else the job is aborted).
  RequestPtr irecv(float* buf, size_t n, int peer, int tag) override;
  void all_reduce_f64(double* buf, size_t n, ReduceOp op) override;
  void barrier() override;
  // MPI_Comm_split, run on the comm thread; color >= 0. The new group shares the thread.
  std::unique_ptr<Group> split(int color, int key, const std::string& axis) override;

 private:
  friend class MpiRequest;
  // Enqueues `task` on the comm thread; `track` adds it to stats_ (split/free do not).
  // *idle (optional): whether no collective was queued or running before it.
  RequestPtr submit(std::shared_ptr<CommTask> task, CommOp op, size_t n, size_t elem_bytes,
                    bool track = true, bool* idle = nullptr);
  std::shared_ptr<CommTask> collective(const char* name, std::function<void()> body);
  template <typename T>
  RequestPtr all_gather_of(const T* send, T* recv, size_t n, MPI_Datatype type);
  template <typename T>
  RequestPtr all_to_all_of(const T* send, T* recv, size_t n, MPI_Datatype type);

  MPI_Comm comm_;
  int rank_;
  int size_;
  bool owns_comm_;
};

}  // namespace meshtrain::comm
