// End-to-end tests of context parallelism (--cp N --cp-comm ring|a2a|all-gather|hybrid):
// each sequence split over N ranks (model/cp_split.h), composed with tp and sp, pp, dp and
// ZeRO, recomputation, document masks, MoE and bf16, and checkpoints read at other layouts.
//
//   ParityMatrix          ring: cp2, cp4, cp2·tp2 --sp --recompute selective, cp2·pp2 1f1b,
//                         cp2·pp2 interleaved v=2, cp2·dp2 ZeRO-1, cp2·dp2 ZeRO-3, cp2 --doc-mask
//                         (a document per sentence), cp4 --doc-mask --recompute full, cp2 on
//                         Llama (grouped-query heads); a2a: cp2, cp4, cp2·tp2 sp, cp2·pp2,
//                         cp2·pp2 interleaved v=2, cp2·dp2 ZeRO-3, cp2·dp2·ep2 ZeRO-1 MoE,
//                         cp2 --doc-mask, Llama at cp2 and cp4 (key/value heads
//                         replicated); all-gather: cp2, cp4 --doc-mask on Llama, cp2·tp2 sp,
//                         cp2·dp2 ZeRO-3; hybrid (a2a in pairs, ring across): cp4, cp4 --doc-mask
//                         --recompute full on Llama (one key/value head a pair member),
//                         cp4·tp2 sp, cp4·pp2 1f1b and interleaved v=2, cp4·dp2 ZeRO-3,
//                         cp4·dp2·ep2 ZeRO-1 MoE; MoE (4 experts, top 2): cp2 with capacity, cp2·dp2·ep2
//                         ZeRO-1 with capacity, a2a cp4 with aux-loss-free biases and the
//                         micro-batch balance loss; with --dropout 0.1: ring cp2, cp2·tp2 sp and
//                         cp4·pp2, a2a cp2; under the balanced split (document masks, ring
//                         and all-gather): also cp2·pp2 and cp2 with dropout, each step's
//                         cp_balance no worse than the causal split's and better in some; at a
//                         global batch of 4 rows of T = 64 on 4-layer tiny models: every step's loss within 1e-5 of the one-rank run, grad_norm
//                         within 1e-5 relative, final weights within the pipeline suite's
//                         tolerances; the cp wire bytes exactly the documented formulas (per
//                         step's row length under a curriculum: ring cp2 and a2a cp4 with a
//                         seqlen curriculum); ring cp2·dp2 ZeRO-1 with the optimizer state in
//                         files; cp2·dp2 with PowerSGD against dp2 with PowerSGD; bf16 at cp2 (ring and a2a) and cp4 (hybrid), and fp16 at cp2,
//                         within the 16-bit bound.
//   CheckpointsResumeAtOtherCp  a cp2 run's checkpoint resumes at cp1 and at cp4 with the
//                         losses of the run that never stopped.
//   BadInputIsRejected    T not divisible by 2 cp, an unknown --cp-comm, hybrid's --cp-a2a not a
//                         real split of cp, --cp-a2a without hybrid, heads a2a cannot split,
//                         refused before work;
//                         generate and serve refuse --cp 2.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "cli_test_util.h"
#include "multirank_test_util.h"

