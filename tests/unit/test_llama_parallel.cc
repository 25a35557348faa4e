// Llama through the parallel layouts: the GPT-2 suites' parity promise for a model with
// RMSNorm, RoPE, grouped-query attention (2 key/value heads), SwiGLU and an untied head.
// Each cell trains llama-tiny (2 layers, C = 64, 4 heads, 2 kv heads) for 10 steps of 8
// rows and must match the single-rank run with the tolerances of the GPT-2 matrices: the
// loss within 1e-5 at every step, the gradient norm within 1e-5 relative, the final weights
// within 3e-5 (99.9% of them within 1e-6).
//   dp 2 with ZeRO 0-3; tp 2 (one kv head per rank), with and without sp; tp 4 (each of
//   the 2 kv heads replicated on 2 ranks, Megatron's rule), with and without sp; pp 2 (the
//   embedding on the first stage, the untied head on the last) with 1F1B and GPipe; tp 2 x
//   dp 2; pp 2 x dp 2 x ZeRO 1; selective and full recomputation.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "cli_test_util.h"
#include "multirank_test_util.h"

namespace meshtrain::test_llama_parallel {
namespace {

using namespace cli_test;
using namespace multirank_test;
using json = nlohmann::json;
namespace fs = std::filesystem;

const std::string kShape = "--model llama-tiny --seq-len 32";
constexpr int kSteps = 10;
constexpr double kLossTol = 1e-5, kNormRelTol = 1e-5, kWeightTol = 3e-5, kWeightBulkTol = 1e-6;

// A cell: its layout flags, the rows per micro-batch and the micro-batches per step (B·A·dp = 8).
struct Cell {
  std::string layout;
  int ranks = 1;
  int micro_batch = 8, accum = 1;
  std::string args() const {
    return layout + " --micro-batch " + std::to_string(micro_batch) + " --grad-accum " + std::to_string(accum) +
           " --steps " + std::to_string(kSteps);
  }
};

const Cell kReference{"--dp 1"};
const std::vector<Cell> kCells = {
    {"--dp 2 --zero 0", 2, 4},
    {"--dp 2 --zero 1", 2, 4},
    {"--dp 2 --zero 2", 2, 4},
    {"--dp 2 --zero 3", 2, 4},
    {"--tp 2", 2},
    {"--tp 2 --sp", 2},
    {"--tp 4", 4},  // 2 key/value heads over 4 ranks: each replicated on 2
    {"--tp 4 --sp", 4},
    {"--pp 2 --schedule 1f1b", 2, 2, 4},
    {"--pp 2 --schedule gpipe", 2, 2, 4},
    {"--tp 2 --dp 2", 4, 4},
    {"--pp 2 --dp 2 --zero 1", 4, 2, 2},
    {"--dp 1 --recompute selective", 1},
    {"--dp 1 --recompute full", 1},
};

class LlamaParallelTest : public MultiRankTest<LlamaParallelTest> {
 protected:
  using Base = MultiRankTest<LlamaParallelTest>;
  friend Base;
  static constexpr const char* kTag = "llama";
  static int job_capacity() { return core_count(); }
  static std::string train(const std::string& args) {
    return kBinary + " train --data " + corpus_ + " --peak-gflops 100 --threads 1 --eval-batches 1 " + kShape +
           " " + args;
  }
};
using LlamaParallel = LlamaParallelTest;

TEST_F(LlamaParallel, ParityMatrix) {
  std::vector<RunSpec> specs = {{kReference.args(), 1}};
  for (const Cell& c : kCells) specs.push_back({c.args(), c.ranks});
  ensure(specs);
  const Metrics ref = metrics_of(kReference.args());
  ASSERT_EQ(ref.steps.size(), (size_t)kSteps);
  int64_t ref_step = 0;
  const std::vector<float> ref_params = load_params(step_dir(get(kReference.args()).dir, kSteps), &ref_step);
  ASSERT_FALSE(ref_params.empty());
  // The reference is a Llama: its recorded model has Llama's parts.
  const json config = json::parse(read_file(get(kReference.args()).dir + "/config.json"));
  EXPECT_EQ(config["resolved_model"]["arch"], "llama") << config.dump();
  EXPECT_EQ(config["resolved_model"]["kv_heads"], 2);
  EXPECT_EQ(config["resolved_model"]["tied_head"], false);

  for (const Cell& c : kCells) {
    SCOPED_TRACE(c.args());
    const Metrics m = metrics_of(c.args());
    ASSERT_EQ(m.steps.size(), (size_t)kSteps);
    ParityMargins margins;
    for (int s = 0; s < kSteps; s++) expect_step_parity(m.steps[s], ref.steps[s], s, kLossTol, kNormRelTol, &margins);
    EXPECT_EQ(margins.bad, 0) << margins.bad << " steps off, worst loss |diff| " << margins.loss;
    double dw = 0, bulk = 0;
    expect_final_weights_match(get(c.args()).dir, kSteps, ref_params, kWeightTol, kWeightBulkTol, &dw, &bulk);
    if (std::getenv("MESHTRAIN_TEST_VERBOSE"))
      std::printf("[ llama    ] %-50s loss |diff| <= %.3g, norm rel <= %.3g, weights <= %.3g (99.9%% %.3g)\n",
                  c.layout.c_str(), margins.loss, margins.norm, dw, bulk);
  }
}

// 16-bit GEMMs on the Llama blocks (RoPE'd q and k, the GQA products, SwiGLU's rounded
// output) track fp32 within the MixedPrecision suite's per-step bound (0.006), on one rank
// and under tp 2.
TEST_F(LlamaParallel, HalfPrecisionTracksFp32) {
  const std::vector<std::string> runs = {Cell{"--dp 1 --precision bf16"}.args(), Cell{"--dp 1 --precision fp16"}.args(),
                                         Cell{"--tp 2 --precision bf16", 2}.args()};
  std::vector<RunSpec> specs = {{kReference.args(), 1}};
  for (const auto& r : runs) specs.push_back({r, r.find("--tp 2") != std::string::npos ? 2 : 1});
  ensure(specs);
  const Metrics ref = metrics_of(kReference.args());
  ASSERT_EQ(ref.steps.size(), (size_t)kSteps);
  for (const auto& args : runs) {
    SCOPED_TRACE(args);
    const Metrics m = metrics_of(args);
    ASSERT_EQ(m.steps.size(), (size_t)kSteps);
    double worst = 0;
    for (int s = 0; s < kSteps; s++)
      worst = std::max(worst, std::fabs(m.steps[s]["loss"].get<double>() - ref.steps[s]["loss"].get<double>()));
    EXPECT_LE(worst, 0.006);
    EXPECT_GT(worst, 0.0) << "16-bit GEMMs round: some step must differ";
    if (std::getenv("MESHTRAIN_TEST_VERBOSE")) std::printf("[ llama    ] %-40s worst loss |diff| %.3g\n", args.c_str(), worst);
  }
}

// A Llama run's checkpoint resumes bit for bit in its own layout (pp 2, the untied head on
// the last stage) and within 1e-5 under another (dp 2 x ZeRO 3); a tp 4 run, whose ranks
// each save and load a replica of a key/value head, resumes bit for bit; optimizer offload to files
// trains bit-identically to the in-memory run.
TEST_F(LlamaParallel, ResumesAcrossLayoutsAndOffloads) {
  ensure({{kReference.args(), 1}});
  const Metrics ref = metrics_of(kReference.args());
  const std::string base = " --steps 10 --save-every 5 --keep-checkpoints 0";
  const std::string pp2 = "--pp 2 --micro-batch 2 --grad-accum 4" + base, dp2 = "--dp 2 --zero 3 --micro-batch 4" + base;
  const std::string tp4 = "--tp 4 --micro-batch 8" + base;  // replicated key/value heads
  const std::string full = path("full"), same = path("same"), other = path("other");
  const std::string wide_full = path("wide_full"), wide = path("wide");
  Job first, first_wide;
  first.cmd = train(pp2 + " --quiet --out " + full), first.ranks = 2;
  first_wide.cmd = train(tp4 + " --quiet --out " + wide_full), first_wide.ranks = 4;
  run_jobs({&first, &first_wide}, dir_);
  ASSERT_EQ(first.result.exit_code, 0) << describe(first.result);
  ASSERT_EQ(first_wide.result.exit_code, 0) << describe(first_wide.result);
  const Metrics whole = read_metrics(full + "/metrics.jsonl"), whole_wide = read_metrics(wide_full + "/metrics.jsonl");
  ASSERT_EQ(whole.steps.size(), 10u);
  for (const auto& [from, dir] : {std::pair{full, same}, {full, other}, {wide_full, wide}}) {
    // interrupted after step 5's checkpoint
    copy_interrupted_run(from, dir, 5, 10);
  }
  Job resumed_same, resumed_other, resumed_wide, offloaded;
  resumed_same.cmd = train(pp2 + " --quiet --out " + same + " --resume"), resumed_same.ranks = 2;
  resumed_other.cmd = train(dp2 + " --quiet --out " + other + " --resume"), resumed_other.ranks = 2;
  offloaded.cmd = train(kReference.args() + " --offload optimizer=nvme --offload-dir " + path("files") +
                        " --offload-chunk-mb 0.05 --quiet --out " + path("offloaded"));
  resumed_wide.cmd = train(tp4 + " --quiet --out " + wide + " --resume"), resumed_wide.ranks = 4;
  run_jobs({&resumed_same, &resumed_other, &resumed_wide, &offloaded}, dir_);
  for (const Job* j : {&resumed_same, &resumed_other, &resumed_wide, &offloaded})
    ASSERT_EQ(j->result.exit_code, 0) << describe(j->result);
  const Metrics ms = read_metrics(same + "/metrics.jsonl"), mo = read_metrics(other + "/metrics.jsonl"),
                mw = read_metrics(wide + "/metrics.jsonl");
  ASSERT_EQ(ms.steps.size(), 10u);
  ASSERT_EQ(mo.steps.size(), 10u);
  ASSERT_EQ(mw.steps.size(), 10u);
  for (int s = 6; s <= 10; s++) {
    EXPECT_EQ(bits(ms.steps[s - 1]["loss"]), bits(whole.steps[s - 1]["loss"])) << "same layout, step " << s;
    EXPECT_NEAR(mo.steps[s - 1]["loss"].get<double>(), whole.steps[s - 1]["loss"].get<double>(), kLossTol)
        << "dp 2 x ZeRO 3 after a pp 2 checkpoint, step " << s;
    EXPECT_EQ(bits(mw.steps[s - 1]["loss"]), bits(whole_wide.steps[s - 1]["loss"]))
        << "tp 4 (replicated kv heads), step " << s;
  }
  const Metrics off = read_metrics(path("offloaded") + "/metrics.jsonl");
  ASSERT_EQ(off.steps.size(), (size_t)kSteps);
  for (int s = 0; s < kSteps; s++)
    EXPECT_EQ(bits(off.steps[s]["loss"]), bits(ref.steps[s]["loss"])) << "offloaded, step " << s + 1;
}

// Key/value heads that neither split over the tp ranks nor divide them (3 over 2) are
// refused by name, on every rank, before any step.
TEST_F(LlamaParallel, KvHeadsThatDoNotSplitAreRefused) {
  expect_all_rejected(
      {{"--tp 2 --dim 96 --heads 6 --kv-heads 3 --micro-batch 8", 2, {"--tp 2 and the 3 key/value heads"}}}, true);
}

}  // namespace
}  // namespace meshtrain::test_llama_parallel
