// End-to-end tests of data parallelism and ZeRO stages 0-3: `meshtrain train --dp N --zero S`
// started from a plain process, so the binary re-executes itself under mpirun (cli/launch.cc).
//
//   ParityMatrix           dp {1,2,4} x zero {0..3} x grad-accum {1,2} at a global batch of 8
//                          rows: every step's loss and the final weights within 1e-5 of the
//                          single-rank run; --global-batch derives A.
//   MemoryAccounting       peak params/grads/optim bytes are exactly 4P/4P/8P with the sharded
//                          parts 4S/8S (S: per-unit shards), gathered only at stage 3, bounded.
//   CommunicationCounters  comm.dp.bytes per step against the ring-algorithm volumes.
//   WatchdogNamesTheStall  a rank that stops participating ends the job, named, within 60 s.
//   BadLayoutsAreRejected  impossible layouts fail on every rank before any step.
//   CheckpointsAcrossLayouts  dp=2 zero=1 checkpoints resume under dp=4 zero=3 and dp=2
//                          zero=1; export/eval read a dp=4 zero=3 checkpoint.
//   OverlapIsMeasuredAndHarmless  comm_busy_ms/comm_hidden reported; --no-overlap is bitwise
//                          the same.
//
// Every expected number comes from formulas in this file, not from engine code. Training
// runs are shared between tests through a cache, one run per configuration per process
// (the whole file, --gtest_filter='DataParallel*', makes 28 cached runs; ctest starts each
// test in a process of its own, so each test asks only for the runs it needs). Runs go
// concurrently up to the machine's core count (a run weighs as many cores as it has ranks,
// every rank with one thread) and each is bounded by `timeout`, so a hang fails the test
// instead of stalling the suite. MESHTRAIN_TEST_VERBOSE=1 prints per-run times and the
// parity margins.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors.h"
#include "cli_test_util.h"
#include "model/gpt.h"
#include "multirank_test_util.h"

namespace meshtrain::test_data_parallel {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Subprocesses, files, metrics.jsonl and the corpus fixture (cli_test_util.h); the job
// runner, the run cache and the checkpoint readers shared with the tp suite
// (multirank_test_util.h).
using namespace cli_test;
using namespace multirank_test;

// The model of every run: tiny (2 layers, 4 heads, C = 64) with T = 32 positions.
const std::string kShape = "--model tiny --seq-len 32 --vocab 50257";
constexpr int64_t kLayers = 2, kDim = 64, kSeq = 32;
constexpr int kGlobalBatch = 8;  // rows per optimizer step in every layout
constexpr int kSteps = 20;       // parity-matrix run length
constexpr double kLossTol = 1e-5, kWeightTol = 1e-5;

// ---- The flat buffer and its ZeRO units, from the formulas (not from engine code) -------

// Units: {wte (vocabulary padded to a multiple of 128 rows) + wpe (T rows)}, each block
// (2 LayerNorms 4C, QKV 3C²+3C, projection C²+C, MLP 4C²+4C and 4C²+C: 12C²+13C), the
// final LayerNorm 2C.
std::vector<int64_t> unit_sizes() {
  const int64_t C = kDim, padded_vocab = (kVocab + 127) / 128 * 128;
  std::vector<int64_t> u = {(padded_vocab + kSeq) * C};
  for (int64_t l = 0; l < kLayers; l++) u.push_back(12 * C * C + 13 * C);
  u.push_back(2 * C);
  return u;
}
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
// P: elements of the flat buffer.
int64_t flat_total() {
  int64_t p = 0;
  for (int64_t n : unit_sizes()) p += n;
  return p;
}
// S: elements one of N ranks owns, Σ_u ceil(numel_u / N).
int64_t shard_total(int n) {
  int64_t s = 0;
  for (int64_t u : unit_sizes()) s += ceil_div(u, n);
  return s;
}
// A unit padded to equal shards: ceil(numel / N) · N.
int64_t padded(int64_t numel, int n) { return ceil_div(numel, n) * n; }

// Bytes one f64 all-reduce of a single value sends under the documented ring convention
// (comm/self_group.h: 2·n·(N−1)/N elements rounded to the nearest element): 8 at N = 2,
// 16 at N = 4 (1.5 rounds to 2), 0 at N = 1.
int64_t f64_scalar_all_reduce_bytes(int n) { return std::llround(2.0 * (n - 1) / n) * 8; }

// ---- Processes -----------------------------------------------------------------------------

// Processes whose command line contains `needle` (other than this one).
std::vector<std::string> processes_with(const std::string& needle) {
  std::vector<std::string> found;
  const std::string self = std::to_string(::getpid());
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc", ec)) {
    const std::string pid = e.path().filename().string();
    if (pid.empty() || !std::all_of(pid.begin(), pid.end(), ::isdigit) || pid == self) continue;
    std::string cmdline = read_file(e.path().string() + "/cmdline");
    std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
    if (cmdline.find(needle) != std::string::npos) found.push_back(pid + ": " + cmdline);
  }
  return found;
}