namespace meshtrain::test_context_parallel {
namespace {

using multirank_test::MultiRankTest;
using multirank_test::RunSpec;
using json = nlohmann::json;
namespace fs = std::filesystem;

// A vocabulary of 300 on the small corpus (multirank_test_util.h): with the Brown corpus's
// 50,257 the head and the loss were most of each run's step; cp splits the sequence, which
// the blocks and the loss's sum over cp see whatever the vocabulary.
const std::string kShape = "--model tiny --layers 4 --seq-len 64 --vocab 300";
// Llama's tiny preset: 4 query heads sharing 2 key/value heads (grouped-query attention).
const std::string kLlamaShape = "--model llama-tiny --layers 4 --seq-len 64 --vocab 300";
// test_moe_parallel.cc's MoE model (4 experts, top 2, every second layer an MoE layer with a
// shared expert, z-loss) at T = 64.
const std::string kMoeShape =
    "--model llama-tiny --layers 4 --seq-len 64 --vocab 300 --moe-experts 4 --moe-top-k 2 --moe-ffn-dim 64 "
    "--moe-every 2 --moe-shared-experts 1 --moe-z-loss 0.001";
constexpr int kMoeExperts = 4, kMoeTopK = 2, kMoeLayers = 2;
constexpr int kGlobalBatch = 4, kSteps = 8;
constexpr double kLossTol = 1e-5, kNormRelTol = 1e-5;
constexpr double kWeightTol = 3e-5, kWeightBulkTol = 1e-6;  // test_pipeline.cc's, for the same reason
// The dropout cells' largest single weight difference after 8 steps: 5e-5, not 3e-5. Their
// losses and norms are within the same 1e-5 as every cell (so the masks are one rank's),
// and the bulk within 1e-6; but an element whose gradient is near zero takes Adam's
// normalised step from the last bits of sums that dropout's 1/(1-p) scaling and cp x tp's
// other summation order move (seen: 3.03e-5 at cp2 x tp2 sp, 3.5e-5 with a2a there, on an
// element of 4.6e-4).
constexpr double kDropoutWeightTol = 5e-5;
// bf16: the one-rank bf16 run's loss against cp2's; the products round to 8 bits, and a cp
// rank's GEMMs see other row counts (the bound test_precision.cc uses for bf16 layouts).
constexpr double kBf16LossTol = 2e-3;

struct Layout {
  int cp = 1, tp = 1, pp = 1, dp = 1, zero = 0;
  std::string schedule = "1f1b";
  int v = 1;
  bool sp = false;
  std::string recompute = "none";
  int accum = 1;
  bool doc_mask = false;
  std::string precision = "fp32";
  std::string comm = "ring";  // --cp-comm
  int cp_a2a = 2;             // --cp-a2a, with hybrid
  bool llama = false;         // kLlamaShape (grouped-query heads), else kShape
  double dropout = 0;         // --dropout: each row's masks by its place in the whole sequence
  std::string moe;            // MoE settings: kMoeShape with these flags (else a dense model)
  int ep = 1;
  std::string extra;  // flags of the run and its one-rank reference alike (a curriculum)
  std::string extra_run;  // flags of the run alone (its reference runs without them)

