// End-to-end tests of tensor parallelism (Megatron column/row-parallel linears, vocabulary-
// parallel embedding and loss), sequence parallelism (--sp) and activation recomputation
// (--recompute none|selective|full, --recompute-every): `meshtrain train --tp T --dp D ...`
// started from a plain process, so the binary re-executes itself under mpirun with T·D ranks.
//
//   ParityMatrix           a subset of tp {1,2,4} x sp x recompute {none,selective,full} x dp
//                          {1,2} x zero {0..3} x grad-accum {1,2} that covers every value of
//                          every axis: every step's loss within 1e-5 of the single-rank run,
//                          grad_norm within 1e-5 relative, val loss and final weights within
//                          1e-5; executed FLOPs and recompute_fraction per step.
//   CommunicationCounters  comm.tp bytes and calls per step, exactly, from the collectives the
//                          Megatron / sequence-parallel schedule needs (formulas below).
//   RecomputeFlopsAndMemory  recompute_fraction 0 / T/(T+12C) / 1 / 0.5 (every 2); peak
//                          activation bytes full < selective < none, the differences exactly
//                          the tensors each policy stops storing (tp 1 and tp 2 with --sp).
//   BadInputIsRejected     --tp not dividing the heads, --sp at tp 1, --sp with B·T not
//                          divisible by tp, --recompute bogus, --recompute-every 0: every rank
//                          names the problem before any step.
//   CheckpointsUnderTp     tp=2 checkpoints resume bit for bit at tp=2, are refused at tp=1
//                          with a message naming tp, export to one safetensors file that eval
//                          reads to the run's val loss.
//   ConfigTomlKeepsSequenceParallelism  `train --config RUN/config.toml` of an --sp run is
//                          an --sp run again (same first step, traffic and memory).
//
// Expected numbers come from formulas in this file (documented per term), not from engine
// code. Training runs are shared between tests through a cache, one run per configuration
// per process; ctest starts each test in a process of its own, so each test asks only for
// the runs it needs. Runs go concurrently up to the machine's core count (a run weighs as
// many cores as it has ranks, every rank with one thread), each bounded by `timeout`.
// MESHTRAIN_TEST_VERBOSE=1 prints per-run times and the parity margins.
#include <gtest/gtest.h>

#include <algorithm>
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

namespace meshtrain::test_tensor_parallel {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Subprocesses, files, metrics.jsonl and the corpus fixture (cli_test_util.h); the job
// runner, the run cache and the checkpoint readers shared with the dp suite
// (multirank_test_util.h).
using namespace cli_test;
using namespace multirank_test;

// The model of the parity and communication runs: tiny (2 layers, 4 heads, C = 64), T = 32.
const std::string kShape = "--model tiny --seq-len 32 --vocab 50257";
constexpr int64_t kLayers = 2, kDim = 64, kSeq = 32;
constexpr int kGlobalBatch = 8;  // rows per optimizer step in every layout
constexpr int kSteps = 20;       // parity-matrix run length
constexpr double kLossTol = 1e-5, kNormRelTol = 1e-5;
// Final weights after 20 AdamW steps at lr 6e-4. AdamW normalises every element's update,
// so an element whose gradient sits at the float-noise floor turns a reordered sum into an
// update difference of a fraction of lr: the worst element may move by lr/20 (seen: 1.1e-5
// at tp4·dp2, 3e-6 at dp 4 alone), while the bulk (99.9% of the elements) stays within 1e-6.
constexpr double kWeightTol = 3e-5, kWeightBulkTol = 1e-6;

// Elements of the tp = 1 flat buffer: wte padded to 128 rows, wpe (T rows), per block
// 12C² + 13C, the final LayerNorm 2C.
int64_t flat_total() {
  const int64_t C = kDim, padded_vocab = (kVocab + 127) / 128 * 128;
  return (padded_vocab + kSeq) * C + kLayers * (12 * C * C + 13 * C) + 2 * C;
}

// ---- Layouts -------------------------------------------------------------------------------

// One training configuration at a global batch of 8 rows: B = 8 / (dp·A) per micro-batch.
struct Layout {
  int tp = 1, dp = 1, zero = 0;
  bool sp = false;
  std::string recompute = "none";
  int every = 1;  // --recompute-every
  int accum = 1;  // --grad-accum
  double dropout = 0;  // --dropout: masks keyed by global token position, layout-independent