// ---- Parity-matrix flags ------------------------------------------------------------------

// The flags of one parity-matrix cell: global batch 8 = B·A·dp, 20 steps.
std::string matrix_flags(int dp, int zero, int accum) {
  const int B = kGlobalBatch / (dp * accum);
  return "--dp " + std::to_string(dp) + " --zero " + std::to_string(zero) + " --micro-batch " +
         std::to_string(B) + " --grad-accum " + std::to_string(accum) + " --steps " +
         std::to_string(kSteps);
}

std::vector<std::string> matrix(const std::vector<int>& dps, const std::vector<int>& accums) {
  std::vector<std::string> out;
  for (int a : accums)
    for (int dp : dps)
      for (int zero = 0; zero <= 3; zero++) out.push_back(matrix_flags(dp, zero, a));
  return out;
}

// ---- Fixture: the corpus (CliTest), a suite folder and the cache of runs -----------------

// Runs are keyed by their flags; the ranks of a run are its --dp.
class DataParallelTest : public MultiRankTest<DataParallelTest> {
 protected:
  using Base = MultiRankTest<DataParallelTest>;
  friend Base;
  static constexpr const char* kTag = "dp";  // folder meshtrain_dp_PID, "[ dp runs  ]" lines


  static int job_capacity() { return core_count(); }

  // `meshtrain train` on the Brown corpus, one thread per rank, fixed peak.
  static std::string train(const std::string& args) {
    // One validation batch: the final evaluation is not under test here.
    return kBinary + " train --data " + corpus_ + " --peak-gflops 100 --threads 1" +
           " --eval-batches 1 " + kShape + " " + args;
  }

  static int ranks_of(const std::string& flags) {
    const size_t at = flags.find("--dp ");
    return at == std::string::npos ? 1 : std::atoi(flags.c_str() + at + 5);
  }

  // Runs (concurrently) every `flags` not run yet in this process; each gets its own --out.
  static void ensure(const std::vector<std::string>& all_flags) {
    std::vector<RunSpec> specs;
    for (const auto& flags : all_flags) specs.push_back({flags, ranks_of(flags)});
    Base::ensure(specs);
  }
};


using DataParallel = DataParallelTest;

// ---- 1. Parity -----------------------------------------------------------------------------