  int ranks() const { return cp * tp * pp * dp; }
  std::string flags() const {
    std::string f = (!moe.empty() ? kMoeShape + moe + " --ep " + std::to_string(ep) : llama ? kLlamaShape : kShape) + " --cp-comm " + comm + (comm == "hybrid" ? " --cp-a2a " + std::to_string(cp_a2a) : "") + " --cp " + std::to_string(cp) + " --tp " + std::to_string(tp) + " --dp " + std::to_string(dp) +
                    " --zero " + std::to_string(zero) + (sp ? " --sp" : "") + " --recompute " + recompute +
                    " --precision " + precision + (dropout > 0 ? " --dropout " + std::to_string(dropout) : "");
    if (pp > 1) {
      f += " --pp " + std::to_string(pp) + " --schedule " + schedule;
      if (v > 1) f += " --virtual-stages " + std::to_string(v);
      else f += " --stage-layers 2,2";  // equal stages (the balanced split gives the head's stage fewer)
    }
    if (doc_mask) f += " --doc-mask --doc-separator 13";  // the small corpus's separator, about every 8 tokens
    return f + extra + extra_run + " --micro-batch " + std::to_string(kGlobalBatch / (dp * accum)) + " --grad-accum " +
           std::to_string(accum);
  }
};

RunSpec spec(const Layout& l) {
  return {l.flags() + " --steps " + std::to_string(kSteps) + " --eval-batches 1", l.ranks()};
}

// The one-rank run a layout is compared with: the same mask, recomputation and precision
// (recomputation changes no number, but keeps the reference's flags its own).
Layout reference_of(const Layout& c) {
  return Layout{.recompute = c.recompute, .doc_mask = c.doc_mask, .precision = c.precision, .llama = c.llama,
                .dropout = c.dropout, .moe = c.moe, .extra = c.extra};
}

// Under the sanitizers (scripts/test.sh's second stage sets MESHTRAIN_CP_CELLS=sanitize) the
// matrix runs one cell per mode and family: there it looks for memory errors on each code
// path, which the native stage's whole matrix has already held to one rank (the whole matrix
// took 353 s under the sanitizers on 2026-12-07).
bool sanitizer_subset() {
  const char* cells = std::getenv("MESHTRAIN_CP_CELLS");
  return cells && std::string(cells) == "sanitize";
}

std::vector<Layout> parity_layouts() {
  if (sanitizer_subset())
    return {
        {.cp = 2, .doc_mask = true},  // the ring, under the balanced split
        {.cp = 2, .pp = 2, .schedule = "interleaved", .v = 2, .accum = 2, .comm = "a2a"},
        {.cp = 4, .comm = "hybrid"},
        {.cp = 2, .dp = 2, .zero = 3, .comm = "all-gather"},
        {.cp = 2, .dp = 2, .zero = 1, .moe = " --moe-capacity-factor 1", .ep = 2},
    };
  return {
      {.cp = 2},
      {.cp = 4},
      {.cp = 2, .tp = 2, .sp = true, .recompute = "selective"},
      {.cp = 2, .pp = 2, .accum = 2},
      {.cp = 2, .pp = 2, .schedule = "interleaved", .v = 2, .accum = 2},
      {.cp = 2, .dp = 2, .zero = 1},
      {.cp = 2, .dp = 2, .zero = 3},
      {.cp = 2, .doc_mask = true},
      {.cp = 4, .recompute = "full", .doc_mask = true},
      {.cp = 2, .llama = true},
      // Ulysses: the same compositions; at cp4 over Llama's 2 key/value heads, each serves
      // two ranks (replicated, its gradient summed over them).
      {.cp = 2, .comm = "a2a"},
      {.cp = 4, .comm = "a2a"},
      {.cp = 2, .tp = 2, .sp = true, .recompute = "selective", .comm = "a2a"},
      {.cp = 2, .pp = 2, .accum = 2, .comm = "a2a"},
      {.cp = 2, .dp = 2, .zero = 3, .comm = "a2a"},
      {.cp = 2, .doc_mask = true, .comm = "a2a"},
      {.cp = 2, .comm = "a2a", .llama = true},
      {.cp = 4, .comm = "a2a", .llama = true},
      // All-gather (Llama 3's): alone, with document masks over grouped-query heads, with
      // tp and sp, and with ZeRO-3.
      {.cp = 2, .comm = "all-gather"},
      {.cp = 4, .doc_mask = true, .comm = "all-gather", .llama = true},
      {.cp = 2, .tp = 2, .sp = true, .recompute = "selective", .comm = "all-gather"},
      {.cp = 2, .dp = 2, .zero = 3, .comm = "all-gather"},
      // Hybrid: Ulysses inside pairs of cp ranks, the ring across the pairs; on Llama each
      // member of a pair attends with one of the 2 key/value heads.
      {.cp = 4, .comm = "hybrid"},
      {.cp = 4, .recompute = "full", .doc_mask = true, .comm = "hybrid", .llama = true},
      {.cp = 4, .tp = 2, .sp = true, .comm = "hybrid"},
      // The rest of the matrix for Ulysses and hybrid: interleaved pipelines, ZeRO-1 with the
      // experts over ep, and hybrid (8 ranks) under 1F1B and interleaved pipelines and ZeRO-3.
      {.cp = 2, .pp = 2, .schedule = "interleaved", .v = 2, .accum = 2, .comm = "a2a"},
      {.cp = 2, .dp = 2, .zero = 1, .comm = "a2a", .moe = " --moe-capacity-factor 1", .ep = 2},
      {.cp = 4, .pp = 2, .accum = 2, .comm = "hybrid"},
      {.cp = 4, .pp = 2, .schedule = "interleaved", .v = 2, .accum = 2, .comm = "hybrid"},
      {.cp = 4, .dp = 2, .zero = 1, .comm = "hybrid", .moe = " --moe-capacity-factor 1", .ep = 2},
      {.cp = 4, .dp = 2, .zero = 3, .comm = "hybrid"},
      // MoE: each rank routes its own rows; the balance loss and the capacity read the whole
      // sequences' sums (added over cp), and the experts' gradients reduce over edp x cp.
      {.cp = 2, .moe = " --moe-capacity-factor 1"},
      {.cp = 2, .dp = 2, .zero = 1, .moe = " --moe-capacity-factor 1", .ep = 2},
      {.cp = 4, .comm = "a2a", .moe = " --moe-bias-speed 0.01 --moe-balance micro-batch"},
      // Dropout: a rank's two chunks draw the masks of their places in the sequence.
      {.cp = 2, .dropout = 0.1},
      {.cp = 2, .tp = 2, .sp = true, .dropout = 0.1},
      {.cp = 2, .comm = "a2a", .dropout = 0.1},
      {.cp = 4, .pp = 2, .accum = 2, .dropout = 0.1},
      // Document masks under the balanced split (chunks dealt by the keys their rows see,
      // per micro-batch): kept through a pipeline's micro-batches in flight, and dropout's
      // runs over a rank's 8 chunks.
      {.cp = 2, .pp = 2, .accum = 2, .doc_mask = true},
      {.cp = 2, .doc_mask = true, .dropout = 0.1},
      // A sequence-length curriculum: rows of 16, 24, 32, 40 and 48 tokens, then 64, each cut
      // in 2 x cp chunks (with the ring, and Ulysses at cp 4).
      {.cp = 2, .extra = " --curriculum seqlen --curriculum-steps 5 --curriculum-start 16"},
      {.cp = 4, .comm = "a2a", .extra = " --curriculum seqlen --curriculum-steps 5 --curriculum-start 16"},
      // ZeRO-Infinity: the optimizer state in files, as exact as in memory.
      {.cp = 2, .dp = 2, .zero = 1,
       .extra_run = " --offload optimizer=nvme --offload-dir " +
                    (fs::temp_directory_path() / ("meshtrain_cp_offload_" + cli_test::kPid)).string()},
  };
}

class ContextParallelTest : public MultiRankTest<ContextParallelTest> {
 protected:
  using Base = MultiRankTest<ContextParallelTest>;
  friend Base;
  static constexpr const char* kTag = "cp";
  static int job_capacity() { return std::min(multirank_test::slots_from_env_or_cores(), multirank_test::core_count()); }
  static std::string train(const std::string& args) {
    return cli_test::kBinary + " train --data " + small_corpus_ + " --peak-gflops 100 --threads 1 " + args;
  }
};
using ContextParallel = ContextParallelTest;

// The cp bytes one rank sends in a training step (docs/long_context.md), per micro-batch and
// layer it holds, in fp32, with Nl = B T/cp rows and f = 2 when recomputation runs attention
// again in backward, else 1:
// - ring: its k, v block (Nl rows of the rank's 2 x kv width) cp-1 times in each forward
//   and in backward, and the block's dk, dv sums cp times;
// - a2a: to each other rank, all its rows of that rank's heads' columns of q, k, v (W wide)
//   and, back, of the output (Cq) per forward; backward trades q, k, v, the output and its
//   gradient again and sends the gradient of q, k, v back.
// - all-gather: its k, v rows to each other rank in each forward, again in backward, and
//   the other ranks' shares of the keys' gradients (a reduce-scatter: cp-1 blocks).
// - hybrid: a2a's bytes inside its group of cp_a2a ranks (their heads split cp_a2a ways),
//   then the ring's across the cp/cp_a2a groups on the group's cp_a2a Nl rows of those heads.
// The last stage adds the loss, one double all-reduced per micro-batch. An MoE layer adds,
// per micro-batch, the routing's sums all-reduced in the forward (per balance group 2E
// values, per sequence each of the 2 cp chunks' k x E offers) and the groups' assignments
// (E per group) in the backward.
int64_t cp_bytes(const Layout& l, int T = 64) {  // T: the step's row length (a curriculum's)
  constexpr int64_t kLayers = 4, kHs = 16, kHeads = 4;
  const int64_t kv_heads = l.llama || !l.moe.empty() ? 2 : 4, heads = kHeads / l.tp, kv = std::max<int64_t>(1, kv_heads / l.tp);
  const int64_t Nl = (int64_t)kGlobalBatch / (l.dp * l.accum) * (T / l.cp), f = l.recompute == "none" ? 1 : 2;
  auto ring = [&](int64_t n, int64_t rows, int64_t kv_heads) {
    return rows * 2 * kv_heads * kHs * ((n - 1) * f + (n - 1) + n);
  };
  auto a2a = [&](int64_t n) {
    const int64_t nq = heads / n, nkv = std::max<int64_t>(1, kv / n);
    const int64_t W = (nq + 2 * nkv) * kHs, Cq = nq * kHs;
    return (n - 1) * Nl * ((W + Cq) * f + W + 2 * Cq + W);
  };
  int64_t per_layer = 0;
  if (l.comm == "ring") {
    per_layer = ring(l.cp, Nl, kv);
  } else if (l.comm == "all-gather") {
    per_layer = Nl * 2 * kv * kHs * (l.cp - 1) * (f + 2);
  } else if (l.comm == "hybrid") {
    per_layer = a2a(l.cp_a2a) + ring(l.cp / l.cp_a2a, l.cp_a2a * Nl, std::max<int64_t>(1, kv / l.cp_a2a));
  } else {
    per_layer = a2a(l.cp);
  }
  // All-reduce bytes as the groups count them: 2(cp-1)/cp elements, rounded. Rank 0, whose
  // records metrics.jsonl holds, is the last stage only without pp.
  auto all_reduce = [&](int64_t doubles) { return std::llround(2.0 * (l.cp - 1) * doubles / l.cp) * 8; };
  const int64_t loss = l.pp == 1 ? all_reduce(1) : 0;
  int64_t moe = 0;
  if (!l.moe.empty()) {
    const int64_t B = kGlobalBatch / (l.dp * l.accum), E = kMoeExperts, k = kMoeTopK;
    const int64_t groups = l.moe.find("micro-batch") != std::string::npos ? 1 : B;
    moe = kMoeLayers * (all_reduce(groups * 2 * E + B * 2 * l.cp * k * E) + all_reduce(groups * E));
  }
  return l.accum * (4 * per_layer * (kLayers / l.pp) + loss + moe);
}

TEST_F(ContextParallel, ParityMatrix) {
  const std::vector<Layout> layouts = parity_layouts();
  std::vector<RunSpec> runs;
  for (const Layout& l : layouts) runs.push_back(spec(l)), runs.push_back(spec(reference_of(l)));
  // 16-bit runs: bf16 with each mode (hybrid at cp 4), fp16 (dynamic loss scaling) with the ring.
  const std::vector<Layout> bf16 =
      sanitizer_subset() ? std::vector<Layout>{{.cp = 2, .precision = "bf16"}}
                         : std::vector<Layout>{{.cp = 2, .precision = "bf16"},
                                               {.cp = 2, .precision = "bf16", .comm = "a2a"},
                                               {.cp = 4, .precision = "bf16", .comm = "hybrid"},
                                               {.cp = 2, .precision = "fp16"}};
  for (const Layout& l : bf16) runs.push_back(spec(l)), runs.push_back(spec(reference_of(l)));
  // Gradient compression reduces over dp x cp: PowerSGD's products are linear in each rank's
  // gradient, so cp2 x dp2 compresses what dp2 compresses (its reference is dp2, compressed).
  const Layout compressed{.cp = 2, .dp = 2, .extra = " --compress powersgd"};
  const Layout compressed_ref{.dp = 2, .extra = compressed.extra};
  if (!sanitizer_subset()) runs.push_back(spec(compressed)), runs.push_back(spec(compressed_ref));
  ensure(runs);
  const auto ref_masked = metrics_of(spec(reference_of(Layout{.doc_mask = true})).args);
  const auto ref_plain = metrics_of(spec(reference_of(Layout{})).args);
  ASSERT_FALSE(ref_masked.steps.empty() || ref_plain.steps.empty());
  EXPECT_NE(ref_masked.steps[0]["loss"], ref_plain.steps[0]["loss"]) << "the document mask changes the loss";
  for (const Layout& c : layouts) {
    SCOPED_TRACE(c.flags());
    const std::string args = spec(c).args, ref_args = spec(reference_of(c)).args;
    const auto m = metrics_of(args), r = metrics_of(ref_args);
    ASSERT_EQ(m.steps.size(), (size_t)kSteps);
    ASSERT_EQ(r.steps.size(), (size_t)kSteps);
    multirank_test::ParityMargins margins;
    for (int s = 0; s < kSteps; s++) {
      multirank_test::expect_step_parity(m.steps[s], r.steps[s], s, kLossTol, kNormRelTol, &margins);
      ASSERT_TRUE(m.steps[s]["comm"].contains("cp")) << m.steps[s].dump();
      EXPECT_EQ(m.steps[s]["comm"]["cp"]["bytes"].get<int64_t>(), cp_bytes(c, m.steps[s]["seq_len"].get<int>()))
          << "step " << s + 1;
    }
    EXPECT_EQ(margins.bad, 0) << "worst loss " << margins.loss << ", norm " << margins.norm;
    if (c.doc_mask && (c.comm == "ring" || c.comm == "all-gather") && c.moe.empty()) {
      int evened = 0;  // steps whose split beat the causal one
      for (const auto& step : m.steps) {
        ASSERT_TRUE(step.contains("cp_balance")) << step.dump();
        const double used = step["cp_balance"]["imbalance"], causal = step["cp_balance"]["causal_imbalance"];
        EXPECT_LE(used, causal);
        evened += used < causal;
      }
      EXPECT_GT(evened, 0) << "the balanced split never beat the causal one";
    }
    int64_t step = 0;
    const std::vector<float> ref_params = multirank_test::load_params(multirank_test::step_dir(get(ref_args).dir, kSteps), &step);
    double dw = 0, bulk = 0;
    multirank_test::expect_final_weights_match(get(args).dir, kSteps, ref_params,
                                               c.dropout > 0 ? kDropoutWeightTol : kWeightTol, kWeightBulkTol, &dw,
                                               &bulk);
  }
  if (!sanitizer_subset()) {
    SCOPED_TRACE(compressed.flags());
    const auto m = metrics_of(spec(compressed).args), r = metrics_of(spec(compressed_ref).args);
    ASSERT_EQ(m.steps.size(), (size_t)kSteps);
    ASSERT_EQ(r.steps.size(), (size_t)kSteps);
    multirank_test::ParityMargins margins;
    for (int s = 0; s < kSteps; s++)
      multirank_test::expect_step_parity(m.steps[s], r.steps[s], s, kLossTol, kNormRelTol, &margins);
    EXPECT_EQ(margins.bad, 0) << "worst loss " << margins.loss << ", norm " << margins.norm;
  }
  for (const Layout& l : bf16) {
    const auto m = metrics_of(spec(l).args), r = metrics_of(spec(reference_of(l)).args);
    ASSERT_EQ(m.steps.size(), (size_t)kSteps) << l.flags();
    for (int s = 0; s < kSteps; s++)
      EXPECT_NEAR(m.steps[s]["loss"].get<double>(), r.steps[s]["loss"].get<double>(), kBf16LossTol)
          << l.flags() << " step " << s + 1;
  }
}

// A cp2 run's checkpoint at step 4, resumed at cp1 and at cp4 for steps 5-8, gives the losses
// of the cp2 run that never stopped (within the parity tolerance).
TEST_F(ContextParallel, CheckpointsResumeAtOtherCp) {
  const std::string base = kShape + " --micro-batch 4 --steps 8 --eval-batches 1 --save-every 4 --keep-checkpoints 0";
  ensure({{base + " --cp 2", 2}});
  const auto& whole = get(base + " --cp 2");
  const auto full = metrics_of(base + " --cp 2");
  ASSERT_EQ(full.steps.size(), 8u);
  for (int cp : {1, 4}) {
    SCOPED_TRACE("resumed at --cp " + std::to_string(cp));
    const std::string dir = path("resumed" + std::to_string(cp));
    multirank_test::copy_interrupted_run(whole.dir, dir, 4, 8);
    const cli_test::RunResult r =
        cli_test::run(train(base + " --cp " + std::to_string(cp) + " --quiet --resume --out " + dir));
    ASSERT_EQ(r.exit_code, 0) << cli_test::describe(r);
    const auto resumed = cli_test::read_metrics(dir + "/metrics.jsonl");
    ASSERT_EQ(resumed.steps.size(), 8u);
    for (int s = 4; s < 8; s++)
      EXPECT_NEAR(resumed.steps[s]["loss"].get<double>(), full.steps[s]["loss"].get<double>(), kLossTol) << "step " << s + 1;
  }
}

TEST_F(ContextParallel, BadInputIsRejected) {
  expect_all_rejected(
      {
          {kShape + " --cp 3 --micro-batch 2", 3, {"--cp 3 cuts each sequence into 2 x cp = 6 chunks", "--seq-len 64"}},
          {kShape + " --cp 4 --cp-comm hybrid --micro-batch 2", 4,
           {"--cp-comm hybrid runs Ulysses inside groups of --cp-a2a ranks", "--cp-a2a (got 1) must divide --cp 4"}},
          {kShape + " --cp 4 --cp-comm hybrid --cp-a2a 3 --micro-batch 2", 4, {"--cp-a2a (got 3) must divide --cp 4"}},
          {kShape + " --cp 2 --cp-a2a 2 --micro-batch 2", 2, {"--cp-a2a 2 sizes --cp-comm hybrid's all-to-all groups"}},
          {kShape + " --cp 8 --cp-comm a2a --micro-batch 2", 8,
           {"--cp-comm a2a splits each tp rank's 4 query heads and 4 key/value heads over --cp 8"}},
          {kShape + " --cp 2 --cp-comm sideways --micro-batch 2", 2, {"--cp-comm must be ring, a2a, all-gather or hybrid"}},
          // A curriculum's rows are sequences too (until 2026-12-07 a row of 12 at cp 4 trained wrongly).
          {kShape + " --cp 4 --micro-batch 2 --curriculum seqlen --curriculum-steps 3 --curriculum-start 12 "
                    "--curriculum-step 4",
           4, {"the curriculum's row length 12 breaks the layout", "is not divisible by 8"}},
      },
      /*light=*/true);
  // Decoding runs without cp, and says so before it loads anything.
  for (const std::string command : {"generate --prompt hi", "serve"}) {
    const cli_test::RunResult r = cli_test::run(cli_test::kBinary + " " + command + " --checkpoint " + path("none") + " --cp 2");
    cli_test::expect_failure(r, {command.substr(0, command.find(' ')) + " does not run under context parallelism (--cp 2)"});
  }
}

}  // namespace
}  // namespace meshtrain::test_context_parallel
