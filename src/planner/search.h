// Layout search: every way to lay a model out on N GPUs (tensor, pipeline and data
// parallel sizes, ZeRO stage, micro-batch, schedule and virtual stages, sequence
// parallelism, recomputation) that the engine's rules allow, predicted by the time model
// and ranked. Choices the user fixes are not searched.
#pragma once
#include <functional>
#include <optional>
#include <vector>

#include "planner/time_model.h"

namespace meshtrain::planner {

// Fixed choices; unset ones are searched.
inline constexpr int kCpSearchMinSeq = 16384;

struct SearchSpace {
  std::optional<int> tp, pp, dp, zero, micro_batch, virtual_stages, ep;
  // Context parallelism: searched (powers of two, each --cp-comm) on sequences of at least
  // kCpSearchMinSeq tokens; below that a sequence's activations fit beside tp and pp, and a
  // split only adds communication and smaller GEMMs.
  std::optional<int> cp;
  std::optional<model::CpComm> cp_comm;
  std::optional<int> cp_a2a;  // hybrid's all-to-all groups (searched: those inside a node beside tp)
  double moe_imbalance = 1.0;  // not searched: Layout::moe_imbalance of every candidate
  std::optional<model::ExpertTp> expert_tp;  // searched for MoE models at tp > 1
  std::optional<bool> sp;
  std::optional<Recompute> recompute;
  std::optional<bool> elementwise_recompute;  // (searched beside recompute none and selective)
  std::optional<parallel::pp::ScheduleKind> schedule;
  // Only schedules that train exactly as one rank does: 2bw (a one-step delayed update) is
  // searched only when this is off or the schedule is fixed to it. `train --plan auto`
  // sets it, so that it never changes how a run trains without being asked.
  bool exact_updates = false;
  // Not searched: the attention kernel the stack has, and layers per stage (with a fixed pp;
  // empty: each layout's balanced split).
  Attention attention = Attention::kFused;
  std::vector<int> stage_layers;
  // Rank orders to try (placement on a cluster of several hosts, planner/placement.h);
  // orders that place a layout's groups alike (they differ only in axes of size 1) are
  // tried once. Empty: the default, tp-dp-pp.
  std::vector<comm::RankOrder> rank_orders;
  // Every layout's gradient compression (the ZeRO stages it does not run with are skipped).
  parallel::Compression compression;
  // ZeRO++'s quantized collectives, on every layout whose ZeRO stage has them (weights:
  // stage 3; gradients: stages 1-3).
  parallel::QuantizedComm quantized;
};

struct Candidate {
  Layout layout;
  Prediction prediction;
  double over_bytes() const { return prediction.memory.total() - prediction.memory_available; }
};

// Predicts every valid layout of `gpus` GPUs for global batch `global_batch` (sequences)
// at `precision`, within `space`. Layouts that fit memory come first, fastest first; then
// those that do not, least over first. Searched sizes: tp a power of two up to the GPUs of
// one node (tensor parallelism across nodes is never faster here), pp any size the GPUs
// allow up to the layers (stages split as evenly as predicted times allow, so 126 layers
// can take 16 stages), micro-batches 1-16 (powers of two), interleaving with v chunks per
// rank where the layers split evenly and the micro-batches are a multiple of pp (Megatron's
// rule), ZeRO 0-3 (0-1 with pp > 1: the engine runs 2-3 under pipelines once per step, which the time model does not model yet; 0 alone without dp), sp with tp >
// 1, expert parallelism (MoE) over every divisor of dp that divides the experts, the
// routed experts split over tp or whole on each tp rank (MoE, tp > 1), and the recomputation modes (selective only with unfused attention: a fused kernel
// already recomputes its scores, so it equals none). GPipe is searched only when asked for
// (1F1B has its bubble with less memory). Errors: no valid layout at all, naming why.
// `predictor` ranks the layouts (layouts it rejects are skipped); tensor parallelism is
// searched up to `max_tp`.
using Predictor = std::function<Status(const Layout&, Prediction*)>;
Status search_layouts(const ModelShape& model, int gpus, int global_batch, Precision precision, int max_tp,
                      const SearchSpace& space, const Predictor& predictor, std::vector<Candidate>* out);
// The GPU time model on `cluster`, tensor parallelism up to one node.
Status search_layouts(const ModelShape& model, int gpus, int global_batch, Precision precision,
                      const Cluster& cluster, const SearchSpace& space, std::vector<Candidate>* out);

}  // namespace meshtrain::planner
