// The step profile (core/profile.h, train/step_profile.h; `bench step --profile`, `train
// --profile`):
//   ScopesAreExclusiveAndOffByDefault  nothing is recorded while off; a scope inside another
//                                       takes its time out of the outer one; FLOPs, bytes and
//                                       calls add up.
//   TableAndRecordFromKnownFigures      a hand-made profile's rates, shares, rates against the
//                                       peaks and the time outside every op, in the table and
//                                       in the JSON record.
//   TrainWritesOneRecordWithTheModelsFlops  `train --profile` on the tiny model: one profile
//                                       record in metrics.jsonl, every op of the step in it, each
//                                       GEMM site's FLOPs per step those of its shapes, the ops'
//                                       times within the step's.
//   BenchStepPrintsTheTable             `bench step --profile` prints the table.
#include <gtest/gtest.h>

#include <chrono>
#include <random>
#include <thread>

#include <nlohmann/json.hpp>

#include "cli_test_util.h"
#include "core/profile.h"
#include "data/token_file.h"
#include "train/step_profile.h"

namespace meshtrain::test_step_profile {
namespace {

namespace fs = std::filesystem;
using profile::Op;

void sleep_ms(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }
double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

TEST(StepProfile, ScopesAreExclusiveAndOffByDefault) {
  profile::reset();
  ASSERT_FALSE(profile::enabled());
  { const profile::Scope off(Op::kHead, 1e9, 1e6); }
  EXPECT_EQ(profile::snapshot()[(size_t)Op::kHead].calls, 0) << "recorded while off";

  profile::set_enabled(true);
  const auto start = std::chrono::steady_clock::now();
  {
    const profile::Scope outer(Op::kAttention, 100, 0);
    sleep_ms(10);
    for (int i = 0; i < 2; i++) {
      const profile::Scope inner(Op::kConvert, 0, 64);
      sleep_ms(10);
    }
  }
  const double wall = seconds_since(start);
  profile::set_enabled(false);
  const profile::Profile p = profile::snapshot();
  const profile::OpStats &outer = p[(size_t)Op::kAttention], &inner = p[(size_t)Op::kConvert];
  EXPECT_EQ(outer.calls, 1);
  EXPECT_EQ(inner.calls, 2);
  EXPECT_EQ(outer.flops, 100);
  EXPECT_EQ(inner.bytes, 128);
  EXPECT_GE(inner.seconds, 0.020);
  EXPECT_GE(outer.seconds, 0.010);
  // Exclusive: the two add up to no more than the outer scope's wall time.
  EXPECT_LE(outer.seconds + inner.seconds, wall);
  EXPECT_LT(outer.seconds, wall - 0.020 + 1e-9) << "the inner scopes' time was not taken out";
  profile::reset();
  EXPECT_EQ(profile::snapshot()[(size_t)Op::kAttention].calls, 0);
}

TEST(StepProfile, TableAndRecordFromKnownFigures) {
  profile::Profile p{};
  // Two steps of 1 s: fc1 took 0.5 s in all for 200 GFLOP (200 GFLOP/s), the norm 0.1 s for
  // 2 GB (20 GB/s); the rest of the 2 s was outside every op.
  p[(size_t)Op::kFc1] = {0.5, 200e9, 0, 4};
  p[(size_t)Op::kNorm] = {0.1, 0, 2e9, 10};
  const train::ProfilePeaks peaks{400, 40};
  const nlohmann::json j = train::profile_json(p, 2, 1.0, peaks);
  EXPECT_EQ(j["steps"], 2);
  EXPECT_DOUBLE_EQ(j["step_ms"].get<double>(), 1000);
  EXPECT_DOUBLE_EQ(j["other_ms"].get<double>(), 700);  // 1000 - 250 - 50
  const nlohmann::json& fc1 = j["ops"]["fc1"];
  EXPECT_DOUBLE_EQ(fc1["ms_per_step"].get<double>(), 250);
  EXPECT_DOUBLE_EQ(fc1["share"].get<double>(), 0.25);
  EXPECT_DOUBLE_EQ(fc1["calls_per_step"].get<double>(), 2);
  EXPECT_DOUBLE_EQ(fc1["gflops"].get<double>(), 400);
  EXPECT_DOUBLE_EQ(fc1["of_peak"].get<double>(), 1.0);
  const nlohmann::json& norm = j["ops"]["norm"];
  EXPECT_DOUBLE_EQ(norm["gbps"].get<double>(), 20);
  EXPECT_DOUBLE_EQ(norm["of_peak"].get<double>(), 0.5);
  EXPECT_FALSE(j["ops"].contains("head")) << "an op that never ran has no row";

  const std::string table = train::profile_table(p, 2, 1.0, peaks);
  for (const char* part : {"fc1", "norm", "other", "400", "100.0% G", "50.0% M", "GEMM peak 400.0 GFLOP/s"})
    EXPECT_NE(table.find(part), std::string::npos) << part << " missing from\n" << table;
  EXPECT_LT(table.find("fc1"), table.find("norm")) << "rows go by time, longest first";
}

class StepProfileRun : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = cli_test::fresh_dir(fs::temp_directory_path() / ("meshtrain_step_profile_" + cli_test::kPid));
    std::mt19937 rng(3);
    std::vector<data::Token> tokens(20000);
    for (auto& t : tokens) t = (data::Token)(rng() % 512);
    ASSERT_TRUE(data::write_token_file(dir_ + "/train.bin", tokens).is_ok());
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }
  static inline std::string dir_;
};