  int ranks() const { return tp * dp; }
  int micro_batch() const { return kGlobalBatch / (dp * accum); }
  // Blocks whose whole forward runs again in backward (l % every == 0 under full).
  int64_t recomputed_blocks() const {
    return recompute == "full" ? (kLayers + every - 1) / every : 0;
  }
  std::string flags() const {
    std::string f = "--tp " + std::to_string(tp) + " --dp " + std::to_string(dp) + " --zero " +
                    std::to_string(zero) + (sp ? " --sp" : "") + " --recompute " + recompute;
    if (every != 1) f += " --recompute-every " + std::to_string(every);
    if (dropout > 0) f += " --dropout " + std::to_string(dropout);
    return f + " --micro-batch " + std::to_string(micro_batch()) + " --grad-accum " +
           std::to_string(accum);
  }
};

const Layout kReference{};  // one rank, B = 8, nothing recomputed

// The parity matrix. Every value of every axis at least once: tp 1/2/4, sp off/on (tp > 1),
// recompute none/selective/full, dp 1/2, zero 0/1/2/3, grad-accum 1/2; 8 ranks at most.
std::vector<Layout> parity_layouts() {
  return {
      kReference,
      {.tp = 1, .recompute = "selective"},
      {.tp = 1, .recompute = "full"},
      {.tp = 2},
      {.tp = 2, .sp = true, .recompute = "selective"},
      {.tp = 2, .recompute = "full"},
      {.tp = 2, .sp = true, .accum = 2},
      {.tp = 4, .recompute = "selective"},
      {.tp = 4, .sp = true, .recompute = "full"},
      {.tp = 2, .dp = 2, .zero = 1, .sp = true},
      {.tp = 2, .dp = 2, .zero = 3, .recompute = "full"},
      {.tp = 4, .dp = 2, .zero = 2, .sp = true, .recompute = "selective"},
      // Dropout: compared with the single-rank run with the same dropout.
      {.dropout = 0.1},
      {.tp = 2, .sp = true, .recompute = "full", .dropout = 0.1},
      {.tp = 2, .dp = 2, .zero = 1, .sp = true, .recompute = "selective", .dropout = 0.1},
  };
}

// The communication test's share of them: no-sp and sp, t = 2 and 4 (where 2(t−1)/t = 1.5
// rounds), full recomputation with and without sp, accumulation, dp = 2 beside tp.
std::vector<Layout> comm_layouts() {
  return {
      {.tp = 2},
      {.tp = 2, .recompute = "full"},
      {.tp = 2, .sp = true, .accum = 2},
      {.tp = 4, .recompute = "selective"},
      {.tp = 4, .sp = true, .recompute = "full"},
      {.tp = 2, .dp = 2, .zero = 1, .sp = true},
  };
}

// ---- Expected tp traffic --------------------------------------------------------------------

struct Traffic {
  int64_t bytes = 0, calls = 0;
};

// Bytes per rank of the ring collectives (docs/parallelism.md; the engine rounds the element
// count of an all-reduce, 2(t−1)/t·n, to the nearest whole element, comm_bytes in
// src/comm/self_group.cc): all-reduce of n elements, reduce-scatter of n elements out per
// rank, all-gather of n elements in per rank.
int64_t all_reduce_bytes(int64_t n, int t, int64_t elem = 4) {
  return std::llround(2.0 * (double)(t - 1) * (double)n / (double)t) * elem;
}
int64_t gather_or_scatter_bytes(int64_t n_per_rank, int t) { return (t - 1) * n_per_rank * 4; }

// comm.tp of one optimizer step of layout `c` (tiny model: L = 2, C = 64, T = 32), from the
// Megatron schedule with N = B·T rows per micro-batch and A micro-batches.
Traffic expected_tp_traffic(const Layout& c) {
  Traffic per_micro_batch, step;
  const int t = c.tp;
  if (t == 1) return step;  // no tp axis at all
  const int64_t N = (int64_t)c.micro_batch() * kSeq, C = kDim, L = kLayers;
  const int64_t R = c.recomputed_blocks();
  auto all_reduce = [&](int64_t n, int64_t count) {
    per_micro_batch.bytes += count * all_reduce_bytes(n, t);
    per_micro_batch.calls += count;
  };
  auto rows = [&](int64_t count) {  // an all-gather or reduce-scatter of N/t rows of C
    per_micro_batch.bytes += count * gather_or_scatter_bytes(N / t * C, t);
    per_micro_batch.calls += count;
  };
  if (!c.sp) {
    // Forward: the vocabulary-parallel embedding's partial lookups are summed (1), each
    // block's two row-parallel outputs (attention and MLP projections) are summed ("g",
    // 2 per block), and each fully recomputed block does that again in backward (2 per
    // recomputed block).
    all_reduce(N * C, 1 + 2 * L + 2 * R);
    // Backward: the gradient of the LM head's input (1) and of each column-parallel
    // linear's input, the LayerNorm outputs into QKV and fc ("f", 2 per block).
    all_reduce(N * C, 1 + 2 * L);
  } else {
    // Sequence parallelism (Korthikanti et al. 2022): every all-reduce of N·C becomes a
    // reduce-scatter + an all-gather of (t−1)·(N/t)·C each, the same bytes in two calls.
    // Forward: the embedding is reduce-scattered (1); per block an all-gather before QKV and
    // fc and a reduce-scatter after both projections (4); the final LayerNorm's output is
    // gathered for the LM head (1); recomputed blocks repeat their 4.
    rows(1 + 4 * L + 1 + 4 * R);
    // Backward: the head's input gradient is reduce-scattered (1); per block the output
    // gradient is gathered before each row-parallel backward and the input gradients of the
    // column-parallel linears are reduce-scattered (4), and the LayerNorm outputs are
    // gathered again for the weight gradients of QKV and fc, not stored whole (2 more); the
    // residual-stream gradient is gathered for the position-embedding gradient (1).
    rows(1 + 6 * L + 1);
    // Each LayerNorm saw only 1/t of the tokens: its weight and bias gradients (2C) are
    // summed over tp, 2 LayerNorms per block and the final one.
    all_reduce(2 * C, 2 * L + 1);
  }
  // Vocabulary-parallel cross-entropy over all N rows: the max of the logits, the sum of
  // the shifted exponentials and the target logit (held by one rank), N floats each.
  all_reduce(N, 3);
  step.bytes = c.accum * per_micro_batch.bytes;
  step.calls = c.accum * per_micro_batch.calls;
  // The global gradient norm: one double summed over tp (8 bytes at t = 2, 16 at t = 4).
  step.bytes += all_reduce_bytes(1, t, 8);
  step.calls += 1;
  return step;
}

// Executed block FLOPs of one step per rank (2 per multiply-add): per block forward the
// linears 2·N·C·12C/t (QKV 3C, projection C, MLP 4C + 4C outputs, over t ranks) and the
// causal attention core 2·B·T²·C/t (QKᵀ and PV over half of T²); backward twice forward.
double block_flops(int B, int64_t T, int64_t C, int64_t L, int t, int accum) {
  const double N = (double)B * T;
  const double forward = (2.0 * N * C * 12.0 * C + 2.0 * B * (double)T * T * C) / t;
  return 3.0 * forward * L * accum;
}
// Selective recomputation repeats the attention core: T/(T + 12C) of a block's forward.
double selective_fraction(int64_t T, int64_t C) { return (double)T / (double)(T + 12 * C); }

// ---- Fixture: the corpus (CliTest), a suite folder and the cache of runs -----------------

// The cached run of a parity layout: model shape, layout flags, 20 steps, one eval batch.
RunSpec parity_spec(const Layout& c) {
  return {kShape + " " + c.flags() + " --steps " + std::to_string(kSteps) + " --eval-batches 1",
          c.ranks()};
}

// Runs are keyed by their RunSpec::args (model shape and training flags).
class TensorParallelTest : public MultiRankTest<TensorParallelTest> {
 protected:
  using Base = MultiRankTest<TensorParallelTest>;
  friend Base;
  static constexpr const char* kTag = "tp";  // folder meshtrain_tp_PID, "[ tp runs  ]" lines


