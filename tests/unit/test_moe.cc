// Mixture of Experts (docs/moe.md): (1) the router's routing against a naive reference, and
// its gradient against central finite differences of a double-precision reference
// objective; (2) the grouped expert GEMMs against per-group GEMMs; (3) the layout, the
// parameter counts and the activation inventory of an MoE model; (4) an expert that gets no
// token; (5) dp ranks at every ZeRO stage, capacity drops and balance losses included,
// against one rank.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "checkpoint/hf_gpt2.h"
#include "checkpoint/safetensors_model.h"
#include "comm/self_group.h"
#include "core/file_io.h"
#include "comm/thread_group.h"
#include "core/memory.h"
#include "kernels/ops.h"
#include "model/gpt.h"
#include "model/config_json.h"
#include "model/moe_routing.h"
#include "parallel/data_parallel.h"
#include "thread_ranks_test_util.h"
#include "train/options.h"
#include "train/trainer.h"

namespace meshtrain::test_moe {
namespace {

using model::MoeConfig, model::MoeRoute, model::MoeRouteStats, model::MoeScore, model::MoeTraining;

// Storage for one layer's routing of N rows.
struct RouteBuffers {
  std::vector<int> expert, slot, order, offsets;
  std::vector<float> weight;
  MoeRoute route;
  RouteBuffers(int N, const MoeConfig& m)
      : expert(N * m.top_k), slot(N * m.top_k), order(N * m.top_k), offsets(m.experts + 1), weight(N * m.top_k) {
    route = {expert.data(), weight.data(), slot.data(), order.data(), offsets.data()};
  }
};

struct RoutingCase {
  const char* name;
  MoeScore score;
  bool renormalize;
  double capacity_factor;
  model::MoeBalance balance = model::MoeBalance::kSequence;
  bool biased = false;  // aux-loss-free balancing's bias on the choices
};
const RoutingCase kRoutingCases[] = {
    {"softmax_renormalised_dropless", MoeScore::kSoftmax, true, 0},
    {"softmax_capacity", MoeScore::kSoftmax, true, 1.0},
    {"sigmoid_raw_capacity", MoeScore::kSigmoid, false, 0.75},
    {"softmax_raw", MoeScore::kSoftmax, false, 0},
    {"sigmoid_micro_batch_balance", MoeScore::kSigmoid, true, 1.0, model::MoeBalance::kMicroBatch},
    {"softmax_biased_capacity", MoeScore::kSoftmax, true, 1.0, model::MoeBalance::kSequence, true},
};

// A routing bias of E experts that moves choices at these logits' scale (or none).
std::vector<float> bias_of(const RoutingCase& rc, int E) {
  if (!rc.biased) return {};
  std::vector<float> b(E);
  for (int e = 0; e < E; e++) b[e] = 0.15f * (float)((e * 7) % 5 - 2);
  return b;
}

MoeTraining training_of(const RoutingCase& rc, float aux_loss, float z_loss) {
  MoeTraining t{rc.capacity_factor, aux_loss, z_loss};
  t.balance = rc.balance;
  return t;
}

std::vector<float> random_logits(int n, uint32_t seed, float scale = 2.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// ---- naive references, in double ----

// One row's scores.
std::vector<double> ref_scores(MoeScore score, const double* logits, int E) {
  std::vector<double> s(E);
  if (score == MoeScore::kSigmoid) {
    for (int e = 0; e < E; e++) s[e] = 1.0 / (1.0 + std::exp(-logits[e]));
    return s;
  }
  double mx = *std::max_element(logits, logits + E), sum = 0;
  for (int e = 0; e < E; e++) sum += s[e] = std::exp(logits[e] - mx);
  for (double& x : s) x /= sum;
  return s;
}

// Experts by descending score, ties to the lower index: a stable sort.
std::vector<int> ref_top_k(const std::vector<double>& s, int k) {
  std::vector<int> idx(s.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return s[a] > s[b]; });
  idx.resize(k);
  return idx;
}

struct RefRouting {
  std::vector<int> expert;
  std::vector<bool> kept;
  std::vector<double> weight;
};

RefRouting ref_route(const MoeConfig& m, const MoeTraining& t, const std::vector<double>& logits, int N, int T,
                     const std::vector<float>& bias = {}) {
  const int E = m.experts, k = m.top_k;
  RefRouting r;
  for (int n = 0; n < N; n++) {
    const std::vector<double> s = ref_scores(m.score, &logits[(size_t)n * E], E);
    std::vector<double> ranked = s;  // the choice sees the bias, the weights do not
    for (int e = 0; e < (int)bias.size(); e++) ranked[e] = (double)(float)s[e] + bias[e];
    const std::vector<int> top = ref_top_k(ranked, k);
    double sum = 0;
    for (int e : top) sum += s[e];
    for (int e : top) r.expert.push_back(e), r.weight.push_back(m.renormalize ? s[e] / sum : s[e]);
  }
  r.kept.assign((size_t)N * k, true);
  if (t.capacity_factor > 0) {
    const int cap = (int)std::ceil(k * (double)T * t.capacity_factor / E);
    for (int b = 0; b < N / T; b++) {
      std::vector<int> taken(E, 0);
      for (int j = 0; j < k; j++)
        for (int n = b * T; n < (b + 1) * T; n++) {
          const int e = r.expert[n * k + j];
          r.kept[n * k + j] = taken[e] < cap;
          taken[e] += r.kept[n * k + j];
        }
    }
  }
  return r;
}

// The objective whose gradient moe_route_backward returns, with the choices and drops of
// `frozen` (piecewise constant in the logits): sum of dweight x weight over kept choices,
// aux_scale x each balance group's loss (a sequence, or the micro-batch counted once per
// sequence), z_scale x each token's z-loss.
double ref_objective(const MoeConfig& m, const MoeTraining& t, const std::vector<double>& logits,
                     const RefRouting& frozen, const std::vector<double>& dweight, int N, int T, double aux_scale,
                     double z_scale) {
  const int E = m.experts, k = m.top_k;
  auto scores_of = [&](int n) { return ref_scores(m.score, &logits[(size_t)n * E], E); };
  double J = 0;
  for (int n = 0; n < N; n++) {
    const double* row = &logits[(size_t)n * E];
    const std::vector<double> s = scores_of(n);
    double sum = 0;
    for (int j = 0; j < k; j++) sum += s[frozen.expert[n * k + j]];
    for (int j = 0; j < k; j++) {
      const int e = frozen.expert[n * k + j];
      if (frozen.kept[n * k + j]) J += dweight[n * k + j] * (m.renormalize ? s[e] / sum : s[e]);
    }
    double mx = *std::max_element(row, row + E), z = 0;
    for (int e = 0; e < E; e++) z += std::exp(row[e] - mx);
    const double lse = mx + std::log(z);
    J += z_scale * t.z_loss * lse * lse;
  }
  const int G = t.balance == model::MoeBalance::kMicroBatch ? N : T;
  for (int g = 0; g < N / G; g++) {
    std::vector<double> f(E, 0.0), P(E, 0.0);
    for (int n = g * G; n < (g + 1) * G; n++) {
      const std::vector<double> s = scores_of(n);
      double all = 0;
      for (int e = 0; e < E; e++) all += s[e];
      for (int j = 0; j < k; j++) f[frozen.expert[n * k + j]] += 1.0 / (k * G);
      for (int e = 0; e < E; e++) P[e] += (m.score == MoeScore::kSoftmax ? s[e] : s[e] / all) / G;
    }
    double aux = 0;
    for (int e = 0; e < E; e++) aux += f[e] * P[e];
    J += aux_scale * t.aux_loss * E * aux * (G / T);
  }
  return J;
}

class MoeRouting : public ::testing::TestWithParam<RoutingCase> {};

TEST_P(MoeRouting, MatchesANaiveReference) {
  const RoutingCase& rc = GetParam();
  const MoeConfig m{5, 2, 1, 0, 0, rc.score, rc.renormalize};
  const MoeTraining t = training_of(rc, 0.01f, 0.001f);
  const int T = 8, N = 3 * T, E = m.experts, k = m.top_k;
  std::vector<float> logits = random_logits(N * E, 31);
  RouteBuffers buf(N, m);
  MoeRouteStats stats;
  const std::vector<float> bias = bias_of(rc, E);
  model::moe_route(m, t, logits.data(), N, T, &buf.route, &stats, bias.empty() ? nullptr : bias.data());
  const RefRouting ref = ref_route(m, t, std::vector<double>(logits.begin(), logits.end()), N, T, bias);
  if (rc.biased) {
    const RefRouting plain = ref_route(m, t, std::vector<double>(logits.begin(), logits.end()), N, T);
    EXPECT_NE(plain.expert, ref.expert) << "the bias must move some choices";
  }
  std::vector<int64_t> chosen(E, 0);
  for (int e : ref.expert) chosen[e]++;
  EXPECT_EQ(stats.chosen, chosen) << "the load: every choice, dropped or not";
  int64_t dropped = 0;
  for (int a = 0; a < N * k; a++) {
    EXPECT_EQ(buf.expert[a], ref.expert[a]) << "assignment " << a;
    EXPECT_NEAR(buf.weight[a], ref.weight[a], 1e-6) << "assignment " << a;
    EXPECT_EQ(buf.slot[a] >= 0, (bool)ref.kept[a]) << "assignment " << a;
    dropped += !ref.kept[a];
  }
  EXPECT_EQ(stats.dropped, dropped);
  if (rc.capacity_factor > 0 && rc.capacity_factor < 1) {
    EXPECT_GT(dropped, 0) << "the case must drop";
  }
  // The dispatch order: by expert, then by token; slot and order are inverses.
  std::vector<int> kept;
  for (int a = 0; a < N * k; a++)
    if (ref.kept[a]) kept.push_back(a);
  std::stable_sort(kept.begin(), kept.end(), [&](int a, int b) { return ref.expert[a] < ref.expert[b]; });
  ASSERT_EQ(buf.offsets[E], (int)kept.size());
  for (int s = 0; s < (int)kept.size(); s++) {
    EXPECT_EQ(buf.order[s], kept[s]) << "row " << s;
    EXPECT_EQ(buf.slot[kept[s]], s);
  }
  for (int e = 0; e < E; e++) EXPECT_EQ(stats.tokens[e], buf.offsets[e + 1] - buf.offsets[e]);
  // The losses: their reference values at dweight = 0, unit scales.
  const std::vector<double> zero((size_t)N * k, 0.0);
  const std::vector<double> dl(logits.begin(), logits.end());
  const double aux = ref_objective(m, training_of(rc, t.aux_loss, 0), dl, ref, zero, N, T, 1, 0);
  const double z = ref_objective(m, training_of(rc, 0, t.z_loss), dl, ref, zero, N, T, 0, 1);
  EXPECT_NEAR(stats.aux, aux, 1e-6 * std::abs(aux));
  EXPECT_NEAR(stats.z, z, 1e-5 * std::abs(z));
}

// A sequence routes the same alone as in any batch: the promise behind layout independence.
// The micro-batch balance loss breaks it (and says so): its value depends on the batch.
TEST_P(MoeRouting, EachSequenceRoutesAsItDoesAlone) {
  const RoutingCase& rc = GetParam();
  const MoeConfig m{4, 2, 1, 0, 0, rc.score, rc.renormalize};
  const MoeTraining t = training_of(rc, 0.01f, 0.001f);
  const int T = 6, S = 3, N = S * T, k = m.top_k;
  std::vector<float> logits = random_logits(N * m.experts, 32);
  RouteBuffers whole(N, m);
  MoeRouteStats all;
  const std::vector<float> bias = bias_of(rc, m.experts);
  const float* biased = bias.empty() ? nullptr : bias.data();
  model::moe_route(m, t, logits.data(), N, T, &whole.route, &all, biased);
  MoeRouteStats parts;
  for (int b = 0; b < S; b++) {
    RouteBuffers one(T, m);
    model::moe_route(m, t, logits.data() + (size_t)b * T * m.experts, T, T, &one.route, &parts, biased);
    for (int a = 0; a < T * k; a++) {
      EXPECT_EQ(one.expert[a], whole.expert[b * T * k + a]);
      EXPECT_EQ(one.weight[a], whole.weight[b * T * k + a]);
      EXPECT_EQ(one.slot[a] >= 0, whole.slot[b * T * k + a] >= 0);
    }
  }
  EXPECT_EQ(parts.tokens, all.tokens);
  EXPECT_EQ(parts.dropped, all.dropped);
  if (rc.balance == model::MoeBalance::kSequence) {
    EXPECT_NEAR(parts.aux, all.aux, 1e-12);
  } else {
    EXPECT_GT(std::abs(parts.aux - all.aux), 1e-6) << "a micro-batch's balance is not its sequences'";
  }
  EXPECT_NEAR(parts.z, all.z, 1e-9);
}

// moe_route_backward (fp32) against central differences of the double reference objective,
// with weight, balance and z-loss terms all live.
TEST_P(MoeRouting, GradientMatchesFiniteDifferences) {
  const RoutingCase& rc = GetParam();
  const MoeConfig m{5, 2, 1, 0, 0, rc.score, rc.renormalize};
  const MoeTraining t = training_of(rc, 0.3f, 0.05f);
  const int T = 4, N = 2 * T, E = m.experts, k = m.top_k;
  std::vector<float> logits = random_logits(N * E, 33, 1.0f);
  std::vector<float> dweight = random_logits(N * k, 34, 1.0f);
  RouteBuffers buf(N, m);
  MoeRouteStats stats;
  const std::vector<float> bias = bias_of(rc, E);
  model::moe_route(m, t, logits.data(), N, T, &buf.route, &stats, bias.empty() ? nullptr : bias.data());
  const double aux_scale = 0.7, z_scale = 1.3;
  std::vector<float> grad(N * E);
  model::moe_route_backward(m, t, logits.data(), dweight.data(), buf.route, N, T, (float)aux_scale, (float)z_scale,
                            grad.data());
  std::vector<double> x(logits.begin(), logits.end());
  const RefRouting frozen = ref_route(m, t, x, N, T, bias);
  const std::vector<double> dw(dweight.begin(), dweight.end());
  const double h = 1e-6;
  for (int i = 0; i < N * E; i++) {
    const double saved = x[i];
    x[i] = saved + h;
    const double plus = ref_objective(m, t, x, frozen, dw, N, T, aux_scale, z_scale);
    x[i] = saved - h;
    const double minus = ref_objective(m, t, x, frozen, dw, N, T, aux_scale, z_scale);
    x[i] = saved;
    const double numeric = (plus - minus) / (2 * h);
    EXPECT_NEAR(grad[i], numeric, 2e-5 * (1 + std::abs(numeric))) << "logit " << i;  // fp32 against double
  }
}

INSTANTIATE_TEST_SUITE_P(MoeRouting, MoeRouting, ::testing::ValuesIn(kRoutingCases),
                         [](const auto& info) { return std::string(info.param.name); });

// Aux-loss-free balancing's update: over the mean steps down, under it up, at it stays
// (the mean 6 of loads 9, 6, 3, 6 compared exactly, as integers).
TEST(MoeRouting, ExpertBiasStepsTowardBalance) {
  const double load[4] = {9, 6, 3, 6};
  std::vector<float> bias = {0.5f, 0.0f, -0.25f, 0.0f};
  model::update_expert_bias(load, 4, 0.125f, bias.data());
  EXPECT_EQ(bias, (std::vector<float>{0.375f, 0.0f, -0.125f, 0.0f}));
}

// ---- grouped GEMMs ----

TEST(GroupedMatmul, MatchesOneGemmPerGroupAndSkipsEmptyGroups) {
  const int C = 24, OC = 40, groups = 4;
  const std::vector<int> offsets = {0, 7, 7, 19, 20};  // group 1 has no rows
  const int M = offsets.back();
  for (kernels::Precision p : {kernels::Precision::kFp32, kernels::Precision::kBf16}) {
    SCOPED_TRACE(kernels::precision_name(p));
    const std::vector<float> inp = random_logits(M * C, 40, 1.0f), dout = random_logits(M * OC, 41, 1.0f);
    std::vector<std::vector<float>> w(groups);
    std::vector<kernels::GemmInput> wi;
    for (int g = 0; g < groups; g++) w[g] = random_logits(OC * C, 42 + g, 1.0f), wi.emplace_back(w[g].data());
    std::vector<float> out(M * OC), dinp(M * C);
    std::vector<std::vector<float>> dw(groups, std::vector<float>(OC * C, 0.5f));
    std::vector<kernels::GradOutput> dwo;
    for (auto& d : dw) dwo.emplace_back(d.data());
    kernels::grouped_matmul_forward(out.data(), inp.data(), wi.data(), offsets.data(), groups, C, OC, p);
    kernels::grouped_matmul_backward(dinp.data(), dwo.data(), dout.data(), inp.data(), wi.data(), offsets.data(),
                                     groups, C, OC, p);
    for (int g = 0; g < groups; g++) {
      const int r0 = offsets[g], rows = offsets[g + 1] - offsets[g];
      if (rows == 0) {
        EXPECT_TRUE(std::all_of(dw[g].begin(), dw[g].end(), [](float v) { return v == 0.5f; }))
            << "an empty group's gradient is left as it was";
        continue;
      }
      std::vector<float> o(rows * OC), di(rows * C), d(OC * C, 0.5f);
      kernels::matmul_forward(o.data(), inp.data() + r0 * C, w[g].data(), nullptr, rows, C, OC, p);
      kernels::matmul_backward(di.data(), d.data(), nullptr, dout.data() + r0 * OC, inp.data() + r0 * C, w[g].data(),
                               rows, C, OC, p);
      for (int i = 0; i < rows * OC; i++) ASSERT_EQ(out[r0 * OC + i], o[i]) << "group " << g;
      for (int i = 0; i < rows * C; i++) ASSERT_EQ(dinp[r0 * C + i], di[i]) << "group " << g;
      for (int i = 0; i < OC * C; i++) ASSERT_EQ(dw[g][i], d[i]) << "group " << g;
    }
  }
}

// ---- the model ----

// A Llama-parts model with an MoE layer (layer 0) and a dense one (layer 1).
model::GptConfig small_moe(int shared = 0, int every = 2) {
  model::GptConfig c = testing_util::small_gpt(2);
  EXPECT_TRUE(model::apply_arch("llama", &c).is_ok());
  c.ffn_dim = 48;
  c.moe.experts = 4, c.moe.top_k = 2, c.moe.every = every, c.moe.shared_experts = shared, c.moe.expert_ffn = 24;
  return c;
}

// A Hugging Face folder in Mixtral's layout round-trips: config.json (Mixtral's fields, and
// meshtrain_moe only for what Mixtral cannot say) gives back the same model, the weights the
// same values.
TEST(MoeModel, HuggingFaceMixtralFolderRoundTrips) {
  model::GptConfig mixtral = small_moe(0, 1);
  mixtral.ffn_dim = 24;  // all layers MoE: intermediate_size is the experts' width
  for (const model::GptConfig& c : {mixtral, small_moe(1, 2)}) {
    model::Gpt gpt(c);
    gpt.init_weights(9);
    const std::string dir = testing_util::scratch_dir("moe", c.moe.shared_experts ? "hf_deepseek" : "hf_mixtral");
    ASSERT_TRUE(checkpoint::export_hf_folder(gpt, dir, 60e3).is_ok());  // sharded files
    std::string text;
    ASSERT_TRUE(read_file(dir + "/config.json", &text).is_ok());
    const nlohmann::json j = nlohmann::json::parse(text);
    EXPECT_EQ(j["model_type"], "mixtral");
    EXPECT_EQ(j["num_local_experts"], 4);
    EXPECT_EQ(j["num_experts_per_tok"], 2);
    EXPECT_EQ(j["intermediate_size"], 24);
    EXPECT_EQ(j.contains("meshtrain_moe"), c.moe.shared_experts > 0);
    model::GptConfig back;
    bool is_llama = false;
    ASSERT_TRUE(checkpoint::read_hf_llama_config(dir, &back, &is_llama).is_ok());
    ASSERT_TRUE(is_llama);
    EXPECT_TRUE(model::same_model(back, c)) << model::describe_arch(back) << " vs " << model::describe_arch(c);
    model::Gpt loaded(back);
    ASSERT_TRUE(checkpoint::load_hf_safetensors(dir + "/" + checkpoint::kHfIndexFile, &loaded).is_ok());
    ASSERT_EQ(loaded.num_elements(), gpt.num_elements());
    for (size_t i = 0; i < gpt.num_elements(); i++) ASSERT_EQ(loaded.params()[i], gpt.params()[i]) << i;
  }
}

// The balance-group flag: a name the message spells out, and only for an MoE model.
TEST(MoeModel, BalanceFlagIsChecked) {
  train::TrainOptions o;
  o.model_preset = "llama-tiny", o.moe_experts = 4, o.moe_balance = "batch";
  model::GptConfig c;
  int seq = 0;
  EXPECT_EQ(train::resolve_model(o, &c, &seq).message(), "--moe-balance must be sequence or micro-batch, got 'batch'");
  o.moe_balance = "micro-batch";
  ASSERT_TRUE(train::resolve_model(o, &c, &seq).is_ok());
  EXPECT_EQ(train::moe_training(o).balance, model::MoeBalance::kMicroBatch);
  o.moe_experts = 0;
  EXPECT_EQ(train::resolve_model(o, &c, &seq).message(), "--moe-balance needs a Mixture-of-Experts model (--moe-experts)");
}

TEST(MoeModel, ExpertParallelSizesAreChecked) {
  const model::GptConfig c = small_moe();
  EXPECT_TRUE(model::validate_ep(c, 2).is_ok());
  EXPECT_TRUE(model::validate_ep(c, 4).is_ok());
  EXPECT_EQ(model::validate_ep(c, 3).message(), "--ep 3 does not divide the 4 experts of each MoE layer");
  EXPECT_EQ(model::validate_ep(testing_util::small_gpt(2), 2).message(),
            "--ep 2 needs a Mixture-of-Experts model (--moe-experts)");
  // ep rank 1 of 2 holds experts 2 and 3 of each MoE layer, each a unit of its own.
  const model::ParamLayout half(c, 1, 0, {}, 2, 1);
  EXPECT_EQ(half.local_experts(0), 2);
  EXPECT_EQ(half.expert_fc(0, 0).name, "model.layers.0.block_sparse_moe.experts.2.w1.weight");
  EXPECT_EQ(half.units()[half.expert_unit(0, 1)].expert, 3);
  EXPECT_EQ(half.units()[half.expert_unit(0, 1)].id, model::moe_unit_id(c, 0, 3));
  EXPECT_FALSE(half.is_whole_model());
  EXPECT_TRUE(half.holds_every_layer());
}

// --expert-tp: 1 or --tp, only for an MoE model. At 1 each tp rank holds every routed expert
// whole (its tp ranks above 0 a copy, counted once), the shared experts and the dense parts
// still split.
TEST(MoeModel, ExpertTensorParallelIsCheckedAndLaidOut) {
  train::TrainOptions o;
  const model::GptConfig c = small_moe(1);
  o.tp = 2;
  parallel::Layout l;
  // The flag's value at the CLI's edge; whether the model has experts, a layout rule.
  auto check = [&](const model::GptConfig& config, int tp) {
    o.tp = tp;
    Status s = train::to_layout(o, tp, &l);
    return s.is_ok() ? parallel::check_layout(l, parallel::layout_model(config), parallel::LayoutReader::kEngine) : s;
  };
  o.expert_tp = 3;
  EXPECT_EQ(check(c, 2).message(),
            "--expert-tp must be 1 (each expert whole on every tp rank) or --tp (2, each split over them), got 3");
  o.expert_tp = 2;
  EXPECT_TRUE(check(c, 2).is_ok());
  EXPECT_EQ(train::expert_tp(o), model::ExpertTp::kSplit);
  o.expert_tp = 1;
  EXPECT_TRUE(check(c, 2).is_ok());
  EXPECT_EQ(train::expert_tp(o), model::ExpertTp::kReplicated);
  EXPECT_EQ(l.expert_tp, model::ExpertTp::kReplicated);
  EXPECT_EQ(check(testing_util::small_gpt(2), 2).message(),
            "--expert-tp needs a Mixture-of-Experts model (--moe-experts)");
  EXPECT_TRUE(check(testing_util::small_gpt(2), 1).is_ok()) << "tp 1: the same layout";
  const model::ParamLayout split(c, 2, 1), whole_experts(c, 2, 1, {}, 1, 0, model::ExpertTp::kReplicated);
  EXPECT_FALSE(split.experts_replicated());
  EXPECT_TRUE(whole_experts.experts_replicated());
  const std::string expert = "model.layers.0.block_sparse_moe.experts.1.w2.weight";
  const std::string shared = "model.layers.0.block_sparse_moe.shared_experts.down_proj.weight";
  EXPECT_EQ(whole_experts.find(expert)->numel, 2 * split.find(expert)->numel);
  EXPECT_TRUE(whole_experts.find(expert)->tp_copy);
  EXPECT_FALSE(split.find(expert)->tp_copy);
  EXPECT_EQ(whole_experts.find(shared)->numel, split.find(shared)->numel);
  EXPECT_FALSE(whole_experts.find(shared)->tp_copy);
  EXPECT_FALSE(model::ParamLayout(c, 2, 0, {}, 1, 0, model::ExpertTp::kReplicated).find(expert)->tp_copy);
}

TEST(MoeModel, LayoutNamesAndParameterCounts) {
  const model::GptConfig c = small_moe(1);
  const model::ParamLayout layout(c);
  ASSERT_TRUE(layout.find("model.layers.0.block_sparse_moe.gate.weight"));
  ASSERT_TRUE(layout.find("model.layers.0.block_sparse_moe.experts.3.w2.weight"));
  ASSERT_TRUE(layout.find("model.layers.0.block_sparse_moe.shared_experts.down_proj.weight"));
  EXPECT_FALSE(layout.find("model.layers.0.mlp.gate_proj.weight"));
  ASSERT_TRUE(layout.find("model.layers.1.mlp.gate_proj.weight")) << "layer 1 stays dense (every 2)";
  EXPECT_EQ(layout.local_experts(0), 4);
  // Each expert's tensors are one contiguous range, expert after expert: [w1; w3; w2].
  for (int j = 0; j < 4; j++) {
    const auto& fc = layout.expert_fc(0, j);
    EXPECT_EQ(fc.expert, j);
    EXPECT_EQ(fc.shape, (std::vector<int64_t>{24, 32}));
    EXPECT_EQ(layout.expert_proj(0, j).offset, fc.offset + 2 * fc.numel);
    if (j > 0) {
      EXPECT_EQ(fc.offset, layout.expert_proj(0, j - 1).offset + layout.expert_proj(0, j - 1).numel);
    }
  }
  // Every element counted once (the padded vocabulary rows aside); active = less the two
  // experts a token skips in the MoE layer.
  int64_t counted = 0;
  for (const auto& t : layout.tensors())
    counted += t.vocabulary_rows() ? (int64_t)c.vocab * c.dim : (int64_t)t.numel;
  EXPECT_EQ(model::num_parameters(c), counted);
  EXPECT_EQ(model::num_active_parameters(c), counted - 2 * 3 * 24 * 32);
  EXPECT_EQ(model::num_active_parameters(testing_util::small_gpt(2)), model::num_parameters(testing_util::small_gpt(2)));
}

// The activation memory a Gpt allocates is what activation_inventory (the planner's
// accounting) says, for MoE layers too, at every recomputation mode.
TEST(MoeModel, ActivationsMatchTheInventory) {
  const model::GptConfig c = small_moe(1);
  for (model::Recompute mode : {model::Recompute::kNone, model::Recompute::kSelective, model::Recompute::kFull}) {
    model::Gpt gpt(c);
    gpt.init_weights(3);
    gpt.set_recompute(mode);
    const int B = 2, T = 16;
    const model::ActivationInventory inv = model::activation_inventory(c, B, T, 1, false);
    const int64_t sets = inv.set_input + inv.block(mode, true) + inv.block(mode, false) + inv.head;
    const int64_t shared = inv.recompute_scratch(mode) + inv.gradient_scratch;
    auto current = [] { return MemoryTracker::instance().stats().current[(int)MemCategory::kActivations]; };
    const int64_t before = current();
    std::vector<int> tok(B * T, 5);
    gpt.forward(tok.data(), tok.data(), B, T);
    EXPECT_EQ(current() - before, (int64_t)sizeof(float) * (sets + shared));
    // The MoE block's tensors, written out: the dense MLP's [N,Fc] and [N,F] give way to the
    // router logits [N,E], the routing [N*k] x 4 + [E+1], the counts received [E], the
    // experts' [Nk,Fce], [Nk,Fe], [Nk,C] (one rank: R = Nk) and the shared expert's [N,Fce], [N,Fe].
    const int64_t N = B * T, E = 4, k = 2, Fce = 48, Fe = 24, C = 32, Fc = 96, F = 48;
    EXPECT_EQ(inv.moe_block_none - inv.block_none,
              N * E + 4 * N * k + E + 1 + E + N * k * (Fce + Fe + C) + N * (Fce + Fe) - N * (Fc + F));
  }
}

// Router rows 0 = +u, 1 = -u, 2 = 3 = 0: every token picks 0 or 1 first, then 2 (2 and 3
// tie, the lower index wins), so expert 3 gets no token.
void route_none_to_expert_3(model::Gpt* gpt) {
  const model::GptConfig& c = gpt->config();
  for (int l = 0; l < c.layers; l++) {
    const model::ParamTensor& r = gpt->layout().layer(l, model::kRouterW);
    float* w = gpt->params() + r.offset;
    std::fill(w, w + r.numel, 0.0f);
    for (int i = 0; i < c.dim; i++) w[i] = 0.5f * std::sin(1.0f + i), w[c.dim + i] = -w[i];
  }
}

// With that router expert 3's gradient is exactly zero, the others' are not, and a dp 2
// step at ZeRO-3 (which reduce-scatters the expert's gradient like any other) completes on
// both ranks.
TEST(MoeModel, AnExpertWithNoTokensGetsAZeroGradient) {
  const model::GptConfig c = small_moe(0, 1);
  model::Gpt gpt(c);
  gpt.init_weights(5);
  route_none_to_expert_3(&gpt);
  const data::TokenLoader data = testing_util::random_tokens(2000);
  std::vector<int> in(2 * 16), tg(2 * 16);
  data.fill(0, 2, 16, 0, 2, in.data(), tg.data());
  gpt.zero_grads();
  gpt.forward(in.data(), tg.data(), 2, 16);
  gpt.backward(1.0f / 32);
  for (int l = 0; l < c.layers; l++) {
    EXPECT_EQ(gpt.moe_stats()[l].tokens[3], 0);
    EXPECT_EQ(gpt.moe_stats()[l].tokens[2], 32);
    for (int j = 0; j < 4; j++) {
      const auto& fc = gpt.layout().expert_fc(l, j);
      const float* g = gpt.grads() + fc.offset;
      const size_t n = 3 * fc.numel;  // w1, w3, w2
      const bool zero = std::all_of(g, g + n, [](float v) { return v == 0.0f; });
      EXPECT_EQ(zero, j == 3) << "layer " << l << " expert " << j;
    }
  }
  comm::ThreadWorld world(2);
  std::vector<float> losses(2);
  model::Gpt start(c);
  start.set_from_global(gpt.params());
  comm::run_ranks(2, [&](int r) {
    std::unique_ptr<comm::Group> g = world.group(r, "dp");
    model::Gpt rank(c, parallel::model_state_for_stage(3));
    parallel::DataParallel dp(rank, *g, {3, 25, true}, testing_util::test_adamw(1.0f), start.params());
    losses[r] = train::train_step(rank, dp, *g, testing_util::test_adamw(1.0f), data, {1, 1, 16, 2, r}, 0, 1).loss;
  });
  EXPECT_EQ(losses[0], losses[1]);
  EXPECT_TRUE(std::isfinite(losses[0]));
}

// The same router under expert parallelism (ep 2 on thread ranks, rank 1 holding experts 2
// and 3): expert 3 gets no token from either rank, yet both ranks finish the step, agree on
// the loss, and expert 3's reduced gradient is exactly zero while expert 2's is not.
TEST(MoeModel, AnEmptyExpertUnderExpertParallelismHangsNoRank) {
  const model::GptConfig c = small_moe(0, 1);
  model::Gpt start(c);
  start.init_weights(5);
  route_none_to_expert_3(&start);
  const data::TokenLoader data = testing_util::random_tokens(2000);
  const optim::AdamWConfig adamw = testing_util::test_adamw(1.0f);
  comm::ThreadWorld world(2);
  std::vector<float> losses(2);
  std::vector<std::vector<bool>> zero_grad(2);
  comm::run_ranks(2, [&](int r) {
    std::unique_ptr<comm::Group> dp = world.group(r, "dp"), ep = dp->split(0, r, "ep");
    comm::SelfGroup edp("edp");
    model::Gpt gpt(c, parallel::model_state_for_stage(0), nullptr, false, {}, ep.get());
    gpt.set_from_global(start.params());
    parallel::DpConfig config{0, 25, true};
    parallel::ParamGroup dense{"dense", nullptr, {}}, experts{"experts", &edp, {}, ep.get()};
    for (int u = 0; u < gpt.layout().num_units(); u++)
      (gpt.layout().units()[u].expert >= 0 ? experts : dense).units.push_back(u);
    config.groups = {dense, experts};
    parallel::DataParallel store(gpt, *dp, config, adamw);
    losses[r] = train::train_step(gpt, store, *dp, adamw, data, {1, 1, 16, 2, r}, 0, 1).loss;
    for (int l = 0; l < c.layers; l++)
      for (int j = 0; j < gpt.layout().local_experts(l); j++) {
        const auto& fc = gpt.layout().expert_fc(l, j);
        const float* g = gpt.grads() + fc.offset;
        zero_grad[r].push_back(std::all_of(g, g + 3 * fc.numel, [](float v) { return v == 0.0f; }));
      }
  });
  EXPECT_EQ(losses[0], losses[1]);
  EXPECT_TRUE(std::isfinite(losses[0]));
  // Rank 0 holds experts 0 and 1 (used), rank 1 experts 2 (used) and 3 (never), per layer.
  EXPECT_EQ(zero_grad[0], std::vector<bool>({false, false, false, false}));
  EXPECT_EQ(zero_grad[1], std::vector<bool>({false, true, false, true}));
}

// dp 2 at ZeRO 0-3 trains an MoE model (a shared expert, a dense layer, capacity drops, both
// balance losses) as one rank does: per-sequence routing makes the split invisible.
TEST(MoeThreads, EveryZeroStageTrainsAsOneRank) {
  const model::GptConfig c = small_moe(1);
  const MoeTraining moe{1.0, 0.05f, 0.01f};
  const data::TokenLoader data = testing_util::random_tokens(4000);
  const optim::AdamWConfig adamw = testing_util::test_adamw(1.0f);
  constexpr int kSteps = 6;
  model::Gpt full(c);
  full.init_weights(11);
  full.set_moe_training(moe);
  std::vector<float> reference;
  int64_t dropped = 0;
  {
    model::Gpt gpt(c);
    gpt.set_from_global(full.params());
    gpt.set_moe_training(moe);
    comm::SelfGroup self("dp");
    parallel::DataParallel dp(gpt, self, {}, adamw);
    for (int k = 0; k < kSteps; k++) {
      reference.push_back(train::train_step(gpt, dp, self, adamw, data, {2, 2, 16, 1, 0}, k, kSteps).loss);
      dropped += gpt.moe_stats()[0].dropped;
    }
  }
  EXPECT_GT(dropped, 0) << "capacity factor 1 must drop some assignment";
  for (int zero = 0; zero <= 3; zero++) {
    SCOPED_TRACE(testing::Message() << "zero " << zero);
    comm::ThreadWorld world(2);
    std::vector<std::vector<float>> losses(2);
    comm::run_ranks(2, [&](int r) {
      std::unique_ptr<comm::Group> g = world.group(r, "dp");
      model::Gpt gpt(c, parallel::model_state_for_stage(zero));
      if (zero < 3) gpt.set_from_global(full.params());
      gpt.set_moe_training(moe);
      parallel::DataParallel dp(gpt, *g, {zero, 25, true}, adamw, full.params());
      for (int k = 0; k < kSteps; k++)
        losses[r].push_back(train::train_step(gpt, dp, *g, adamw, data, {2, 1, 16, 2, r}, k, kSteps).loss);
    });
    for (int k = 0; k < kSteps; k++) {
      EXPECT_EQ(losses[0][k], losses[1][k]) << "step " << k;
      EXPECT_NEAR(losses[0][k], reference[k], 1e-5) << "step " << k;
    }
  }
}

}  // namespace
}  // namespace meshtrain::test_moe
