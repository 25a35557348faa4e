// Multi-host runs and their failures, on two hosts of scripts/hosts.sh (network namespaces
// joined by a bridge, each with its own address, hostname and shaped link), launched from
// a hostfile by `meshtrain train --hostfile` exactly as on a cluster: tp inside a host, dp
// across the link. Needs root (ip netns, tc); skipped without it. One ctest entry, run
// alone (RUN_SERIAL): the hosts are the machine's, and the faults are timed.
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <thread>

#include "cli_test_util.h"
#include "multirank_test_util.h"

namespace meshtrain::hosts_test {

namespace fs = std::filesystem;
using cli_test::describe;
using cli_test::read_file;
using cli_test::read_metrics;
using cli_test::RunResult;
using nlohmann::json;

const std::string kHostsScript = std::string(MESHTRAIN_SOURCE_DIR) + "/scripts/hosts.sh";
// A prefix and subnet of the tests' own, apart from what a user may have brought up.
const std::string kName = "mtt", kNet = "10.231.9";
const std::string kHost0 = kName + "0", kHost1 = kName + "1";

std::string hosts(const std::string& verb_and_args) {
  return kHostsScript + " " + verb_and_args + " --name " + kName + " --net " + kNet;
}

// Polls `done` every 100 ms for up to `seconds`.
bool wait_for(const std::function<bool()>& done, double seconds) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return done();
}

class Hosts : public cli_test::CliTest {
 protected:
  static void SetUpTestSuite() {
    cli_test::CliTest::SetUpTestSuite();
    if (geteuid() != 0) {
      skip_ = "needs root for network namespaces";
      return;
    }
    RunResult up = cli_test::run(hosts("up 2 --rate 1gbit"));
    if (up.exit_code != 0) {
      skip_ = "cannot create network namespaces here: " + up.err;
      return;
    }
    hostfile_ = (fs::temp_directory_path() / ("meshtrain_hosts_" + cli_test::kPid)).string();
    cli_test::write_file(hostfile_, cli_test::run(hosts("hostfile")).out);
    mpirun_args_ = cli_test::run(hosts("mpirun-args")).out;
    while (!mpirun_args_.empty() && mpirun_args_.back() == '\n') mpirun_args_.pop_back();
  }
  static void TearDownTestSuite() {
    if (skip_.empty()) (void)cli_test::run(hosts("down"));
    fs::remove(hostfile_);
    fs::remove_all(reference_dir());
    cli_test::CliTest::TearDownTestSuite();
  }
  void SetUp() override {
#ifndef MESHTRAIN_HAVE_MPI
    GTEST_SKIP() << "built without MPI";
#endif
    if (!skip_.empty()) GTEST_SKIP() << skip_;
    cli_test::CliTest::SetUp();
    // Every test starts on healthy links.
    (void)cli_test::run(hosts("link " + kHost1 + " up") + " && " + hosts("rate " + kHost1 + " 1gbit"));
  }

  // `meshtrain train` on 2 hosts x 2 ranks: tp 2 inside each host, dp 2 across the link.
  static std::string train_on_hosts(const std::string& args) {
    return cli_test::kBinary + " train --data " + corpus_ + " " + cli_test::kTiny +
           " --tp 2 --dp 2 --peak-gflops 100 --threads 1 --hostfile " + hostfile_ + " --mpirun-args '" +
           mpirun_args_ + "' " + args;
  }

  // Runs `cmd` in the background, stdout and stderr into files; join() waits for it.
  struct Background {
    std::string out, err;
    std::atomic<int> exit_code{-1};
    std::thread thread;
    Background(const std::string& cmd, const std::string& prefix) : out(prefix + ".out"), err(prefix + ".err") {
      thread = std::thread([this, cmd] {
        const int status = std::system((cmd + " > " + out + " 2> " + err).c_str());
        exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      });
    }
    RunResult join() {
      thread.join();
      return {exit_code.load(), read_file(out), read_file(err)};
    }
  };

  // Steps written to metrics.jsonl so far.
  static size_t steps_done(const std::string& run) {
    size_t n = 0;
    for (const auto& line : cli_test::lines_of(read_file(run + "/metrics.jsonl")))
      n += line.find("\"loss\"") != std::string::npos;
    return n;
  }

  static int64_t pid_of_rank(const std::string& run, int rank) {
    char name[32];
    std::snprintf(name, sizeof name, "/heartbeat/rank_%05d.json", rank);
    const json beat = json::parse(read_file(run + name), nullptr, false);
    return beat.is_object() ? beat.value("pid", (int64_t)0) : 0;
  }

  // A restartable job of `flags` into `out` whose rank 3 (on the second host) gets SIGKILL
  // once 5 steps are done; what the job and its restart ended with.
  RunResult kill_rank_3_mid_run(const std::string& flags, const std::string& out) {
    Background job(train_on_hosts(kFlags + " --quiet --max-restarts 1 --comm-timeout 20 " + flags + " --out " + out),
                   path("job"));
    const bool running = wait_for([&] { return steps_done(out) >= 5; }, 120);
    const int64_t pid = running ? pid_of_rank(out, 3) : 0;
    EXPECT_GT(pid, 0) << "rank 3 never reached step 5: " << read_file(job.err);
    if (pid > 0) ::kill((pid_t)pid, SIGKILL);
    return job.join();
  }