// Splitting the global batch over ranks and sharding state changes only the order of
// float sums: every layout trains the single-rank model (same B·A·dp = 8 rows per step)
// to within 1e-5 in the loss at every step and in every final weight.
TEST_F(DataParallel, ParityMatrix) {
  // --global-batch 8 with dp = 2, B = 2 derives A = 2: the (dp 2, zero 0, A 2) cell.
  const std::string global_batch = "--dp 2 --zero 0 --micro-batch 2 --global-batch 8 --steps 20";
  std::vector<std::string> runs = matrix({1, 2, 4}, {1, 2});
  runs.push_back(global_batch);
  ensure(runs);

  for (int accum : {1, 2}) {
    // The reference: one rank, B = 8/A, the same A.
    const std::string ref_flags = matrix_flags(1, 0, accum);
    Metrics ref = metrics_of(ref_flags);
    ASSERT_EQ(ref.steps.size(), (size_t)kSteps) << ref_flags;
    int64_t ref_step = 0;
    const std::vector<float> ref_params =
        load_params(step_dir(get(ref_flags).dir, kSteps), &ref_step);
    ASSERT_EQ((int64_t)ref_params.size(), flat_total());
    ASSERT_EQ(ref_step, kSteps);

    // One cell; an ASSERT ends only this cell.
    auto check = [&](const std::string& flags) {
      SCOPED_TRACE(flags);
      Metrics m = metrics_of(flags);
      ASSERT_EQ(m.steps.size(), (size_t)kSteps);
      int bad = 0;
      double worst = 0;
      for (int s = 0; s < kSteps; s++) {
        EXPECT_EQ(m.steps[s]["step"], s + 1);
        EXPECT_EQ(m.steps[s]["tokens"], ref.steps[s]["tokens"]);
        const double d =
            std::fabs(m.steps[s]["loss"].get<double>() - ref.steps[s]["loss"].get<double>());
        worst = std::max(worst, d);
        if (!(d <= kLossTol) && bad++ < 3)
          ADD_FAILURE() << "step " << s + 1 << ": loss " << m.steps[s]["loss"] << " vs "
                        << ref.steps[s]["loss"] << " single-rank (|diff| " << d << ")";
      }
      EXPECT_EQ(bad, 0) << bad << " steps off by more than " << kLossTol << ", worst " << worst;

      int64_t step = 0;
      const std::vector<float> params = load_params(step_dir(get(flags).dir, kSteps), &step);
      ASSERT_EQ(params.size(), ref_params.size());
      EXPECT_EQ(step, kSteps);
      size_t at = 0;
      const double dw = max_abs_diff(params, ref_params, &at);
      EXPECT_LE(dw, kWeightTol) << "final weights: element " << at << " is " << params[at]
                                << ", single-rank " << ref_params[at];
      if (std::getenv("MESHTRAIN_TEST_VERBOSE"))
        std::printf("[ parity   ] %-60s loss |diff| <= %.3g, weights |diff| <= %.3g\n",
                    flags.c_str(), worst, dw);
    };
    for (int dp : {1, 2, 4})
      for (int zero = 0; zero <= 3; zero++)
        if (matrix_flags(dp, zero, accum) != ref_flags) check(matrix_flags(dp, zero, accum));
  }

  // --global-batch: the same run as --grad-accum 2, bit for bit, and the layout is recorded.
  Metrics g = metrics_of(global_batch);
  Metrics a2 = metrics_of(matrix_flags(2, 0, 2));
  ASSERT_EQ(g.steps.size(), (size_t)kSteps);
  ASSERT_EQ(a2.steps.size(), (size_t)kSteps);
  for (int s = 0; s < kSteps; s++) {
    EXPECT_EQ(bits(g.steps[s]["loss"]), bits(a2.steps[s]["loss"])) << "step " << s + 1;
    EXPECT_EQ(g.steps[s]["tokens"], a2.steps[s]["tokens"]);
  }
  const json config = json::parse(read_file(get(global_batch).dir + "/config.json"));
  EXPECT_EQ(config["resolved_layout"]["grad_accum"], 2) << config.dump();
  EXPECT_EQ(config["resolved_layout"]["global_batch"], 8) << config.dump();
  EXPECT_EQ(config["resolved_layout"]["dp"], 2) << config.dump();
}

// ---- 2. Memory -----------------------------------------------------------------------------

// Per rank, fp32, P flat elements, S = Σ_u ceil(numel_u/N) owned elements:
//   stage 0: params 4P grads 4P optim 8P     stage 2: params 4P grads 4S optim 8S
//   stage 1: params 4P grads 4P optim 8S     stage 3: params 4S grads 4S optim 8S
// and at stage 3 the gathered units peak at most at the embedding unit plus the two
// largest blocks (the unit in use and the prefetched one), padded to equal shards.
TEST_F(DataParallel, MemoryAccounting) {
  ensure(matrix({2, 4}, {1}));
  const int64_t P = flat_total();
  const std::vector<int64_t> units = unit_sizes();
  auto check = [&](int n, int zero) {
    const std::string flags = matrix_flags(n, zero, 1);
    SCOPED_TRACE(flags);
    const int64_t S = shard_total(n);
    const int64_t params = 4 * (zero == 3 ? S : P);
    const int64_t grads = 4 * (zero >= 2 ? S : P);
    const int64_t optim = 8 * (zero >= 1 ? S : P);
    std::vector<int64_t> blocks;
    for (size_t u = 1; u + 1 < units.size(); u++) blocks.push_back(padded(units[u], n));
    std::sort(blocks.rbegin(), blocks.rend());
    const int64_t gathered_bound = 4 * (padded(units[0], n) + blocks[0] + blocks[1]);

    Metrics m = metrics_of(flags);
    ASSERT_EQ(m.steps.size(), (size_t)kSteps);
    for (const json& j : m.steps) {
      const json& mem = j["mem"];
      ASSERT_TRUE(mem.contains("gathered")) << mem.dump();
      EXPECT_EQ(mem["params"].get<int64_t>(), params) << "step " << j["step"];
      EXPECT_EQ(mem["grads"].get<int64_t>(), grads) << "step " << j["step"];
      EXPECT_EQ(mem["optim"].get<int64_t>(), optim) << "step " << j["step"];
      const int64_t gathered = mem["gathered"].get<int64_t>();
      if (zero < 3) {
        EXPECT_EQ(gathered, 0) << "step " << j["step"];
      } else {
        EXPECT_GT(gathered, 0) << "step " << j["step"];
        EXPECT_LE(gathered, gathered_bound) << "step " << j["step"];
      }
    }
  };
  for (int n : {2, 4})
    for (int zero = 0; zero <= 3; zero++) check(n, zero);
}

