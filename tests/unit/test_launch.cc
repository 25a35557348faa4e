// The supervisor's pure parts (cli/launch.h): what it reads from a failed job's stderr, and
// the shape of an elastic restart. The runs themselves are the Hosts suite's.
#include <gtest/gtest.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <thread>
#include <string>

#include "cli/launch.h"
#include "core/cpu_info.h"
#include "cli_test_util.h"

namespace meshtrain::cli::test_launch {
namespace {

namespace fs = std::filesystem;

TEST(Launch, ReadsTheFailedRankAndHost) {
  FailureReport f = read_failure(
      "junk\nmpirun noticed that process rank 3 with PID 6388 on node mt1 exited on signal 9 (Killed).\n");
  EXPECT_EQ(f.rank, 3);
  EXPECT_EQ(f.host, "mt1");
  EXPECT_EQ(f.signal, 9);
  EXPECT_EQ(f.signal_name, "Killed");
  f = read_failure("srun: error: node7: task 12: Killed\n");
  EXPECT_EQ(f.rank, 12);
  EXPECT_EQ(f.host, "node7");
  EXPECT_EQ(f.signal, SIGKILL);
  f = read_failure("[rank 2] meshtrain: error: comm timeout: all_reduce on dp waited 6 s\n");
  EXPECT_EQ(f.rank, 2);
  EXPECT_EQ(f.host, "");
  EXPECT_EQ(f.timeout, "comm timeout: all_reduce on dp waited 6 s");
}

class Elastic : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("meshtrain_elastic_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  LaunchOptions options(const std::string& hostfile_text) {
    LaunchOptions o;
    o.hostfile = (dir_ / "hosts").string();
    std::ofstream(o.hostfile) << hostfile_text;
    o.model_parallel = 2, o.dp = 4, o.micro_batch = 2, o.global_batch = 16;
    return o;
  }
  std::string next() const { return (dir_ / "hosts.next").string(); }
  fs::path dir_;
};

TEST_F(Elastic, LeavesTheHostOutAndKeepsTheGlobalBatch) {
  // 4 hosts x 2 slots, tp 2: dp 4. Without one host, 6 slots hold 3 replicas, but 16 rows
  // of micro-batches of 2 do not split over 3: dp 2, grad-accum 4.
  const LaunchOptions o = options("a slots=2\nb slots=2 # rack 1\nc slots=2\nd slots=2\n");
  ElasticShape e;
  ASSERT_TRUE(elastic_shape(o, "b", next(), &e).is_ok());
  EXPECT_EQ(e.dp, 2);
  EXPECT_EQ(e.ranks, 4);
  EXPECT_EQ(e.grad_accum, 4);
  EXPECT_EQ(e.summary, "without host b: dp 4 -> 2, grad-accum 2 -> 4 (global batch 16)");
  std::ifstream in(next());
  const std::string kept((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(kept, "a slots=2\nc slots=2\nd slots=2\n");
}

TEST_F(Elastic, RefusesWhatItCannotShape) {
  ElasticShape e;
  EXPECT_NE(elastic_shape(options("a slots=2\nb slots=2\n"), "z", next(), &e).message().find("does not name host z"),
            std::string::npos);
  EXPECT_NE(elastic_shape(options("a\nb slots=2\n"), "b", next(), &e).message().find("host a has no slots=N"),
            std::string::npos);
  // One slot left cannot hold a tp-2 replica.
  EXPECT_NE(elastic_shape(options("a slots=1\nb slots=2\n"), "b", next(), &e).message().find("not one replica"),
            std::string::npos);
}

// The flags are checked before anything starts, naming what is missing.
TEST(Launch, ElasticFlagsAreChecked) {
  const std::string train = cli_test::kBinary + " train " + cli_test::kTiny + " --tp 2 --steps 1 --out " +
                            (fs::temp_directory_path() / "meshtrain_elastic_flags").string();
  cli_test::RunResult r = cli_test::run(train + " --elastic");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--elastic needs --max-restarts K >= 1"), std::string::npos) << r.err;
  r = cli_test::run(train + " --elastic --max-restarts 1");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--elastic needs --hostfile"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(fs::temp_directory_path() / "meshtrain_elastic_flags"));
}

// Ranks are bound to cores of their own only where every thread has a physical core on this
// machine; the user's own placement flags win.
TEST(Launch, PlacementFlags) {
  using V = std::vector<std::string>;
  EXPECT_EQ(placement_flags(2, 1, 2, false, ""), (V{"--map-by", "core", "--bind-to", "core"}));
  EXPECT_EQ(placement_flags(2, 4, 8, false, ""), (V{"--map-by", "slot:PE=4", "--bind-to", "core"}));
  EXPECT_EQ(placement_flags(8, 1, 2, false, ""), (V{"--bind-to", "none"}));  // oversubscribed
  EXPECT_EQ(placement_flags(2, 2, 2, false, ""), (V{"--bind-to", "none"}));  // 4 threads, 2 cores
  EXPECT_EQ(placement_flags(2, 1, 2, true, ""), (V{"--bind-to", "none"}));   // hosts of a hostfile
  EXPECT_EQ(placement_flags(2, 1, 2, false, "--mca btl tcp,self --bind-to socket"), V{});
  EXPECT_EQ(placement_flags(2, 1, 2, false, "--map-by node"), V{});
  EXPECT_GE(physical_core_count(), 1);
  EXPECT_LE(physical_core_count(), (int)std::max(1u, std::thread::hardware_concurrency()));
}

}  // namespace
}  // namespace meshtrain::cli::test_launch
