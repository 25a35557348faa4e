// N ranks as threads of one process: a Group whose collectives meet in shared memory, so a
// part of the engine that talks through a Group (a gradient reducer, a shard store, the
// pipeline's messages) is tested on several ranks in milliseconds, without mpirun.
//
//   ThreadWorld world(4);                 // the ranks' shared state
//   run_ranks(4, [&](int r) {             // one thread per rank
//     std::unique_ptr<Group> g = world.group(r, "dp");
//     g->all_reduce(buf, n);
//   });
//
// Semantics are the MPI backend's (group.h): collectives in the same order on every rank,
// matched by their position in that order; a non-blocking call copies its input when it is
// made (so an in-place all-reduce may be waited for in any order) and completes in wait();
// send/recv match by (source, destination, tag) in FIFO order; split() is collective.
// Results are bit-identical on every rank (each rank sums the inputs in rank order). Stats
// follow comm_bytes. A rank whose peers never arrive blocks: tests use it with a deadline.
#pragma once
#include <functional>
#include <memory>
#include <string>

#include "comm/group.h"

namespace meshtrain::comm {

class ThreadWorld {
 public:
  explicit ThreadWorld(int size);
  ~ThreadWorld();
  int size() const;
  // Rank `rank`'s view of the whole world, named `axis`.
  std::unique_ptr<Group> group(int rank, const std::string& axis = "world");

  struct Shared;  // the rendezvous state (thread_group.cc)

 private:
  std::shared_ptr<Shared> shared_;
};

// Runs body(rank) on `ranks` threads and joins them; an exception in a rank is rethrown.
void run_ranks(int ranks, const std::function<void(int)>& body);

}  // namespace meshtrain::comm
