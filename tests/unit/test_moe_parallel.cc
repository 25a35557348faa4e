// Mixture of Experts through the parallel layouts (docs/moe.md): each cell trains llama-tiny
// with 4 layers, MoE in layers 0 and 2 (4 experts of 64, top-2, a shared expert, z-loss) and
// dense MLPs in 1 and 3, for 20 steps of 8 rows, and must match one rank at the dense
// suites' tolerances: the loss within 1e-5 at every step, the gradient norm within 1e-5
// relative, the final weights within 3e-5 (99.9% within 1e-6); the routing statistics
// (balance loss, drops) must be the reference's.
//   dropless: dp 2 at ZeRO 0, 1, 3; tp 2 (experts split like the MLP), with sp (the routing
//   sees every row of the gathered sequence); pp 2 (1F1B, GPipe); tp 2 x dp 2; pp 2 x dp 2
//   x ZeRO 1; experts whole on each tp rank (--expert-tp 1) at tp 2, tp 2 x dp 2 x ZeRO 3
//   and pp 2 x tp 2; full and selective recomputation;
//   capacity factor 1 (assignments dropped, checked), with its own one-rank reference: dp 2,
//   tp 2 x sp (experts split and whole), pp 2;
//   bf16 against one-rank bf16, experts split and whole (within MixedPrecision's 1e-3 for layouts);
//   expert parallelism: ep 2 and 4 x dp x ZeRO 0, 1, 3 (ep 2 of dp 4: experts sharded over
//   their expert-data-parallel pairs), ep x tp x sp (experts split and whole), ep 2 of dp 4 x tp 2
//   with whole experts (gradients summed over tp, then edp), ep x pp, ep with full recomputation,
//   with capacity drops, in bf16 and fp16, and with aux-loss-free balancing (ep, ep x pp: the
//   biases move, change the losses, and match); ep x ZeRO-3 with every state in files, bit-identical
//   to memory; the all-to-all bytes against their formula (and halved per tp rank at
//   tp 2, split or whole experts alike), and whole experts' tp traffic: no row exchange, their
//   gradients' all-reduce instead; a checkpoint written at ep 4 resumed at ep 2 and on one
//   rank; one with whole experts resumed, and refused with split ones.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include <filesystem>

#include "cli_test_util.h"
#include "multirank_test_util.h"