// ---- 3. Communication counters -------------------------------------------------------------

// Per step, bytes this rank sent on the dp axis by the ring convention (comm/self_group.h),
// with P, S as above and f = bytes of one scalar f64 all-reduce (8 at N = 2, 16 at N = 4:
// 2(N−1)/N of one element, rounded to a whole element):
//   stage 0      all-reduce of the gradient buckets 2(N−1)/N·4P, + f (the loss); each
//                bucket's element count is rounded, so allow 4 bytes per float call;
//   stages 1, 2  reduce-scatter + all-gather of every unit's padded shards 2(N−1)·4S, + 2f
//                (loss, grad norm), exactly;
//   stage 3      all-gather in forward and again in backward, reduce-scatter:
//                3(N−1)·4S + 2f, exactly.
// With accumulation (A micro-batches) stages 0-1 still reduce once, stage 2 reduce-scatters
// every micro-batch ((A+1)(N−1)·4S + 2f) and stage 3 gathers and reduces every micro-batch
// (3A(N−1)·4S + 2f). The ZeRO paper's volumes follow: stages 1-2 move what stage 0's
// all-reduce moves (2Ψ), stage 3 1.5 times as much (3Ψ), up to shard padding.
TEST_F(DataParallel, CommunicationCounters) {
  // Every stage at N = 2 and 4 without accumulation; N = 2 with A = 2 (the runs the overlap
  // test uses too).
  std::vector<std::string> runs = matrix({2, 4}, {1});
  const std::vector<std::string> accum2 = matrix({2}, {2});
  runs.insert(runs.end(), accum2.begin(), accum2.end());
  ensure(runs);

  const int64_t P = flat_total();
  // Bytes per step of one cell (the last step's), or -1 when the cell failed.
  auto check = [&](int n, int zero, int accum, double* per_step) {
    *per_step = -1;
    const std::string flags = matrix_flags(n, zero, accum);
    SCOPED_TRACE(flags);
    const int64_t S = shard_total(n), f = f64_scalar_all_reduce_bytes(n);
    Metrics m = metrics_of(flags);
    ASSERT_EQ(m.steps.size(), (size_t)kSteps);
    for (const json& j : m.steps) {
      ASSERT_TRUE(j.contains("comm") && j["comm"].contains("dp")) << j.dump();
      const int64_t bytes = j["comm"]["dp"]["bytes"].get<int64_t>();
      const int64_t calls = j["comm"]["dp"]["calls"].get<int64_t>();
      EXPECT_GE(calls, 2) << j.dump();
      *per_step = (double)bytes;
      if (zero == 0) {
        const double want = 2.0 * (n - 1) / n * 4.0 * (double)P + (double)f;
        EXPECT_LE(std::fabs((double)bytes - want), 4.0 * (double)(calls - 1))
            << "step " << j["step"] << ": " << bytes << " bytes, ring all-reduce " << want << " ("
            << calls << " calls)";
      } else {
        const int64_t rounds = zero == 1 ? 2 : zero == 2 ? accum + 1 : 3 * accum;
        EXPECT_EQ(bytes, rounds * (n - 1) * 4 * S + 2 * f)
            << "step " << j["step"] << ": " << rounds << " x (N-1) x 4S + 2 x " << f;
      }
    }
  };
  for (int n : {2, 4}) {
    double per_step[4];
    for (int zero = 0; zero <= 3; zero++) check(n, zero, 1, &per_step[zero]);
    if (per_step[0] > 0 && per_step[1] > 0 && per_step[3] > 0) {
      // ZeRO paper: stage 3 moves 1.5x the data of stage 0 (3Ψ vs 2Ψ); stage 1 the same.
      EXPECT_NEAR(per_step[3] / per_step[0], 1.5, 0.01) << "N = " << n;
      EXPECT_NEAR(per_step[1] / per_step[0], 1.0, 0.01) << "N = " << n;
    }
  }
  for (int zero = 0; zero <= 3; zero++) {
    double unused;
    check(2, zero, 2, &unused);
  }
}

