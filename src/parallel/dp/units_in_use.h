// The units a ZeRO-3 (or 16-bit) store hands the model while they are in use: one record per
// unit from the moment it is started (ZeRO-3: its all-gather issued, possibly ahead of use as
// a prefetch) to the moment it is freed. A unit has users (acquire / release); its last
// release frees it, unless it stays: to the step's end (kKeep: gathered once per step) or
// held until drop_idle (kHold: a file-backed unit the backward needs next). What a unit's
// buffers are and where they come from is the caller's: `start` fills a record (the
// gather's request, its buffers), `free` returns the buffers to their pools.
#pragma once
#include <functional>
#include <memory>
#include <vector>

#include "comm/group.h"
#include "core/memory.h"
#include "optim/shard_store.h"

namespace meshtrain::parallel {

class UnitsInUse {
 public:
  struct Unit {
    Buffer<float> data;      // fp32: the gathered unit (padded), or 16-bit words widened
    Buffer<uint16_t> half;   // 16-bit ZeRO-3: the gathered words
    optim::IoBuffer source;  // a file-backed shard read, until the gather from it completes
    comm::RequestPtr request;
    int users = 0;
    bool held = false;
  };
  using Start = std::function<void(int u, Unit& unit)>;
  using Free = std::function<void(Unit& unit)>;
  enum class Stay { kFree, kKeep, kHold };

  UnitsInUse(int units, Start start, Free free);
  ~UnitsInUse();

  // Starts unit u unless it is started already.
  Unit& start(int u);
  // Unit u started and its request waited for, with one user more.
  Unit& acquire(int u);
  // One user fewer; after the last, the unit is freed or stays as `stay` says.
  void release(int u, Stay stay);
  // Frees the units without users that are held, or with `every`, all of them (kept ones,
  // and prefetches never acquired: their requests are waited for first).
  void drop_idle(bool every);
  // Unit u's record while it is started, else null.
  const Unit* find(int u) const { return units_[u].get(); }
  int started() const;  // units with a record

 private:
  void drop(int u);

  std::vector<std::unique_ptr<Unit>> units_;
  Start start_;
  Free free_;
};

}  // namespace meshtrain::parallel