namespace meshtrain::test_moe_parallel {
namespace {

using namespace cli_test;
using namespace multirank_test;
using json = nlohmann::json;
namespace fs = std::filesystem;

// A vocabulary of 300 on the small corpus (multirank_test_util.h): with the Brown corpus's
// 50,257 a run took 2.3 s, 0.44 s now (dp 2, 12 steps); the experts, their routing and the
// parity are in the blocks.
const std::string kShape =
    "--model llama-tiny --layers 4 --seq-len 32 --vocab 300 --moe-experts 4 --moe-top-k 2 --moe-ffn-dim 64 "
    "--moe-every 2 --moe-shared-experts 1 --moe-z-loss 0.001";
// 12 steps (20 until 2026-12-04), for the test command's 40 minutes: the suite went from
// 323 s to 306 s (each run's start-up dominates); the router's choices, drops and biases
// move within the first steps, and the tolerances below are unchanged.
constexpr int kSteps = 12;
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
    // Experts whole on each tp rank, each computing its share of the rows.
    {"--tp 2 --expert-tp 1", 2},
    {"--tp 2 --dp 2 --zero 3 --expert-tp 1", 4, 4},
    {"--pp 2 --tp 2 --expert-tp 1", 4, 2, 4},
    {"--dp 1 --recompute selective", 1},
    {"--dp 1 --recompute full", 1},
};
const std::string kCapacity = " --moe-capacity-factor 1";
const std::string kBias = " --moe-bias-speed 0.01";
const std::vector<Cell> kWithDrops = {
    {"--dp 2 --zero 1", 2, 4},
    {"--tp 2 --sp", 2},
    {"--tp 2 --sp --expert-tp 1", 2},
    {"--pp 2 --schedule 1f1b", 2, 2, 4},
};

class MoeParallelTest : public MultiRankTest<MoeParallelTest> {
 protected:
  using Base = MultiRankTest<MoeParallelTest>;
  friend Base;
  static constexpr const char* kTag = "moe";
  static int job_capacity() { return core_count(); }
  static std::string train(const std::string& args) {
    return kBinary + " train --data " + small_corpus_ + " --peak-gflops 100 --threads 1 --eval-batches 1 " + kShape +
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
  }  // Runs the first, checkpointing job of a resume test (ten steps, saving at step 5) and
  // reads its metrics.
  void run_saving(const std::string& cmd, int ranks, const std::string& out, Metrics* uninterrupted) {
    Job first;
    first.cmd = train(cmd + " --save-every 5 --keep-checkpoints 0 --quiet --out " + out), first.ranks = ranks;
    run_jobs({&first}, dir_);
    ASSERT_EQ(first.result.exit_code, 0) << describe(first.result);
    *uninterrupted = read_metrics(out + "/metrics.jsonl");
    ASSERT_EQ(uninterrupted->steps.size(), 10u);
  }
  // Steps 6-10 of a run resumed from step 5 against the uninterrupted run's.
  static void expect_resumed_losses(const std::string& dir, const Metrics& uninterrupted) {
    const Metrics m = read_metrics(dir + "/metrics.jsonl");
    ASSERT_EQ(m.steps.size(), 10u) << dir;
    for (int s = 6; s <= 10; s++)
      EXPECT_NEAR(m.steps[s - 1]["loss"].get<double>(), uninterrupted.steps[s - 1]["loss"].get<double>(), kLossTol)
          << dir << " step " << s;
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
  const std::vector<Cell> cells = {{"--dp 2 --zero 3", 2, 4}, {"--tp 2 --sp", 2}, {"--tp 2 --sp --expert-tp 1", 2},
                                   {"--pp 2", 2, 2, 4}};
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

const std::vector<Cell> kExpertParallel = {
    {"--dp 2 --ep 2 --zero 0", 2, 4},
    {"--dp 2 --ep 2 --zero 1", 2, 4},
    {"--dp 2 --ep 2 --zero 3", 2, 4},
    {"--dp 4 --ep 4 --zero 1", 4, 2},
    {"--dp 4 --ep 2 --zero 0", 4, 2},
    {"--dp 4 --ep 2 --zero 3", 4, 2},
    {"--tp 2 --sp --dp 2 --ep 2", 4, 4},
    {"--tp 2 --sp --dp 2 --ep 2 --expert-tp 1", 4, 4},
    {"--tp 2 --dp 4 --ep 2 --zero 1 --expert-tp 1", 8, 2},
    {"--pp 2 --dp 2 --ep 2 --zero 1", 4, 2, 2},
    {"--dp 2 --ep 2 --recompute full", 2, 4},
};

TEST_F(MoeParallel, ExpertParallelLayoutsMatchOneRank) {
  std::vector<RunSpec> specs = {{kReference.args(), 1}};
  std::vector<std::string> cells;
  for (const Cell& c : kExpertParallel) specs.push_back({c.args(), c.ranks}), cells.push_back(c.args());
  const std::vector<Cell> drops = {{"--dp 2 --ep 2 --zero 1", 2, 4}, {"--dp 4 --ep 4 --zero 3", 4, 2}};
  std::vector<std::string> drop_cells;
  specs.push_back({kReference.args(kCapacity), 1});
  for (const Cell& c : drops) specs.push_back({c.args(kCapacity), c.ranks}), drop_cells.push_back(c.args(kCapacity));
  const Cell bf16{"--dp 2 --ep 2 --zero 3", 2, 4};
  const Cell fp16{"--dp 2 --ep 2 --zero 1", 2, 4};
  for (const char* precision : {" --precision bf16", " --precision fp16"})
    specs.push_back({kReference.args(precision), 1});
  specs.push_back({bf16.args(" --precision bf16"), 2});
  specs.push_back({fp16.args(" --precision fp16"), 2});
  // ZeRO-Infinity: every expert and dense shard in files, read back bit for bit.
  const std::string offload = " --offload params=nvme,grads=nvme,optimizer=nvme --offload-dir " + path("files");
  specs.push_back({bf16.args(offload), 2});
  // Aux-loss-free balancing: the biases move with the job's loads, the same on every rank.
  const std::vector<Cell> biased = {{"--dp 2 --ep 2 --zero 1", 2, 4}, {"--pp 2 --dp 2 --ep 2 --zero 1", 4, 2, 2}};
  std::vector<std::string> biased_cells;
  specs.push_back({kReference.args(kBias), 1});
  for (const Cell& c : biased) specs.push_back({c.args(kBias), c.ranks}), biased_cells.push_back(c.args(kBias));
  ensure(specs);
  const Metrics plain = metrics_of(kReference.args()), with_bias = metrics_of(kReference.args(kBias));
  const json& moved = with_bias.steps.back()["moe"]["expert_bias"];
  EXPECT_LT(moved["min"].get<double>(), 0.0);
  EXPECT_GT(moved["max"].get<double>(), 0.0);
  double apart = 0;
  for (int s = 0; s < kSteps; s++)
    apart = std::max(apart, std::abs(with_bias.steps[s]["loss"].get<double>() - plain.steps[s]["loss"].get<double>()));
  EXPECT_GT(apart, 1e-4) << "the bias must change the routing";
  expect_cells_match(kReference.args(kBias), biased_cells);
  const Metrics in_memory = metrics_of(bf16.args()), in_files = metrics_of(bf16.args(offload));
  ASSERT_EQ(in_files.steps.size(), (size_t)kSteps);
  for (int s = 0; s < kSteps; s++)
    EXPECT_EQ(in_files.steps[s]["loss"].get<double>(), in_memory.steps[s]["loss"].get<double>()) << "offloaded, step " << s;
  expect_cells_match(kReference.args(), cells);
  expect_cells_match(kReference.args(kCapacity), drop_cells);
  // 16-bit runs against one rank at the same precision, within MixedPrecision's 1e-3.
  for (const auto& [cell, precision] : {std::pair{bf16, " --precision bf16"}, {fp16, " --precision fp16"}}) {
    const Metrics ref = metrics_of(kReference.args(precision)), m = metrics_of(cell.args(precision));
    ASSERT_EQ(m.steps.size(), (size_t)kSteps);
    for (int s = 0; s < kSteps; s++)
      EXPECT_NEAR(m.steps[s]["loss"].get<double>(), ref.steps[s]["loss"].get<double>(), 1e-3) << precision << " step " << s;
  }
}

// What an ep rank sends over "ep" in a step, from its routing statistics: per MoE layer and
// micro-batch, the counts (E/ep floats to each other rank) once, then the dispatched rows
// (C floats each) four times: dispatch and combine, forward and backward. Plus the
// gradient norm's one double summed over ep. Under tp 2 the same routing sends each tp
// rank's half of the rows (rank 0: the first floor(n/2) of each block of n).
TEST_F(MoeParallel, AllToAllBytesEqualTheirFormula) {
  const Cell c{"--dp 2 --ep 2 --zero 0", 2, 4}, tp{"--tp 2 --sp --dp 2 --ep 2", 4, 4},
      whole{"--tp 2 --sp --dp 2 --ep 2 --expert-tp 1", 4, 4};
  ensure({{c.args(), 2}, {tp.args(), 4}, {whole.args(), 4}});
  const Metrics m = metrics_of(c.args()), halves = metrics_of(tp.args()), whole_experts = metrics_of(whole.args());
  ASSERT_EQ(m.steps.size(), (size_t)kSteps);
  ASSERT_EQ(halves.steps.size(), (size_t)kSteps);
  ASSERT_EQ(whole_experts.steps.size(), (size_t)kSteps);
  const int64_t C = 64, E = 4, ep = 2, moe_layers = 2, micro_batches = 1, Fe = 64;
  auto rows = [](const json& s, const char* key) { return s["moe"][key].get<int64_t>(); };
  auto bytes = [](const json& s, const char* axis) { return s["comm"][axis]["bytes"].get<int64_t>(); };
  // Whole experts' gradients (w1, w3, w2 of E/ep experts per MoE layer) summed over tp 2:
  // a ring all-reduce sends 2 (tp - 1) / tp of them, all of them at tp 2.
  const int64_t expert_grad_bytes = moe_layers * (E / ep) * 3 * C * Fe * 4;
  for (int i = 0; i < kSteps; i++) {
    // The same shares cross ep whether the experts are split or whole.
    EXPECT_EQ(bytes(whole_experts.steps[i], "ep"), bytes(halves.steps[i], "ep")) << "step " << i;
    // Split experts exchange every row they compute on over tp, forward and backward (each
    // rank its own share out, the others' partial sums back): 2 x C floats per row. Whole
    // experts skip that, and all-reduce their gradients instead.
    const int64_t exchanged = bytes(halves.steps[i], "tp") - bytes(whole_experts.steps[i], "tp") + expert_grad_bytes;
    EXPECT_GT(exchanged, 0) << "step " << i;
    EXPECT_EQ(exchanged % (2 * C * 4), 0) << "step " << i;
    // Those rows include both tp ranks' shares of what the other ep rank sent.
    EXPECT_GE(exchanged / (2 * C * 4), 2 * rows(halves.steps[i], "received_rows") - moe_layers * micro_batches)
        << "step " << i;
    for (const json& s : {m.steps[i], halves.steps[i]}) {
      const int64_t sent = rows(s, "sent_rows"), received = rows(s, "received_rows");
      EXPECT_GT(sent, 0);
      const int64_t want = moe_layers * micro_batches * (ep - 1) * (E / ep) * 4 + 2 * (sent + received) * C * 4 + 8;
      EXPECT_EQ(s["comm"]["ep"]["bytes"].get<int64_t>(), want) << s.dump();
    }
    const int64_t blocks = moe_layers * micro_batches;  // each rounds down by at most 1/2 row
    for (const char* key : {"sent_rows", "received_rows"}) {
      const int64_t whole = rows(m.steps[i], key), half = rows(halves.steps[i], key);
      EXPECT_LE(2 * half, whole) << key << " step " << i;
      EXPECT_GE(2 * half, whole - blocks) << key << " step " << i;
    }
  }
}

// A checkpoint written at dp 4 x ep 4 (one expert per rank) resumes at dp 2 x ep 2 and on
// one rank (every expert) within the parity tolerance of the uninterrupted run, the
// routing biases of aux-loss-free balancing included.
TEST_F(MoeParallel, CheckpointsLoadAcrossExpertParallelSizes) {
  // With aux-loss-free balancing, whose biases travel in the checkpoint's train_state.
  const std::string wide = "--dp 4 --ep 4 --micro-batch 2 --steps 10" + kBias,
                    narrow = "--dp 2 --ep 2 --micro-batch 4 --steps 10" + kBias,
                    one = "--dp 1 --micro-batch 8 --steps 10" + kBias;
  const std::string full = path("ep4"), to_ep2 = path("ep2"), to_one = path("one");
  Metrics whole;
  run_saving(wide, 4, full, &whole);
  if (HasFatalFailure()) return;
  const json index = json::parse(read_file(step_dir(full, 5) + "/index.json"));
  EXPECT_EQ(index["ep_size"], 4);
  EXPECT_EQ(index["train_state"]["moe_expert_bias"]["0"].size(), 4u) << "layer 0's four experts";
  for (const std::string& dir : {to_ep2, to_one}) copy_interrupted_run(full, dir, 5, 10);
  Job a, b;
  a.cmd = train(narrow + " --quiet --out " + to_ep2 + " --resume"), a.ranks = 2;
  b.cmd = train(one + " --quiet --out " + to_one + " --resume"), b.ranks = 1;
  run_jobs({&a, &b}, dir_);
  for (const Job* j : {&a, &b}) ASSERT_EQ(j->result.exit_code, 0) << describe(j->result);
  for (const std::string& dir : {to_ep2, to_one}) expect_resumed_losses(dir, whole);
}

// A checkpoint of whole experts on each tp rank (each tp file holds every expert of its ep
// rank) resumes within the parity tolerance of the uninterrupted run at the same layout,
// with the experts split over tp (--expert-tp 2), and at tp 1 with one expert per rank
// (dp 4 ep 4): the experts are re-sliced on load like every other tensor.
TEST_F(MoeParallel, WholeExpertCheckpointsResumeUnderOtherLayouts) {
  const std::string layout = "--tp 2 --dp 2 --ep 2 --micro-batch 4 --steps 10";
  const std::string full = path("whole");
  Metrics uninterrupted;
  run_saving(layout + " --expert-tp 1", 4, full, &uninterrupted);
  if (HasFatalFailure()) return;
  EXPECT_EQ(json::parse(read_file(step_dir(full, 5) + "/index.json"))["expert_tp"], 1);
  const std::vector<std::pair<std::string, std::string>> resumes = {
      {"same", layout + " --expert-tp 1"}, {"split", layout}, {"ep4", "--dp 4 --ep 4 --micro-batch 2 --steps 10"}};
  std::vector<Job> jobs(resumes.size());
  std::vector<Job*> running;
  for (size_t i = 0; i < resumes.size(); i++) {
    copy_interrupted_run(full, path(resumes[i].first), 5, 10);
    jobs[i].cmd = train(resumes[i].second + " --quiet --out " + path(resumes[i].first) + " --resume");
    jobs[i].ranks = 4;
    running.push_back(&jobs[i]);
  }
  run_jobs(running, dir_);
  for (size_t i = 0; i < resumes.size(); i++) {
    ASSERT_EQ(jobs[i].result.exit_code, 0) << describe(jobs[i].result);
    expect_resumed_losses(path(resumes[i].first), uninterrupted);
  }
}

// Bad expert-parallel (and expert-tp) sizes are refused by name on every rank before any step.
TEST_F(MoeParallel, BadExpertParallelSizesAreRefused) {
  expect_all_rejected({{"--dp 2 --ep 4 --micro-batch 4", 2, {"--ep 4 must divide the data-parallel size dp = 2"}},
                       {"--tp 2 --ep 2 --micro-batch 8", 2, {"--ep 2 must divide the data-parallel size dp = 1"}},
                       {"--tp 2 --expert-tp 3 --micro-batch 8", 2,
                        {"--expert-tp must be 1 (each expert whole on every tp rank) or --tp (2, each split over them), got 3"}}},
                      true);
}

}  // namespace
}  // namespace meshtrain::test_moe_parallel