// ---- 4. Watchdog ---------------------------------------------------------------------------

// Rank 1 stops participating at step 3; rank 0's next collective exceeds --comm-timeout 2,
// and the job ends (every rank) with a message naming the collective, the step and rank 0.
TEST_F(DataParallel, WatchdogNamesTheStall) {
  const std::string out = path("stall");  // unique: marks this job's processes
  const auto t0 = Clock::now();
  Job job = run_now(train("--dp 2 --micro-batch 4 --debug-stall-rank 1 --debug-stall-step 3"
                          " --comm-timeout 2 --steps 10 --out " + out),
                    2, /*limit_s=*/120);
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  const RunResult& r = job.result;
  EXPECT_NE(r.exit_code, 0) << describe(r);
  EXPECT_NE(r.exit_code, 124) << "killed by the test's timeout, not the watchdog\n" << describe(r);
  EXPECT_LT(seconds, 60.0) << describe(r);
  const std::string all = r.out + r.err;
  // "comm timeout: <op> on axis dp at step 3 on rank 0 did not finish within 2 s"
  EXPECT_NE(all.find("comm timeout: "), std::string::npos) << describe(r);
  EXPECT_NE(all.find(" on axis dp at step 3 on rank 0 did not finish within 2 s"),
            std::string::npos)
      << describe(r);
  // The heartbeats (train/heartbeat.h) name the rank at fault: alive, but not in the
  // collective rank 0 waits in.
  EXPECT_NE(all.find("at fault: rank 1 (host "), std::string::npos) << describe(r);
  EXPECT_NE(all.find("alive but not in the collective the others wait in"), std::string::npos) << describe(r);
  EXPECT_NE(all.find("no checkpoint was saved yet"), std::string::npos) << describe(r);
  // Steps 1 and 2 completed and were recorded; step 3 never was.
  Metrics m = read_metrics(out + "/metrics.jsonl");
  EXPECT_EQ(m.steps.size(), 2u) << read_file(out + "/metrics.jsonl");

  // Neither rank (nor mpirun) is left behind.
  std::vector<std::string> left;
  for (int i = 0; i < 100; i++) {
    left = processes_with(out);
    if (left.empty()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::string list;
  for (const auto& p : left) list += p + "\n";
  EXPECT_TRUE(left.empty()) << "still running 10 s after the job ended:\n" << list;
}

// ---- 5. Bad layouts ------------------------------------------------------------------------

// Each is rejected by every rank (each prints the message) before any step runs or any
// run file is written: a global batch that dp x B does not divide, a ZeRO stage that does
// not exist, a tensor-parallel size that does not divide the heads, ZeRO-2 under a pipeline.
TEST_F(DataParallel, BadLayoutsAreRejected) {
  const std::vector<RejectedRun> cases = {
      {"--dp 3 --global-batch 8 --micro-batch 2", 3,
       {"--global-batch 8 is not divisible by --micro-batch x dp = 2 x 3"}},
      {"--dp 2 --zero 4 --micro-batch 4", 2, {"--zero must be 0, 1, 2 or 3, got 4"}},
      {"--tp 3 --micro-batch 4", 3, {"--tp 3 does not divide the number of heads (4)"}},
  };
  expect_all_rejected(cases);
}

// ---- 6. Checkpoints across layouts ---------------------------------------------------------

// A dp=2 zero=1 run (G = 8) checkpoints at step 5; its step-10 checkpoint and steps 6-10 are
// then dropped and the run resumed under dp=4 zero=3 (B = 2, same G) and, in a copy, under
// the original layout. The other layout reproduces steps 6-10 within 1e-5, the same layout
// bit for bit. The dp=4 zero=3 checkpoint exports and evaluates.
TEST_F(DataParallel, CheckpointsAcrossLayouts) {
  // The uninterrupted run is the one that saved the step-5 checkpoint (saving does not
  // change the losses); the interrupted runs are copies of it.
  const std::string base = "--steps 10 --save-every 5 --keep-checkpoints 0";
  const std::string dp2 = "--dp 2 --zero 1 --micro-batch 4 " + base;
  const std::string dp4 = "--dp 4 --zero 3 --micro-batch 2 " + base;
  const std::string full = path("full"), other = path("other"), same = path("same");
  Job first = run_now(train(dp2 + " --quiet --out " + full), 2);
  ASSERT_EQ(first.result.exit_code, 0) << describe(first.result);
  Metrics ref = read_metrics(full + "/metrics.jsonl");
  ASSERT_EQ(ref.steps.size(), 10u);
  ASSERT_TRUE(fs::exists(step_dir(full, 5) + "/index.json"));
  ASSERT_TRUE(fs::exists(step_dir(full, 10) + "/index.json"));
  EXPECT_TRUE(fs::exists(step_dir(full, 10) + "/shard_00001.bin")) << "one shard per rank";

  // Two copies interrupted after step 5's checkpoint.
  for (const std::string& dir : {other, same}) {
    copy_interrupted_run(full, dir, 5, 10);
  }
  Job resumed_other, resumed_same;
  resumed_other.cmd = train(dp4 + " --out " + other + " --resume");
  resumed_other.ranks = 4;
  resumed_same.cmd = train(dp2 + " --out " + same + " --resume");
  resumed_same.ranks = 2;
  run_jobs({&resumed_other, &resumed_same}, dir_);
  ASSERT_EQ(resumed_other.result.exit_code, 0) << describe(resumed_other.result);
  ASSERT_EQ(resumed_same.result.exit_code, 0) << describe(resumed_same.result);
  for (const Job* j : {&resumed_other, &resumed_same}) {
    const std::string& out = j->result.out;
    EXPECT_NE(out.find("resumed at step 5"), std::string::npos) << out;
    EXPECT_EQ(out.find("step     5/10"), std::string::npos) << "step 5 ran again:\n" << out;
    EXPECT_NE(out.find("step     6/10"), std::string::npos) << out;
  }
  EXPECT_NE(resumed_other.result.out.find("dp=4 zero=3"), std::string::npos)
      << resumed_other.result.out;

  Metrics mo = read_metrics(other + "/metrics.jsonl");
  Metrics ms = read_metrics(same + "/metrics.jsonl");
  ASSERT_EQ(mo.steps.size(), 10u) << read_file(other + "/metrics.jsonl");
  ASSERT_EQ(ms.steps.size(), 10u) << read_file(same + "/metrics.jsonl");
  for (int s = 6; s <= 10; s++) {
    const json &x = ref.steps[s - 1], &o = mo.steps[s - 1], &y = ms.steps[s - 1];
    ASSERT_EQ(o["step"], s);
    ASSERT_EQ(y["step"], s);
    EXPECT_NEAR(o["loss"].get<double>(), x["loss"].get<double>(), kLossTol)
        << "dp=4 zero=3 after a dp=2 zero=1 checkpoint, step " << s;
    EXPECT_EQ(bits(y["loss"]), bits(x["loss"])) << "same layout, step " << s;
    EXPECT_EQ(bits(y["grad_norm"]), bits(x["grad_norm"])) << "same layout, step " << s;
    EXPECT_EQ(o["tokens"], x["tokens"]);
  }
  // The step-10 checkpoints: the same layout's shards are byte for byte the uninterrupted
  // run's (params and moments); dp=4 zero=3 wrote four shards of weights within 1e-5.
  for (const char* shard : {"shard_00000.bin", "shard_00001.bin"}) {
    const std::string a = read_file(step_dir(full, 10) + "/" + shard);
    EXPECT_FALSE(a.empty()) << shard;
    EXPECT_TRUE(a == read_file(step_dir(same, 10) + "/" + shard)) << shard << " differs";
  }
  const json index = json::parse(read_file(step_dir(other, 10) + "/index.json"));
  EXPECT_EQ(index["dp_size"], 4);
  EXPECT_TRUE(fs::exists(step_dir(other, 10) + "/shard_00003.bin"));
  int64_t step_full = 0, step_other = 0;
  const std::vector<float> w_full = load_params(step_dir(full, 10), &step_full);
  const std::vector<float> w_other = load_params(step_dir(other, 10), &step_other);
  ASSERT_EQ((int64_t)w_full.size(), flat_total());
  ASSERT_EQ(w_other.size(), w_full.size());
  EXPECT_EQ(step_other, 10);
  size_t at = 0;
  EXPECT_LE(max_abs_diff(w_other, w_full, &at), kWeightTol)
      << "element " << at << ": " << w_other[at] << " vs " << w_full[at];

  // export reads the dp=4 zero=3 checkpoint; the file holds its weights; eval reads it and
  // gives the loss that evaluating the run folder gives.
  const std::string st = path("x.safetensors");
  Job exported = run_now(kBinary + " export --checkpoint " + other + " --out " + st);
  ASSERT_EQ(exported.result.exit_code, 0) << describe(exported.result);
  EXPECT_NE(exported.result.out.find("step_00000010"), std::string::npos) << exported.result.out;
  checkpoint::SafetensorsFile f;
  Status s = checkpoint::SafetensorsFile::open(st, &f);
  ASSERT_TRUE(s.is_ok()) << s.message();
  std::vector<float> wte((size_t)kVocab * kDim);
  ASSERT_TRUE(f.read_float("wte.weight", wte.data(), wte.size()).is_ok());
  EXPECT_EQ(std::memcmp(wte.data(), w_other.data(), wte.size() * sizeof(float)), 0)
      << "exported wte.weight is not the checkpoint's";

  const std::string eval = " --data " + corpus_ + " --threads 1 --batches 2";
  Job ev_file = run_now(kBinary + " eval --checkpoint " + st + eval);
  Job ev_run = run_now(kBinary + " eval --checkpoint " + other + eval);
  ASSERT_EQ(ev_file.result.exit_code, 0) << describe(ev_file.result);
  ASSERT_EQ(ev_run.result.exit_code, 0) << describe(ev_run.result);
  EXPECT_NE(ev_file.result.out.find("val loss "), std::string::npos) << ev_file.result.out;
  EXPECT_EQ(ev_file.result.out, ev_run.result.out);
}

// ---- 7. Overlap ----------------------------------------------------------------------------

// Overlapped runs measure the time communication took (busy) and the share of it hidden
// behind compute; --no-overlap waits for every reduction at once and computes the same bits.
TEST_F(DataParallel, OverlapIsMeasuredAndHarmless) {
  std::vector<std::string> runs = matrix({2}, {2});
  std::vector<std::string> no_overlap;
  for (int zero : {0, 2, 3}) no_overlap.push_back(matrix_flags(2, zero, 2) + " --no-overlap");
  runs.insert(runs.end(), no_overlap.begin(), no_overlap.end());
  ensure(runs);

  for (const std::string& flags : runs) {
    SCOPED_TRACE(flags);
    Metrics m = metrics_of(flags);
    ASSERT_EQ(m.steps.size(), (size_t)kSteps);
    for (const json& j : m.steps) {
      ASSERT_TRUE(j.contains("comm_busy_ms") && j.contains("comm_hidden") && j.contains("comm_ms"))
          << j.dump();
      EXPECT_GT(j["comm_busy_ms"].get<double>(), 0) << j.dump();
      EXPECT_GE(j["comm_ms"].get<double>(), 0) << j.dump();
      EXPECT_GE(j["comm_hidden"].get<double>(), 0) << j.dump();
      EXPECT_LE(j["comm_hidden"].get<double>(), 1) << j.dump();
    }
  }
  for (int zero : {0, 2, 3}) {
    const std::string flags = matrix_flags(2, zero, 2);
    SCOPED_TRACE(flags + " vs --no-overlap");
    Metrics a = metrics_of(flags);
    Metrics b = metrics_of(flags + " --no-overlap");
    ASSERT_EQ(a.steps.size(), (size_t)kSteps);
    ASSERT_EQ(b.steps.size(), (size_t)kSteps);
    for (int s = 0; s < kSteps; s++) {
      EXPECT_EQ(bits(a.steps[s]["loss"]), bits(b.steps[s]["loss"])) << "step " << s + 1;
      EXPECT_EQ(bits(a.steps[s]["grad_norm"]), bits(b.steps[s]["grad_norm"])) << "step " << s + 1;
      EXPECT_EQ(a.steps[s]["comm"], b.steps[s]["comm"]) << "step " << s + 1;
    }
  }
}

}  // namespace
}  // namespace meshtrain::test_data_parallel
