// main() of meshtrain_mpi_tests: every rank runs the same gtest cases in the same order
// (collectives inside a test must match across ranks). Rank 0 prints gtest's normal
// output; every rank prints its own failures prefixed with "[rank R]". The exit code is
// non-zero on every rank when any rank failed. A default comm timeout turns a hung
// collective into an abort that names it, well before ctest's timeout.
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <string>

#include "comm/group.h"

namespace {

meshtrain::comm::Group* g_world = nullptr;

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  // (UnitTest::current_test_info() would deadlock inside OnTestPartResult: gtest holds
  // its lock there, so the name is kept from OnTestStart.)
  void OnTestStart(const ::testing::TestInfo& info) override {
    test_ = std::string(info.test_suite_name()) + "." + info.name();
  }
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] FAILED %s at %s:%d\n%s\n", rank_, test_.c_str(),
                 result.file_name() ? result.file_name() : "?", result.line_number(),
                 result.summary());
    std::fflush(stderr);
  }

 private:
  int rank_;
  std::string test_ = "(outside a test)";
};

}  // namespace

// The world group of this run, for the tests.
meshtrain::comm::Group& test_world() { return *g_world; }

int main(int argc, char** argv) {
  std::unique_ptr<meshtrain::comm::Group> world = meshtrain::comm::init_world(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  g_world = world.get();
  meshtrain::comm::set_comm_timeout(60);

  ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
  if (world->rank() != 0) delete listeners.Release(listeners.default_result_printer());
  listeners.Append(new RankFailurePrinter(world->rank()));

  const int rc = RUN_ALL_TESTS();
  double failed_ranks = rc != 0 ? 1.0 : 0.0;
  world->all_reduce_f64(&failed_ranks, 1, meshtrain::comm::ReduceOp::kSum);
  if (world->rank() == 0 && failed_ranks > 0) {
    std::fprintf(stderr, "meshtrain_mpi_tests: failures on %d of %d ranks\n",
                 static_cast<int>(failed_ranks), world->size());
  }
  g_world = nullptr;
  world.reset();
  meshtrain::comm::finalize();
  return failed_ranks > 0 ? 1 : 0;
}
