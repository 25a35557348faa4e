// A group that only has a size and a rank: for laying out a rank's slice of a model (its
// parameter and activation shapes, hence its memory) without running it, e.g. to measure
// what one tensor-parallel rank of a larger job would hold. Any communication is a bug.
#pragma once
#include "comm/group.h"
#include "core/check.h"

namespace meshtrain::comm {

class ShapeOnlyGroup final : public Group {
 public:
  ShapeOnlyGroup(int size, int rank, std::string axis) : Group(std::move(axis)), size_(size), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  RequestPtr iall_reduce(float*, size_t, ReduceOp) override { return fail(); }
  RequestPtr ireduce_scatter(const float*, float*, size_t, ReduceOp) override { return fail(); }
  RequestPtr iall_gather(const float*, float*, size_t) override { return fail(); }
  RequestPtr iall_gather(const uint16_t*, uint16_t*, size_t) override { return fail(); }
  RequestPtr iall_gather(const uint8_t*, uint8_t*, size_t) override { return fail(); }
  RequestPtr ibroadcast(float*, size_t, int) override { return fail(); }
  RequestPtr iall_to_all(const float*, float*, size_t) override { return fail(); }
  RequestPtr iall_to_all(const uint8_t*, uint8_t*, size_t) override { return fail(); }
  RequestPtr iall_to_allv(const float*, const size_t*, float*, const size_t*) override { return fail(); }
  RequestPtr isend(const float*, size_t, int, int) override { return fail(); }
  RequestPtr irecv(float*, size_t, int, int) override { return fail(); }
  void all_reduce_f64(double*, size_t, ReduceOp) override { fail(); }
  void barrier() override { fail(); }
  std::unique_ptr<Group> split(int, int, const std::string&) override {
    fail();
    return nullptr;
  }

 private:
  [[noreturn]] static RequestPtr fail() {
    CHECK_MSG(false, "a shape-only group cannot communicate");
    __builtin_unreachable();
  }
  int size_, rank_;
};

}  // namespace meshtrain::comm
