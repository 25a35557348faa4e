// End-to-end tests of --precision bf16: every linear layer's and the head's GEMMs take
// bfloat16 operands (rounded to nearest even) with fp32 accumulation; everything else stays
// fp32 (kernels/ops.h Precision, model/gpt.h set_precision).
//
//   Bf16TracksFp32           200 steps of the tiny model: every step's bf16 loss within 0.006
//                            of the fp32 loss, and the mean of the last 20 within 0.001.
//   Bf16LayoutsMatchOneRank  tp2·pp2·dp2 ZeRO-1, tp2 --sp, dp2 ZeRO-3 and pp2 interleaved,
//                            all in bf16: every step's loss within 1e-3 of the one-rank bf16
//                            run (the bound).
//   UnsupportedPrecisionIsRejected  --precision fp16 (not built yet) and an unknown name are
//                            refused with a message before any step.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "cli_test_util.h"
#include "multirank_test_util.h"

namespace meshtrain {
namespace {

using namespace cli_test;
using namespace multirank_test;

class MixedPrecisionTest : public MultiRankTest<MixedPrecisionTest> {
 protected:
  using Base = MultiRankTest<MixedPrecisionTest>;
  friend Base;
  static constexpr const char* kTag = "precision";

  void SetUp() override {
#ifndef MESHTRAIN_HAVE_MPI
    GTEST_SKIP() << "built without MPI (MESHTRAIN_WITH_MPI=OFF): no multi-rank runs";
#endif
    CliTest::SetUp();
  }
  static int job_capacity() { return slots_from_env_or_cores(); }
  static std::string train(const std::string& args) {
    return kBinary + " train --data " + corpus_ + " --peak-gflops 100 --threads 1 " + args;
  }

  static std::vector<double> losses(const std::string& args) {
    std::vector<double> out;
    for (const auto& j : metrics_of(args).steps) out.push_back(j["loss"].get<double>());
    return out;
  }
};
using MixedPrecision = MixedPrecisionTest;

// bf16 operands keep 8 significant bits, so the two runs' trajectories drift apart slowly.
// Observed here: per-step differences up to 0.00031 and a last-20-steps mean difference of
// 0.00005; on a larger run (T=64, B=8, 2 threads) up to 0.0053 and 0.0006. The bounds
// cover the larger run.
constexpr double kStepTol = 0.006, kTailTol = 0.001;

TEST_F(MixedPrecision, Bf16TracksFp32) {
  const std::string common = "--model tiny --seq-len 32 --micro-batch 4 --steps 200 --eval-batches 1";
  const std::string fp32 = common + " --precision fp32", bf16 = common + " --precision bf16";
  ensure({{fp32, 1}, {bf16, 1}});
  const auto a = losses(fp32), b = losses(bf16);
  ASSERT_EQ(a.size(), 200u);
  ASSERT_EQ(b.size(), 200u);
  double worst = 0;
  for (size_t k = 0; k < a.size(); k++) worst = std::max(worst, std::abs(a[k] - b[k]));
  EXPECT_LE(worst, kStepTol);
  double tail = 0;
  for (size_t k = 180; k < 200; k++) tail += (b[k] - a[k]) / 20;
  EXPECT_LE(std::abs(tail), kTailTol);
  EXPECT_LT(b.back(), b.front() - 2.0) << "bf16 training must learn (loss falls from ~10.8)";
  EXPECT_NE(a, b) << "bf16 GEMMs must change the arithmetic";
  if (std::getenv("MESHTRAIN_TEST_VERBOSE"))
    std::printf("[ bf16     ] worst step |diff| %.5f, last-20 mean diff %.5f\n", worst, tail);
}

TEST_F(MixedPrecision, Bf16LayoutsMatchOneRank) {
  const std::string common =
      "--model tiny --layers 4 --seq-len 64 --global-batch 8 --steps 20 --eval-batches 1 "
      "--precision bf16";
  const std::string one = common + " --micro-batch 8";
  const std::vector<RunSpec> layouts = {
      {common + " --tp 2 --pp 2 --dp 2 --zero 1 --micro-batch 1", 8},
      {common + " --tp 2 --sp --micro-batch 8", 2},
      {common + " --dp 2 --zero 3 --micro-batch 2", 2},
      {common + " --pp 2 --schedule interleaved --virtual-stages 2 --micro-batch 2", 2},
  };
  std::vector<RunSpec> all = layouts;
  all.push_back({one, 1});
  ensure(all);
  const auto ref = losses(one);
  ASSERT_EQ(ref.size(), 20u);
  for (const auto& l : layouts) {
    SCOPED_TRACE(l.args);
    const auto got = losses(l.args);
    ASSERT_EQ(got.size(), ref.size());
    double worst = 0;
    for (size_t k = 0; k < ref.size(); k++) worst = std::max(worst, std::abs(got[k] - ref[k]));
    EXPECT_LE(worst, 1e-3);
    if (std::getenv("MESHTRAIN_TEST_VERBOSE"))
      std::printf("[ bf16     ] %-70s worst |diff| %.2e\n", l.args.c_str(), worst);
  }
}

TEST_F(MixedPrecision, UnsupportedPrecisionIsRejected) {
  expect_failure(run(train("--model tiny --seq-len 32 --steps 1 --precision fp16")),
                 {"--precision fp16", "not implemented yet", "bf16"});
  expect_failure(run(train("--model tiny --seq-len 32 --steps 1 --precision fp8")),
                 {"--precision must be fp32 or bf16, got 'fp8'"});
}

}  // namespace
}  // namespace meshtrain
