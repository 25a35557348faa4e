// Model-state accounting (planner/memory.h): the ZeRO paper's Table 1 reproduced to its
// printed digits, and the same code exact to the byte for the engine's own buffers, an
// expert-parallel MoE rank's included.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "comm/self_group.h"
#include "comm/shape_group.h"
#include "core/memory.h"
#include "kernels/ops.h"
#include "model/gpt.h"
#include "model/param_layout.h"
#include "parallel/data_parallel.h"
#include "planner/memory.h"

namespace meshtrain::planner::test_planner_memory {
namespace {

// A printed figure p with `decimals` digits after the point matches c when c rounds to it
// (|c - p| <= half a unit) or truncates to it (p <= c < p + 1 unit): Table 1 truncates some
// large entries (1T at N_d = 256 prints 4046 for 4046.875).
bool matches_printed(double c, double p) {
  int decimals = 0;  // digits after the point as printed: 30 -> 0, 52.5 -> 1, 1.88 -> 2
  while (std::abs(p * std::pow(10.0, decimals) - std::round(p * std::pow(10.0, decimals))) > 1e-9) decimals++;
  const double unit = std::pow(10.0, -decimals);
  return std::abs(c - p) <= unit / 2 + 1e-9 || (c >= p && c < p + unit);
}

TEST(PlannerMemory, ZeroPaperTable1) {
  struct Row {
    double psi;
    int n;
    double os, osg, osgp;
  };
  // Rajbhandari et al. 2020, Table 1: GB per device for P_os, P_os+g, P_os+g+p
  // (../shared/reference/published-numbers.md).
  const std::vector<Row> rows = {
      {7.5e9, 1, 120, 120, 120},        {7.5e9, 4, 52.5, 41.3, 30},
      {7.5e9, 16, 35.6, 21.6, 7.5},     {7.5e9, 64, 31.4, 16.6, 1.88},
      {7.5e9, 256, 30.4, 15.4, 0.47},   {7.5e9, 1024, 30.1, 15.1, 0.12},
      {128e9, 1, 2048, 2048, 2048},     {128e9, 4, 896, 704, 512},
      {128e9, 16, 608, 368, 128},       {128e9, 64, 536, 284, 32},
      {128e9, 256, 518, 263, 8},        {128e9, 1024, 513, 257, 2},
      {1e12, 1, 16000, 16000, 16000},   {1e12, 4, 7000, 5500, 4000},
      {1e12, 16, 4750, 2875, 1000},     {1e12, 64, 4187, 2218, 250},
      {1e12, 256, 4046, 2054, 62.5},    {1e12, 1024, 4011, 2013, 15.6},
  };
  for (const Row& r : rows) {
    SCOPED_TRACE(testing::Message() << "psi " << r.psi << " N_d " << r.n);
    const double printed[3] = {r.os, r.osg, r.osgp};
    for (int z = 1; z <= 3; z++) {
      const double gb = model_state_bytes(r.psi, kMixedState, z, r.n).total() / 1e9;
      EXPECT_TRUE(matches_printed(gb, printed[z - 1]))
          << "zero " << z << ": " << gb << " GB, the table prints " << printed[z - 1];
    }
    EXPECT_DOUBLE_EQ(model_state_bytes(r.psi, kMixedState, 0, r.n).total(), 16 * r.psi);
  }
  // The check: 7.5B on 64 ranks.
  EXPECT_DOUBLE_EQ(model_state_bytes(7.5e9, kMixedState, 0, 64).total(), 120e9);
  EXPECT_DOUBLE_EQ(model_state_bytes(7.5e9, kMixedState, 1, 64).total(), 31.40625e9);
  EXPECT_DOUBLE_EQ(model_state_bytes(7.5e9, kMixedState, 2, 64).total(), 16.640625e9);
  EXPECT_DOUBLE_EQ(model_state_bytes(7.5e9, kMixedState, 3, 64).total(), 1.875e9);
}

// The tracker's parameter, gradient and optimizer bytes allocated since `before` (a model
// and its DataParallel store) against the accounting for the store's shards.
void expect_state_bytes_follow_accounting(const MemStats& before, const parallel::DataParallel& dp,
                                          const model::Gpt& gpt, kernels::Precision storage, int zero) {
  const MemStats after = MemoryTracker::instance().stats();
  auto grown = [&](MemCategory m) { return (double)after.current[(int)m] - (double)before.current[(int)m]; };
  const StateDtypes bytes = storage == kernels::Precision::kFp32 ? kFp32State : kMixedState;
  const StateBytes want = model_state_bytes(dp.shards(), gpt.layout().total(), bytes, zero);
  EXPECT_EQ(grown(MemCategory::kParams), want.params);
  EXPECT_EQ(grown(MemCategory::kGrads), want.grads);
  EXPECT_EQ(grown(MemCategory::kOptim), want.optim);
}

// The tracker's parameter, gradient and optimizer bytes of a real rank (its model and its
// DataParallel store for a dp group of N, laid out without running) equal the accounting
// for that rank's shards, to the byte: the whole model and a pipeline stage, every stage,
// fp32 storage (4 + 4 + 8) and 16-bit storage with fp32 master weights (2 + 2 + 12), for a
// GPT-2 and a Llama (its untied head in the last stage's unit).
TEST(PlannerMemory, EngineBuffersFollowTheAccounting) {
  model::GptConfig gpt2;
  gpt2.layers = 3, gpt2.heads = 4, gpt2.dim = 64, gpt2.max_seq_len = 32, gpt2.vocab = 1000;
  model::GptConfig llama = gpt2;  // RMSNorm, no biases, GQA, SwiGLU, an untied head
  ASSERT_TRUE(model::apply_arch("llama", &llama).is_ok());
  llama.kv_heads = 2;
  for (const model::GptConfig& c : {gpt2, llama}) {
  SCOPED_TRACE(model::arch_name(c));
  using kernels::Precision;
  for (Precision storage : {Precision::kFp32, Precision::kBf16, Precision::kFp16})
  for (const model::ModelPart& part : {model::ModelPart{}, model::ModelPart{{{1, 3}}}})
    for (int n : {1, 3, 4})
      for (int zero = 0; zero <= 3; zero++) {
        SCOPED_TRACE(testing::Message() << kernels::precision_name(storage) << " chunks "
                                        << part.chunks.size() << " N " << n << " zero " << zero);
        model::Gpt full(c, model::Gpt::LocalState::kParamsOnly, nullptr, false, part);
        full.init_weights(1);
        comm::ShapeOnlyGroup group(n, n - 1, "dp");
        const MemStats before = MemoryTracker::instance().stats();
        {
          model::Gpt gpt(c, parallel::model_state_for_stage(zero, storage), nullptr, false, part);
          parallel::DataParallel dp(gpt, group, {zero, 25, true, storage}, {}, full.params());
          expect_state_bytes_follow_accounting(before, dp, gpt, storage, zero);
        }
      }
  }
}

// Mixture of Experts at ep 2 of dp 4 (ep rank 1): a rank holds its dense parameters plus
// E/ep of the experts, and the tracker's state bytes equal the accounting to the byte with
// the dense units sharded over dp and the experts over their expert-data-parallel pair. The
// same at tp 2 (tp rank 1) with the experts whole on each tp rank (--expert-tp 1): each
// expert unit is the whole expert, sharded over edp only, while the dense units are halves.
TEST(PlannerMemory, AnExpertParallelRankHoldsItsShareOfTheExperts) {
  model::GptConfig c;
  c.layers = 2, c.heads = 4, c.dim = 64, c.max_seq_len = 32, c.vocab = 1000;
  ASSERT_TRUE(model::apply_arch("llama", &c).is_ok());
  c.kv_heads = 2, c.moe.experts = 4, c.moe.top_k = 2, c.moe.every = 2, c.moe.expert_ffn = 48;
  const int ep = 2, n = 4;
  const int64_t expert = 3LL * c.dim * c.moe.expert_ffn;  // w1, w3, w2
  comm::ShapeOnlyGroup dp_group(n, n - 1, "dp"), edp(n / ep, 1, "edp"), ep_group(ep, 1, "ep"), tp_group(2, 1, "tp");
  using kernels::Precision;
  for (bool whole : {false, true})
  for (Precision storage : {Precision::kFp32, Precision::kBf16})
    for (int zero = 0; zero <= 3; zero++) {
      SCOPED_TRACE(testing::Message() << kernels::precision_name(storage) << " zero " << zero << (whole ? " tp 2, whole experts" : ""));
      comm::Group* tp = whole ? &tp_group : nullptr;
      const model::ExpertTp etp = whole ? model::ExpertTp::kReplicated : model::ExpertTp::kSplit;
      model::Gpt full(c, model::Gpt::LocalState::kParamsOnly, tp, false, {}, &ep_group, etp);
      full.init_weights(1);
      const model::ParamLayout tp_slice(c, whole ? 2 : 1, whole ? 1 : 0);
      EXPECT_EQ((int64_t)full.layout().total(),
                (int64_t)tp_slice.total() + (whole ? (int64_t)c.moe_layers() * c.moe.experts * expert / 2 : 0) -
                    (int64_t)c.moe_layers() * (c.moe.experts - c.moe.experts / ep) * expert)
          << "the rank's slice (its padded vocabulary) with whole experts, less the other ep rank's";
      for (const auto& u : full.layout().units()) {
        if (u.expert >= 0) {
          EXPECT_EQ((int64_t)u.numel, expert) << "expert " << u.expert << " whole";
        }
      }
      const MemStats before = MemoryTracker::instance().stats();
      {
        model::Gpt gpt(c, parallel::model_state_for_stage(zero, storage), tp, false, {}, &ep_group, etp);
        parallel::DpConfig cfg{zero, 25, true, storage};
        parallel::ParamGroup dense{"dense", nullptr, {}}, experts{"experts", &edp, {}, &ep_group};
        if (whole) experts.replicas = &tp_group;
        for (int u = 0; u < gpt.layout().num_units(); u++)
          (gpt.layout().units()[u].expert >= 0 ? experts : dense).units.push_back(u);
        cfg.groups = {dense, experts};
        parallel::DataParallel dp(gpt, dp_group, cfg, {}, full.params());
        expect_state_bytes_follow_accounting(before, dp, gpt, storage, zero);
      }
    }
}

// With bf16 storage a unit in use holds an fp32 copy of its other tensors only: the GEMMs
// read its weights as stored (and, at ZeRO 0-1, add their gradients into the 16-bit
// gradient), so neither the weights nor their gradients have an fp32 buffer. fp16 storage
// widens the whole unit.
TEST(PlannerMemory, Bf16UnitsHoldNoFp32CopyOfTheirGemmWeights) {
  model::GptConfig c;
  c.layers = 2, c.heads = 4, c.dim = 64, c.max_seq_len = 32, c.vocab = 1000;
  model::Gpt full(c, model::Gpt::LocalState::kParamsOnly);
  full.init_weights(1);
  for (size_t i = 0; i < full.num_elements(); i++) full.params()[i] += 0.001f * (float)(i % 7);  // no zero biases
  auto current = [](MemCategory m) { return MemoryTracker::instance().stats().current[(int)m]; };
  using kernels::Precision;
  for (Precision storage : {Precision::kBf16, Precision::kFp16}) {
    SCOPED_TRACE(kernels::precision_name(storage));
    model::Gpt gpt(c, parallel::model_state_for_stage(0, storage));
    comm::SelfGroup self("dp");
    parallel::DataParallel dp(gpt, self, {0, 25, true, storage}, {}, full.params());
    const model::ParamLayout& layout = gpt.layout();
    const int u = layout.block_unit(1);
    int64_t weights = 0, weight_grads = 0;
    for (const model::ParamTensor& t : layout.tensors())
      if (t.layer == 1) weights += t.gemm_weight ? (int64_t)t.numel : 0, weight_grads += t.gemm_grad ? (int64_t)t.numel : 0;
    const int64_t unit = (int64_t)layout.units()[u].numel;
    const bool bf16 = storage == Precision::kBf16;

    const int64_t gathered0 = current(MemCategory::kGathered), workspace0 = current(MemCategory::kWorkspace);
    dp.begin_pass(model::Pass::kBackward);
    const float* fp32 = dp.acquire_params(u);
    float* grads = dp.acquire_grads(u);
    EXPECT_EQ(current(MemCategory::kGathered) - gathered0, 4 * (bf16 ? unit - weights : unit));
    EXPECT_EQ(current(MemCategory::kWorkspace) - workspace0, 4 * (bf16 ? unit - weight_grads : unit));
    EXPECT_EQ(dp.acquired_bf16(u) != nullptr, bf16);
    EXPECT_EQ(dp.acquired_grads_bf16(u) != nullptr, bf16);
    // Every tensor reads back as the stored 16-bit value of the initial parameter.
    for (const model::ParamTensor& t : layout.tensors()) {
      if (t.layer != 1) continue;
      const float* want = full.params() + layout.find(t.name)->offset;
      std::vector<uint16_t> rounded(t.numel);
      kernels::to_half(storage, want, rounded.data(), t.numel);
      std::vector<float> widened(t.numel);
      if (bf16 && t.gemm_weight) {
        kernels::from_half(storage, dp.acquired_bf16(u) + layout.offset_in_unit(t), widened.data(), t.numel);
      } else {
        const float* got = dp.fp32_tensor(fp32, u, t, layout);
        widened.assign(got, got + t.numel);
      }
      std::vector<float> expected(t.numel);
      kernels::from_half(storage, rounded.data(), expected.data(), t.numel);
      EXPECT_EQ(widened, expected) << t.name;
      if (!(bf16 && t.gemm_grad)) {  // the fp32 gradient lies inside the (packed) buffer
        const float* g = dp.fp32_grad_tensor(grads, u, t, layout);
        EXPECT_GE(g, grads) << t.name;
        EXPECT_LE(g + t.numel, grads + (bf16 ? unit - weight_grads : unit)) << t.name;
      }
    }
    dp.release_params(u);
  }
}

}  // namespace
}  // namespace meshtrain::planner::test_planner_memory