TEST_F(StepProfileRun, TrainWritesOneRecordWithTheModelsFlops) {
  const int L = 2, C = 64, B = 2, T = 32, V = 512, steps = 3;
  const std::string out = dir_ + "/run";
  const cli_test::RunResult r =
      cli_test::run(cli_test::kBinary + " train --data " + dir_ + " --model tiny --vocab 512 --seq-len 32 --micro-batch 2" +
                    " --steps 3 --eval-every 0 --threads 1 --peak-gflops 100 --profile --out " + out);
  ASSERT_EQ(r.exit_code, 0) << cli_test::describe(r);
  EXPECT_NE(r.out.find("step profile (2 steps"), std::string::npos) << r.out;  // the steps after the first
  std::vector<nlohmann::json> profiles;
  for (const std::string& line : cli_test::lines_of(cli_test::read_file(out + "/metrics.jsonl"))) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains("profile")) profiles.push_back(j["profile"]);
  }
  ASSERT_EQ(profiles.size(), 1u);
  const nlohmann::json& p = profiles[0];
  EXPECT_EQ(p["steps"], steps - 1);
  const nlohmann::json& ops = p["ops"];
  for (const char* op : {"qkv", "attn_proj", "fc1", "fc2", "head", "attention", "norm", "activation", "residual",
                         "cross_entropy", "embedding", "optimizer"})
    EXPECT_TRUE(ops.contains(op)) << op << " missing: " << ops.dump();
  // Each GEMM site's FLOPs per step: its forward (2 N in out) and backward (twice that),
  // over the layers; the head's over the vocabulary.
  const double N = B * T;
  auto flops_per_step = [&](const char* op) {
    return ops[op]["gflops"].get<double>() * 1e9 * ops[op]["ms_per_step"].get<double>() / 1e3;
  };
  EXPECT_NEAR(flops_per_step("qkv"), 6.0 * N * C * 3 * C * L, 1e-6 * N * C * C * L);
  EXPECT_NEAR(flops_per_step("fc1"), 6.0 * N * C * 4 * C * L, 1e-6 * N * C * C * L);
  EXPECT_NEAR(flops_per_step("head"), 6.0 * N * C * V, 1e-6 * N * C * V);
  EXPECT_DOUBLE_EQ(ops["qkv"]["calls_per_step"].get<double>(), 2 * L);  // forward and backward per layer
  EXPECT_DOUBLE_EQ(ops["optimizer"]["calls_per_step"].get<double>(), 1);
  double sum = 0;
  for (const auto& [name, op] : ops.items()) sum += op["ms_per_step"].get<double>();
  EXPECT_LE(sum, 1.05 * p["step_ms"].get<double>()) << "the ops took longer than their steps";
  EXPECT_GT(p["triad_gbps"].get<double>(), 0);
}

TEST_F(StepProfileRun, BenchStepPrintsTheTable) {
  const cli_test::RunResult r = cli_test::run(cli_test::kBinary +
                                              " bench step --model tiny --seq-len 32 --micro-batch 2 --warmup 0 "
                                              "--steps 1 --threads 1 --peak-gflops 100 --profile");
  ASSERT_EQ(r.exit_code, 0) << cli_test::describe(r);
  for (const char* part : {"step profile (1 step of", "qkv", "head", "optimizer", "other", "triad"})
    EXPECT_NE(r.out.find(part), std::string::npos) << part << " missing from\n" << r.out;
}

}  // namespace
}  // namespace meshtrain::test_step_profile