  // The uninterrupted run every fault test compares against (made once).
  const cli_test::Metrics& reference() {
    if (reference_.steps.empty()) {
      RunResult r = cli_test::run(train_on_hosts(kFlags + " --quiet --out " + reference_dir()));
      EXPECT_EQ(r.exit_code, 0) << describe(r);
      reference_ = read_metrics(reference_dir() + "/metrics.jsonl");
    }
    return reference_;
  }
  static std::string reference_dir() {
    return (fs::temp_directory_path() / ("meshtrain_hosts_reference_" + cli_test::kPid)).string();
  }

  // Steps 1..N of `run` equal the reference's bit for bit.
  void expect_bitwise_as_reference(const std::string& run) {
    const cli_test::Metrics& want = reference();
    const cli_test::Metrics got = read_metrics(run + "/metrics.jsonl");
    ASSERT_EQ(got.steps.size(), want.steps.size());
    for (size_t i = 0; i < want.steps.size(); i++) {
      EXPECT_EQ(got.steps[i]["step"], want.steps[i]["step"]);
      EXPECT_EQ(cli_test::bits(got.steps[i]["loss"]), cli_test::bits(want.steps[i]["loss"]))
          << "step " << i + 1 << ": " << got.steps[i]["loss"] << " vs " << want.steps[i]["loss"];
    }
  }

  static inline const std::string kFlags = "--steps 8 --save-every 2 --keep-checkpoints 0";
  static inline std::string skip_, hostfile_, mpirun_args_;
  static inline cli_test::Metrics reference_;
};

// A 2-host job from a hostfile trains like one rank (the parity tolerance of the
// tensor-parallel suite), places each tp pair on one host, and its ranks report their hosts.
TEST_F(Hosts, TwoHostJobFromAHostfileTrainsLikeOneRank) {
  RunResult one = cli_test::run(train("--model tiny --seq-len 32 --micro-batch 2 --vocab 50257 --global-batch 4 "
                                      "--steps 8 --quiet --out " + path("one")));
  ASSERT_EQ(one.exit_code, 0) << describe(one);
  const cli_test::Metrics& hosts_run = reference();
  const cli_test::Metrics single = read_metrics(path("one/metrics.jsonl"));
  ASSERT_EQ(hosts_run.steps.size(), single.steps.size());
  for (size_t i = 0; i < single.steps.size(); i++)
    EXPECT_NEAR(hosts_run.steps[i]["loss"].get<double>(), single.steps[i]["loss"].get<double>(), 1e-5) << i;
  // tp neighbours share a host: ranks 0, 1 on the first, 2, 3 on the second.
  for (int r = 0; r < 4; r++) {
    char name[32];
    std::snprintf(name, sizeof name, "/heartbeat/rank_%05d.json", r);
    const json beat = json::parse(read_file(reference_dir() + name));
    EXPECT_EQ(beat["host"], r < 2 ? kHost0 : kHost1) << "rank " << r;
    EXPECT_EQ(beat["state"], "finished");
  }
}

