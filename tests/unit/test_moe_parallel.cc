// Mixture of Experts through the parallel layouts (docs/moe.md): each cell trains llama-tiny
// with 4 layers, MoE in layers 0 and 2 (4 experts of 64, top-2, a shared expert, z-loss) and
// dense MLPs in 1 and 3, for 20 steps of 8 rows, and must match one rank at the dense
// suites' tolerances: the loss within 1e-5 at every step, the gradient norm within 1e-5
// relative, the final weights within 3e-5 (99.9% within 1e-6); the routing statistics
// (balance loss, drops) must be the reference's.
//   dropless: dp 2 at ZeRO 0, 1, 3; tp 2 (experts split like the MLP), with sp (the routing
//   sees every row of the gathered sequence); pp 2 (1F1B, GPipe); tp 2 x dp 2; pp 2 x dp 2
//   x ZeRO 1; full and selective recomputation;
//   capacity factor 1 (assignments dropped, checked), with its own one-rank reference: dp 2,
//   tp 2 x sp, pp 2;
//   bf16 against one-rank bf16 (within MixedPrecision's 1e-3 for layouts).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "cli_test_util.h"
#include "multirank_test_util.h"

namespace meshtrain::test_moe_parallel {
namespace {

using namespace cli_test;
using namespace multirank_test;

const std::string kShape =
    "--model llama-tiny --layers 4 --seq-len 32 --moe-experts 4 --moe-top-k 2 --moe-ffn-dim 64 --moe-every 2 "
    "--moe-shared-experts 1 --moe-z-loss 0.001";
constexpr int kSteps = 20;
constexpr double kLossTol = 1e-5, kNormRelTol = 1e-5, kWeightTol = 3e-5, kWeightBulkTol = 1e-6;

struct Cell {
  std::string layout;
  int ranks = 1;
  int micro_batch = 8, accum = 1;
  std::string args(const std::string& extra = "") const {
    return layout + extra + " --micro-batch " + std::to_string(micro_batch) + " --grad-accum " +
           std::to_string(accum) + " --steps " + std::to_string(kSteps);
  }
};

const Cell kReference{"--dp 1"};
const std::vector<Cell> kDropless = {
    {"--dp 2 --zero 0", 2, 4},
    {"--dp 2 --zero 1", 2, 4},
    {"--dp 2 --zero 3", 2, 4},
    {"--tp 2", 2},
    {"--tp 2 --sp", 2},
    {"--pp 2 --schedule 1f1b", 2, 2, 4},
    {"--pp 2 --schedule gpipe", 2, 2, 4},
    {"--tp 2 --dp 2", 4, 4},
    {"--pp 2 --dp 2 --zero 1", 4, 2, 2},
    {"--dp 1 --recompute selective", 1},
    {"--dp 1 --recompute full", 1},
};
const std::string kCapacity = " --moe-capacity-factor 1";
const std::vector<Cell> kWithDrops = {
    {"--dp 2 --zero 1", 2, 4},
    {"--tp 2 --sp", 2},
    {"--pp 2 --schedule 1f1b", 2, 2, 4},
};

class MoeParallelTest : public MultiRankTest<MoeParallelTest> {
 protected:
  using Base = MultiRankTest<MoeParallelTest>;
  friend Base;
  static constexpr const char* kTag = "moe";
  static int job_capacity() { return core_count(); }
  static std::string train(const std::string& args) {
    return kBinary + " train --data " + corpus_ + " --peak-gflops 100 --threads 1 --eval-batches 1 " + kShape +
           " " + args;
  }
  // Every cell's steps and final weights against the reference run's.
  void expect_cells_match(const std::string& reference, const std::vector<std::string>& cells) {
    const Metrics ref = metrics_of(reference);
    ASSERT_EQ(ref.steps.size(), (size_t)kSteps);
    int64_t ref_step = 0;
    const std::vector<float> ref_params = load_params(step_dir(get(reference).dir, kSteps), &ref_step);
    ASSERT_FALSE(ref_params.empty());
    for (const std::string& args : cells) {
      SCOPED_TRACE(args);
      const Metrics m = metrics_of(args);
      ASSERT_EQ(m.steps.size(), (size_t)kSteps);
      ParityMargins margins;
      for (int s = 0; s < kSteps; s++) {
        expect_step_parity(m.steps[s], ref.steps[s], s, kLossTol, kNormRelTol, &margins);
        // The routing statistics are the job's, whatever the layout.
        EXPECT_NEAR(m.steps[s]["moe"]["aux_loss"].get<double>(), ref.steps[s]["moe"]["aux_loss"].get<double>(), 1e-6);
        EXPECT_EQ(m.steps[s]["moe"]["dropped_fraction"], ref.steps[s]["moe"]["dropped_fraction"]) << "step " << s;
      }
      EXPECT_EQ(margins.bad, 0) << margins.bad << " steps off, worst loss |diff| " << margins.loss;
      double dw = 0, bulk = 0;
      expect_final_weights_match(get(args).dir, kSteps, ref_params, kWeightTol, kWeightBulkTol, &dw, &bulk);
      if (std::getenv("MESHTRAIN_TEST_VERBOSE"))
        std::printf("[ moe      ] %-60s loss |diff| <= %.3g, norm rel <= %.3g, weights <= %.3g (99.9%% %.3g)\n",
                    args.c_str(), margins.loss, margins.norm, dw, bulk);
    }
  }
};
using MoeParallel = MoeParallelTest;

TEST_F(MoeParallel, DroplessLayoutsMatchOneRank) {
  std::vector<RunSpec> specs = {{kReference.args(), 1}};
  std::vector<std::string> cells;
  for (const Cell& c : kDropless) specs.push_back({c.args(), c.ranks}), cells.push_back(c.args());
  ensure(specs);
  expect_cells_match(kReference.args(), cells);
  const Metrics ref = metrics_of(kReference.args());
  ASSERT_FALSE(ref.steps.empty());
  EXPECT_EQ(ref.steps[0]["moe"]["dropped_fraction"], 0.0);
}

TEST_F(MoeParallel, CapacityDropsMatchOneRank) {
  std::vector<RunSpec> specs = {{kReference.args(kCapacity), 1}};
  std::vector<std::string> cells;
  for (const Cell& c : kWithDrops) specs.push_back({c.args(kCapacity), c.ranks}), cells.push_back(c.args(kCapacity));
  ensure(specs);
  expect_cells_match(kReference.args(kCapacity), cells);
  const Metrics ref = metrics_of(kReference.args(kCapacity));
  double dropped = 0;
  for (const auto& s : ref.steps) dropped += s["moe"]["dropped_fraction"].get<double>();
  EXPECT_GT(dropped, 0.0) << "capacity factor 1 must drop assignments";
}

TEST_F(MoeParallel, Bf16LayoutsMatchOneRankBf16) {
  const std::string bf16 = " --precision bf16";
  const std::vector<Cell> cells = {{"--dp 2 --zero 3", 2, 4}, {"--tp 2 --sp", 2}, {"--pp 2", 2, 2, 4}};
  std::vector<RunSpec> specs = {{kReference.args(bf16), 1}};
  for (const Cell& c : cells) specs.push_back({c.args(bf16), c.ranks});
  ensure(specs);
  const Metrics ref = metrics_of(kReference.args(bf16));
  ASSERT_EQ(ref.steps.size(), (size_t)kSteps);
  for (const Cell& c : cells) {
    SCOPED_TRACE(c.args(bf16));
    const Metrics m = metrics_of(c.args(bf16));
    ASSERT_EQ(m.steps.size(), (size_t)kSteps);
    double worst = 0;
    for (int s = 0; s < kSteps; s++)
      worst = std::max(worst, std::fabs(m.steps[s]["loss"].get<double>() - ref.steps[s]["loss"].get<double>()));
    EXPECT_LE(worst, 1e-3);
  }
}

}  // namespace
}  // namespace meshtrain::test_moe_parallel