  static int job_capacity() { return slots_from_env_or_cores(); }

  // `meshtrain train` on the Brown corpus, one thread per rank, fixed peak.
  static std::string train(const std::string& args) {
    return kBinary + " train --data " + corpus_ + " --peak-gflops 100 --threads 1 " + args;
  }

  using Base::ensure;
  static void ensure(const std::vector<Layout>& layouts) {
    std::vector<RunSpec> specs;
    for (const Layout& c : layouts) specs.push_back(parity_spec(c));
    ensure(specs);
  }
};


using TensorParallel = TensorParallelTest;

// ---- 1. Parity -----------------------------------------------------------------------------

// Splitting heads, MLP columns and the vocabulary over tp ranks, the tokens of the residual
// stream over them (sp), recomputing activations and splitting the batch over dp all change
// only the order of float sums: every layout trains the single-rank model (8 rows per
// step) to within 1e-5 in the loss at every step, 1e-5 relative in the gradient norm and
// (at B = 8) 1e-5 in the final val loss; final weights within kWeightTol (kWeightBulkTol
// for 99.9% of them). Tensor and sequence parallelism split the block FLOPs t ways;
// recomputation adds its own count without changing them.
TEST_F(TensorParallel, ParityMatrix) {
  const std::vector<Layout> layouts = parity_layouts();
  ensure(layouts);
  // The single-rank reference of a cell: one rank, the same dropout.
  struct Reference {
    Metrics metrics;
    std::vector<float> params;
  };
  std::map<double, Reference> refs;
  for (double p : {0.0, 0.1}) {
    const std::string ref_args = parity_spec(Layout{.dropout = p}).args;
    Reference& r = refs[p];
    r.metrics = metrics_of(ref_args);
    ASSERT_EQ(r.metrics.steps.size(), (size_t)kSteps) << ref_args;
    ASSERT_FALSE(r.metrics.evals.empty()) << ref_args;
    int64_t ref_step = 0;
    r.params = load_params(step_dir(get(ref_args).dir, kSteps), &ref_step);
    ASSERT_EQ((int64_t)r.params.size(), flat_total());
    ASSERT_EQ(ref_step, kSteps);
  }
  EXPECT_NE(refs[0.0].metrics.steps[0]["loss"], refs[0.1].metrics.steps[0]["loss"])
      << "dropout changes the loss";

  // One cell; an ASSERT ends only this cell.
  auto check = [&](const Layout& c) {
    const Metrics& ref = refs[c.dropout].metrics;
    const std::vector<float>& ref_params = refs[c.dropout].params;
    const std::string args = parity_spec(c).args;
    SCOPED_TRACE(c.flags());
    Metrics m = metrics_of(args);
    ASSERT_EQ(m.steps.size(), (size_t)kSteps);
    ParityMargins margins;
    for (int s = 0; s < kSteps; s++) {
      const json &j = m.steps[s], &r = ref.steps[s];
      expect_step_parity(j, r, s, kLossTol, kNormRelTol, &margins);

      // FLOPs: this rank's share of the blocks, recomputation counted apart.
      const double want = block_flops(c.micro_batch(), kSeq, kDim, kLayers, c.tp, c.accum);
      EXPECT_NEAR(j["block_flops"].get<double>(), want, 1e-9 * want) << "step " << s + 1;
      const double fraction = c.recompute == "full"        ? (double)c.recomputed_blocks() / kLayers
                              : c.recompute == "selective" ? selective_fraction(kSeq, kDim)
                                                           : 0.0;
      EXPECT_NEAR(j["recompute_fraction"].get<double>(), fraction, 1e-9) << "step " << s + 1;
    }
    EXPECT_EQ(margins.bad, 0) << margins.bad << " steps off, worst loss |diff| " << margins.loss
                              << ", worst grad_norm relative " << margins.norm;

    // Evaluation runs --eval-batches micro-batches of B rows: comparable at B = 8 only.
    ASSERT_FALSE(m.evals.empty());
    if (c.micro_batch() == kReference.micro_batch()) {
      EXPECT_NEAR(m.evals.back()["val_loss"].get<double>(),
                  ref.evals.back()["val_loss"].get<double>(), kLossTol);
    }

    double dw = 0, bulk = 0;
    expect_final_weights_match(get(args).dir, kSteps, ref_params, kWeightTol, kWeightBulkTol, &dw, &bulk);
    const json config = json::parse(read_file(get(args).dir + "/config.json"));
    EXPECT_EQ(config["resolved_layout"]["tp"], c.tp) << config.dump();
    EXPECT_EQ(config["resolved_layout"]["dp"], c.dp) << config.dump();
    EXPECT_EQ(config["resolved_layout"]["world"], c.ranks()) << config.dump();
    if (std::getenv("MESHTRAIN_TEST_VERBOSE"))
      std::printf("[ parity   ] %-75s loss <= %.3g, norm rel <= %.3g, weights <= %.3g (99.9%% %.3g)\n",
                  c.flags().c_str(), margins.loss, margins.norm, dw, bulk);
  };
  for (const Layout& c : layouts) check(c);
}

// ---- 2. Communication counters --------------------------------------------------------------

// comm.tp per step, exactly (expected_tp_traffic derives every term), bytes and calls, at
// every step; a tp = 1 run has no tp axis at all. With dp = 2 the tp traffic is that of the
// micro-batch each dp rank runs (B = 4).
TEST_F(TensorParallel, CommunicationCounters) {
  std::vector<Layout> layouts = comm_layouts();
  layouts.push_back(kReference);
  ensure(layouts);
  {
    Metrics m = metrics_of(parity_spec(kReference).args);
    ASSERT_FALSE(m.steps.empty());
    for (const json& j : m.steps) EXPECT_FALSE(j["comm"].contains("tp")) << j.dump();
  }
  for (const Layout& c : comm_layouts()) {
    SCOPED_TRACE(c.flags());
    const Traffic want = expected_tp_traffic(c);
    Metrics m = metrics_of(parity_spec(c).args);
    if (m.steps.size() != (size_t)kSteps) {
      ADD_FAILURE() << m.steps.size() << " step records";
      continue;
    }
    for (const json& j : m.steps) {
      ASSERT_TRUE(j.contains("comm") && j["comm"].contains("tp")) << j.dump();
      EXPECT_EQ(j["comm"]["tp"]["bytes"].get<int64_t>(), want.bytes) << "step " << j["step"];
      EXPECT_EQ(j["comm"]["tp"]["calls"].get<int64_t>(), want.calls) << "step " << j["step"];
    }
  }
  // Measured, sequence parallelism moves what the all-reduces it replaces move, plus the
  // re-gathered LayerNorm outputs (2 per block, (t−1)/t of N·C each over the step's N rows
  // whatever A is) and the LayerNorm weight gradients (2C floats, 2L + 1 of them per
  // micro-batch): tp2 --sp with A = 2 (B = 4) against tp2 (B = 8), the same 256 rows.
  const Metrics plain = metrics_of(parity_spec({.tp = 2}).args);
  const Metrics sp = metrics_of(parity_spec({.tp = 2, .sp = true, .accum = 2}).args);
  ASSERT_FALSE(plain.steps.empty());
  ASSERT_FALSE(sp.steps.empty());
  const int64_t step_rows_bytes = (int64_t)kGlobalBatch * kSeq * kDim * 4;  // N·C floats
  EXPECT_EQ(sp.steps[0]["comm"]["tp"]["bytes"].get<int64_t>() -
                plain.steps[0]["comm"]["tp"]["bytes"].get<int64_t>(),
            2 * kLayers * step_rows_bytes / 2 + 2 * (2 * kLayers + 1) * all_reduce_bytes(2 * kDim, 2));
}

// ---- 3. Recomputation: FLOPs and memory ------------------------------------------------------

// A wider model at T = 64 (C = 128, 4 heads, B = 8) so that the stored block activations
// are visible beside the logits buffer, at tp = 1 and at tp = 2 with --sp, 3 steps each.
// Per block the model stores (BlockActivations, Korthikanti et al. 2022's accounting; N = B·T
// rows, Nl = N/t under sp, else N; floats):
//   residual stream  ln1, residual2, ln2, residual3: 4·Nl·C, LayerNorm mean/rstd 4·Nl
//   tp slices        qkv 3·N·C/t, attention output N·C/t, log-sum-exp N·H/t, fc and its
//                    GELU 2·N·4C/t
// selective drops the attention core (output and log-sum-exp) from every block and keeps
// one shared set for the block being differentiated: saves (L − 1)·core;
// full keeps only each block's output and one shared whole-block set: saves
// (L − 1)·block − L·Nl·C; and a block that is not recomputed keeps block − Nl·C more.
TEST_F(TensorParallel, RecomputeFlopsAndMemory) {
  const int64_t T = 64, C = 128, H = 4, L = 2;
  const int B = 8;
  const std::string shape =
      "--model tiny --seq-len 64 --dim 128 --heads 4 --vocab 50257 --steps 3 --eval-batches 1 "
      "--micro-batch 8";
  struct Mode {
    std::string flags;
    std::string name;
  };
  const std::vector<Mode> modes = {{"--recompute none", "none"},
                                   {"--recompute selective", "selective"},
                                   {"--recompute full", "full"},
                                   {"--recompute full --recompute-every 2", "full every 2"}};
  const std::vector<std::string> tps = {"--tp 1", "--tp 2 --sp"};
  std::vector<RunSpec> specs;
  for (const auto& tp : tps)
    for (const auto& m : modes) specs.push_back({shape + " " + tp + " " + m.flags, tp == "--tp 1" ? 1 : 2});
  ensure(specs);

  for (const auto& tp : tps) {
    SCOPED_TRACE(tp);
    const int t = tp == "--tp 1" ? 1 : 2;
    const int64_t N = (int64_t)B * T, Nl = t == 1 ? N : N / t;
    const int64_t core = N * C / t + N * H / t;
    const int64_t block = 4 * Nl * C + 4 * Nl + 3 * N * C / t + N * C / t + N * H / t + 2 * N * 4 * C / t;
    std::map<std::string, int64_t> activations;
    std::map<std::string, Metrics> metrics;
    for (const auto& m : modes) {
      Metrics r = metrics_of(shape + " " + tp + " " + m.flags);
      if (r.steps.size() != 3u) {
        ADD_FAILURE() << m.name << ": " << r.steps.size() << " step records";
        continue;
      }
      metrics[m.name] = r;
      const double want_fraction = m.name == "none"        ? 0.0
                                   : m.name == "selective" ? selective_fraction(T, C)
                                   : m.name == "full"      ? 1.0
                                                           : 0.5;  // block 0 of 2
      int64_t peak = -1;
      for (const json& j : r.steps) {
        const double f = j["recompute_fraction"].get<double>();
        EXPECT_NEAR(f, want_fraction, 1e-9) << m.name << " step " << j["step"];
        if (m.name == "selective") {
          EXPECT_GT(f, 0.0);
          EXPECT_LT(f, 0.2);
        }
        const double flops = block_flops(B, T, C, L, t, 1);
        EXPECT_NEAR(j["block_flops"].get<double>(), flops, 1e-9 * flops) << m.name;
        EXPECT_NEAR(j["recompute_flops"].get<double>(), want_fraction * flops / 3, 1e-9 * flops)
            << m.name;
        const int64_t a = j["mem"]["activations"].get<int64_t>();
        if (peak >= 0) {
          EXPECT_EQ(a, peak) << m.name << ": the peak moved after step 1";
        }
        peak = a;
      }
      activations[m.name] = peak;
    }
    if (activations.size() != modes.size()) continue;
    // Recomputation changes no number the model computes (same layout, same reduction order
    // outside the recomputed work): within 1e-5 of the run that stores everything.
    for (const auto& m : modes)
      for (int s = 0; s < 3; s++)
        EXPECT_NEAR(metrics[m.name].steps[s]["loss"].get<double>(),
                    metrics["none"].steps[s]["loss"].get<double>(), kLossTol)
            << m.name << " step " << s + 1;

    EXPECT_LT(activations["full"], activations["selective"]);
    EXPECT_LT(activations["selective"], activations["none"]);
    EXPECT_EQ(activations["none"] - activations["selective"], 4 * (L - 1) * core)
        << "selective should save the attention core of all but one block";
    EXPECT_EQ(activations["none"] - activations["full"], 4 * ((L - 1) * block - L * Nl * C))
        << "full should save every block but one, less the stored block outputs";
    // --recompute-every 2 recomputes block 0 only: block 1 keeps everything.
    EXPECT_EQ(activations["full every 2"] - activations["full"], 4 * (block - Nl * C))
        << "block 1 should store its whole set instead of its output";
    if (std::getenv("MESHTRAIN_TEST_VERBOSE"))
      std::printf("[ memory   ] %-12s activations none %lld selective %lld full %lld every-2 %lld\n",
                  tp.c_str(), (long long)activations["none"], (long long)activations["selective"],
                  (long long)activations["full"], (long long)activations["full every 2"]);
  }
}

// ---- 4. Bad input --------------------------------------------------------------------------

// Each is rejected by every rank (each prints the message) before any step runs or any run
// file is written.
TEST_F(TensorParallel, BadInputIsRejected) {
  const std::vector<RejectedRun> cases = {
      {kShape + " --tp 3 --micro-batch 8", 3, {"--tp 3 does not divide the number of heads (4)"}},
      // --dp 2 so that two ranks must each say it.
      {kShape + " --tp 1 --dp 2 --sp --micro-batch 4", 2,
       {"--sp (sequence parallelism) needs --tp > 1"}},
      {"--model tiny --seq-len 31 --vocab 50257 --tp 2 --sp --micro-batch 1", 2,
       {"--sp needs micro-batch x seq-len (31 tokens) divisible by --tp 2"}},
      {kShape + " --tp 2 --recompute bogus --micro-batch 8", 2,
       {"--recompute must be none, selective or full, got 'bogus'"}},
      {kShape + " --tp 2 --recompute full --recompute-every 0 --micro-batch 8", 2,
       {"--recompute-every must be >= 1"}},
  };
  expect_all_rejected(cases);
}

// ---- 5. Checkpoints under tp -------------------------------------------------------------

// A tp=2 run (B = 8) checkpoints at steps 5 and 10. Interrupted after step 5 (step-10
// checkpoint and steps 6-10 dropped) and resumed at tp=2 it prints the same steps 6-10 and
// val loss, bit for bit, and writes the same step-10 shards; resumed at tp=1 (the slices
// reassembled, a universal checkpoint) it continues within the parity tolerance. export writes the whole model in one safetensors file (the
// reassembled checkpoint's weights), and eval of that file, with the run's micro-batch,
// seq-len and eval batches, gives the run's final val loss to 4 decimals.
TEST_F(TensorParallel, CheckpointsUnderTp) {
  const std::string flags =
      kShape + " --tp 2 --micro-batch 8 --steps 10 --save-every 5 --keep-checkpoints 0 "
               "--eval-batches 2 --quiet";
  const std::string full = path("full"), same = path("same"), other = path("other");
  Job first = run_now(train(flags + " --out " + full), 2);
  ASSERT_EQ(first.result.exit_code, 0) << describe(first.result);
  Metrics ref = read_metrics(full + "/metrics.jsonl");
  ASSERT_EQ(ref.steps.size(), 10u);
  ASSERT_FALSE(ref.evals.empty());
  ASSERT_TRUE(fs::exists(step_dir(full, 5) + "/index.json"));
  ASSERT_TRUE(fs::exists(step_dir(full, 10) + "/index.json"));
  const json index = json::parse(read_file(step_dir(full, 10) + "/index.json"));
  EXPECT_EQ(index["tp_size"], 2) << index.dump();
  for (const char* shard : {"shard_tp00_00000.bin", "shard_tp01_00000.bin"})
    EXPECT_TRUE(fs::exists(step_dir(full, 10) + "/" + shard)) << "one shard per tp rank: " << shard;

  // Two copies interrupted after step 5's checkpoint.
  for (const std::string& dir : {same, other}) copy_interrupted_run(full, dir, 5, 10);
  Job resumed_same, resumed_tp1;
  resumed_same.cmd = train(flags + " --out " + same + " --resume");
  resumed_same.ranks = 2;
  std::string tp1_flags = flags;
  tp1_flags.replace(tp1_flags.find("--tp 2"), 6, "--tp 1");
  resumed_tp1.cmd = train(tp1_flags + " --out " + other + " --resume");
  resumed_tp1.limit_s = 120;
  run_jobs({&resumed_same, &resumed_tp1}, dir_);

  // Same layout: bit for bit.
  ASSERT_EQ(resumed_same.result.exit_code, 0) << describe(resumed_same.result);
  Metrics ms = read_metrics(same + "/metrics.jsonl");
  ASSERT_EQ(ms.steps.size(), 10u) << read_file(same + "/metrics.jsonl");
  for (int s = 6; s <= 10; s++) {
    const json &x = ref.steps[s - 1], &y = ms.steps[s - 1];
    ASSERT_EQ(y["step"], s);
    EXPECT_EQ(bits(y["loss"]), bits(x["loss"])) << "step " << s << ": " << y["loss"] << " vs "
                                                << x["loss"];
    EXPECT_EQ(bits(y["grad_norm"]), bits(x["grad_norm"])) << "step " << s;
  }
  ASSERT_FALSE(ms.evals.empty());
  EXPECT_EQ(bits(ms.evals.back()["val_loss"]), bits(ref.evals.back()["val_loss"]));
  for (const char* shard : {"shard_tp00_00000.bin", "shard_tp01_00000.bin"}) {
    const std::string a = read_file(step_dir(full, 10) + "/" + shard);
    EXPECT_FALSE(a.empty()) << shard;
    EXPECT_TRUE(a == read_file(step_dir(same, 10) + "/" + shard)) << shard << " differs";
  }

  // Another tp: the same training, within the parity tolerance.
  ASSERT_EQ(resumed_tp1.result.exit_code, 0) << describe(resumed_tp1.result);
  const Metrics mo = read_metrics(other + "/metrics.jsonl");
  ASSERT_EQ(mo.steps.size(), 10u);
  for (int s = 6; s <= 10; s++)
    EXPECT_NEAR(mo.steps[s - 1]["loss"].get<double>(), ref.steps[s - 1]["loss"].get<double>(), kLossTol)
        << "tp 1, step " << s;

  // export: one file with the whole model, the reassembled tp slices.
  const std::string st = path("x.safetensors");
  Job exported = run_now(kBinary + " export --checkpoint " + full + " --out " + st);
  ASSERT_EQ(exported.result.exit_code, 0) << describe(exported.result);
  EXPECT_NE(exported.result.out.find("step_00000010"), std::string::npos) << exported.result.out;
  int64_t step = 0;
  const std::vector<float> w = load_params(step_dir(full, 10), &step);
  ASSERT_EQ((int64_t)w.size(), flat_total());
  checkpoint::SafetensorsFile f;
  Status s = checkpoint::SafetensorsFile::open(st, &f);
  ASSERT_TRUE(s.is_ok()) << s.message();
  std::vector<float> wte((size_t)kVocab * kDim);
  ASSERT_TRUE(f.read_float("wte.weight", wte.data(), wte.size()).is_ok());
  EXPECT_EQ(std::memcmp(wte.data(), w.data(), wte.size() * sizeof(float)), 0)
      << "exported wte.weight is not the checkpoint's (both tp slices, in vocabulary order)";

  // eval of the file and of the run folder: the run's final val loss to 4 decimals.
  const std::string eval =
      " --data " + corpus_ + " --threads 1 --micro-batch 8 --seq-len 32 --batches 2";
  Job ev_file = run_now(kBinary + " eval --checkpoint " + st + eval);
  Job ev_run = run_now(kBinary + " eval --checkpoint " + full + eval);
  expect_evals_reproduce(ev_file, ev_run, ref.evals.back()["val_loss"].get<double>());
}

// The universal checkpoint: 10 steps at tp2 pp2 dp2 (4 layers), then resumed from
// its step-10 checkpoint at tp4 dp2, at tp1 pp4 and on one rank for 10 more. Every one of
// the 20 losses of each matches an uninterrupted one-rank run within the parity tolerance:
// the checkpoint's tp slices, pipeline stages and ZeRO shards are re-sliced on load.
TEST_F(TensorParallel, AnyCheckpointResumesUnderAnyLayout) {
  const std::string shape = kShape + " --layers 4 --global-batch 8 --micro-batch 2 --steps 20 --eval-batches 1";
  const std::string one = path("one"), first = path("tp2pp2dp2");
  Job reference, written;
  reference.cmd = train(shape + " --quiet --out " + one), reference.ranks = 1;
  written.cmd = train(shape + " --tp 2 --pp 2 --dp 2 --zero 1 --save-every 10 --keep-checkpoints 0 --quiet --out " + first);
  written.ranks = 8;
  run_jobs({&reference, &written}, dir_);
  for (const Job* j : {&reference, &written}) ASSERT_EQ(j->result.exit_code, 0) << describe(j->result);
  const Metrics ref = read_metrics(one + "/metrics.jsonl"), before = read_metrics(first + "/metrics.jsonl");
  ASSERT_EQ(ref.steps.size(), 20u);
  ASSERT_EQ(before.steps.size(), 20u);
  struct Resume {
    std::string name, flags;
    int ranks;
  };
  const std::vector<Resume> resumes = {{"tp4dp2", "--tp 4 --dp 2 --zero 3", 8}, {"tp1pp4", "--pp 4", 4}, {"one_rank", "", 1}};
  std::vector<Job> jobs(resumes.size());
  std::vector<Job*> running;
  for (size_t i = 0; i < resumes.size(); i++) {
    const std::string dir = path(resumes[i].name);
    copy_interrupted_run(first, dir, 10, 20);
    jobs[i].cmd = train(shape + " " + resumes[i].flags + " --quiet --out " + dir + " --resume");
    jobs[i].ranks = resumes[i].ranks;
    running.push_back(&jobs[i]);
  }
  run_jobs(running, dir_);
  for (size_t i = 0; i < resumes.size(); i++) {
    SCOPED_TRACE(resumes[i].name);
    ASSERT_EQ(jobs[i].result.exit_code, 0) << describe(jobs[i].result);
    const Metrics m = read_metrics(path(resumes[i].name) + "/metrics.jsonl");
    ASSERT_EQ(m.steps.size(), 20u);
    for (int s = 1; s <= 20; s++)
      EXPECT_NEAR(m.steps[s - 1]["loss"].get<double>(), ref.steps[s - 1]["loss"].get<double>(), kLossTol)
          << "step " << s << (s <= 10 ? " (written at tp2 pp2 dp2)" : " (resumed)");
  }
}

// ---- 6. The run folder's config.toml reproduces the layout ---------------------------------

// `meshtrain train --config RUN/config.toml` is documented to reproduce the run (README), so
// an --sp run's config.toml must give an --sp run again: the same first step, bit for bit,
// with the same tp traffic and activation memory.
TEST_F(TensorParallel, ConfigTomlKeepsSequenceParallelism) {
  const Layout c{.tp = 2, .sp = true, .recompute = "selective"};
  ensure(std::vector<Layout>{c});
  Metrics first = metrics_of(parity_spec(c).args);
  ASSERT_FALSE(first.steps.empty());
  const std::string toml = get(parity_spec(c).args).dir + "/config.toml";
  Job again = run_now(kBinary + " train --config " + toml + " --steps 1 --quiet --out " +
                          path("again"),
                      2);
  ASSERT_EQ(again.result.exit_code, 0) << describe(again.result);
  Metrics m = read_metrics(path("again") + "/metrics.jsonl");
  ASSERT_EQ(m.steps.size(), 1u);
  const json &x = first.steps[0], &y = m.steps[0];
  EXPECT_EQ(y["comm"]["tp"], x["comm"]["tp"]) << "config.toml:\n" << read_file(toml);
  EXPECT_EQ(y["mem"]["activations"], x["mem"]["activations"]);
  EXPECT_EQ(bits(y["loss"]), bits(x["loss"]));
  EXPECT_EQ(bits(y["grad_norm"]), bits(x["grad_norm"]));
}

}  // namespace
}  // namespace meshtrain::test_tensor_parallel