// --rank-order dp-tp-pp puts the dp pairs inside the hosts and sends tp across the link:
// the same groups on other ranks, so the same losses, bit for bit, as the default placement.
TEST_F(Hosts, RankOrderPlacesDpInsideAHostWithTheSameLosses) {
  const std::string out = path("dp_inside");
  RunResult r = cli_test::run(train_on_hosts(kFlags + " --rank-order dp-tp-pp --out " + out));
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  // The summary's placement: ranks 0 and 1 (the first host) are dp 0 and 1 of tp 0.
  EXPECT_NE(r.out.find("rank  0 on " + kHost0 + " (tp 0 pp 0 dp 0)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rank  1 on " + kHost0 + " (tp 0 pp 0 dp 1)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rank  2 on " + kHost1 + " (tp 1 pp 0 dp 0)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("order=dp-tp-pp"), std::string::npos) << r.out;
  expect_bitwise_as_reference(out);
}

// A rank killed with SIGKILL mid-run: the job ends, naming the rank, its host and the newest
// checkpoint; with --max-restarts 1 it starts again from that checkpoint and finishes with
// losses bit for bit those of the uninterrupted run.
TEST_F(Hosts, KilledRankIsNamedAndTheRestartResumesBitwise) {
  reference();
  const std::string out = path("killed");
  RunResult r = kill_rank_3_mid_run("", out);
  EXPECT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_NE(r.err.find("the job failed: rank 3 on host " + kHost1 + " was killed by signal 9"), std::string::npos)
      << describe(r);
  EXPECT_NE(r.err.find("the newest complete checkpoint is " + out + "/checkpoints/step_0000000"), std::string::npos)
      << describe(r);
  EXPECT_NE(r.err.find("restart 1 of 1 in 3 s, from " + out + "/checkpoints/step_0000000"), std::string::npos) << describe(r);
  expect_bitwise_as_reference(out);
}

// --elastic: after rank 3 on the second host is killed, the restart leaves that host out and
// runs tp 2 on the first host alone (dp 2 -> 1, grad-accum 1 -> 2): the same global batch, so
// the losses stay those of the uninterrupted run within the parity tolerance (the gradient
// sums are added in another order, so not bit for bit).
TEST_F(Hosts, ElasticRestartLeavesTheHostOutAndKeepsTheLosses) {
  const cli_test::Metrics& want = reference();
  const std::string out = path("elastic");
  RunResult r = kill_rank_3_mid_run("--elastic", out);
  EXPECT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_NE(r.err.find("elastic: without host " + kHost1 + ": dp 2 -> 1, grad-accum 1 -> 2 (global batch 4)"),
            std::string::npos)
      << describe(r);
  EXPECT_EQ(read_file(out + "/hostfile.restart1"), kHost0 + " slots=2\n");
  const cli_test::Metrics got = read_metrics(out + "/metrics.jsonl");
  ASSERT_EQ(got.steps.size(), want.steps.size());
  for (size_t i = 0; i < want.steps.size(); i++)
    EXPECT_NEAR(got.steps[i]["loss"].get<double>(), want.steps[i]["loss"].get<double>(), 1e-5) << "step " << i + 1;
  // The restarted job ran on the first host only.
  const json beat = json::parse(read_file(out + "/heartbeat/rank_00001.json"));
  EXPECT_EQ(beat["host"], kHost0);
  EXPECT_EQ(beat["state"], "finished");
}

// The inter-host link taken down mid-collective: every rank's watchdog fires within
// --comm-timeout, the reachable ranks name the network as the fault (every rank alive and
// waiting) and the newest checkpoint, and the supervisor ends the job. Once the link is
// back, the restart resumes bit for bit.
TEST_F(Hosts, LinkDownEndsTheJobNamingTheNetworkAndTheRestartResumes) {
  reference();
  const std::string out = path("link");
  const double timeout = 6;
  Background job(train_on_hosts(kFlags + " --quiet --max-restarts 1 --comm-timeout 6 --out " + out), path("job"));
  ASSERT_TRUE(wait_for([&] { return steps_done(out) >= 3; }, 120)) << read_file(job.err);
  ASSERT_EQ(cli_test::run(hosts("link " + kHost1 + " down")).exit_code, 0);
  const auto down = std::chrono::steady_clock::now();
  const bool failed = wait_for([&] { return read_file(job.err).find("the job failed") != std::string::npos; }, 60);
  const double ended_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - down).count();
  ASSERT_EQ(cli_test::run(hosts("link " + kHost1 + " up")).exit_code, 0);
  RunResult r = job.join();
  ASSERT_TRUE(failed) << describe(r);
  // The watchdog fires at the timeout; the supervisor gives mpirun 2 s to end before it
  // ends it; the rest is the step in flight and polling (measured: 0.5-1 s).
  EXPECT_LT(ended_s, timeout + 2 + 3) << describe(r);
  EXPECT_NE(r.err.find("] meshtrain: error: comm timeout: "), std::string::npos) << describe(r);
  EXPECT_NE(r.err.find("at fault: the network: every rank is alive and waiting"), std::string::npos) << describe(r);
  EXPECT_NE(r.err.find("the newest complete checkpoint is " + out + "/checkpoints/step_0000000"), std::string::npos)
      << describe(r);
  EXPECT_NE(r.err.find("restart 1 of 1"), std::string::npos) << describe(r);
  EXPECT_EQ(r.exit_code, 0) << describe(r);
  expect_bitwise_as_reference(out);
}

// A slow link (100 Mbit/s, a tenth of the others): training goes on with no watchdog, and
// metrics.jsonl names the link: the dp axis, which crosses the hosts.
TEST_F(Hosts, SlowLinkTrainsOnAndIsNamedInTheMetrics) {
  ASSERT_EQ(cli_test::run(hosts("rate " + kHost1 + " 100mbit")).exit_code, 0);
  const std::string out = path("slow");
  RunResult r = cli_test::run(train_on_hosts("--steps 3 --quiet --comm-timeout 60 --out " + out));
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  const cli_test::Metrics m = read_metrics(out + "/metrics.jsonl");
  ASSERT_EQ(m.steps.size(), 3u);
  for (const json& step : m.steps) {
    ASSERT_TRUE(step.contains("slowest_link")) << step.dump();
    const json& link = step["slowest_link"];
    EXPECT_EQ(link["axis"], "dp") << step.dump();
    EXPECT_LT(link["gbit_s"].get<double>(), 0.1) << "at most the shaped rate: " << step.dump();
    ASSERT_TRUE(step.contains("straggler")) << step.dump();
    const std::string host = step["straggler"]["host"];
    EXPECT_TRUE(host == kHost0 || host == kHost1) << step.dump();
  }
}

}  // namespace meshtrain::hosts_test
