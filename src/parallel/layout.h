// One layout of a training step: every axis and every parallel choice, in one value, and
// the one place where the rules that join them live.
//
// The engine (train/setup.cc, from `train`'s flags at the CLI's edge: train/options.h's
// to_layout), the launcher before it starts any rank (cli/launch.cc), the GPU planner and
// the local planner (planner::Layout extends this type with what only a cost model needs),
// the layout search and `train --plan auto` all ask validate(). A rule is one entry of the
// table in layout.cc, with one reason text: the engine refuses exactly the layouts the
// search skips, with the same words (tests/unit/test_layout.cc enumerates a grid).
//
// What is not here: flag ranges that are not about the layout (--lr, --steps, ...), and
// what depends on the run's files (resume, data). Those stay with their readers.
#pragma once
#include <string>
#include <vector>

#include "comm/mesh.h"
#include "core/status.h"
#include "kernels/ops.h"
#include "model/config.h"
#include "model/cp_comm.h"
#include "model/param_layout.h"
#include "model/recompute.h"
#include "parallel/dp/compressed_reduce.h"
#include "parallel/dp/quantized_comm.h"
#include "parallel/pp/schedule.h"

namespace meshtrain::parallel {

// Which model states live in files (ZeRO-Infinity's nvme tier); the rest stays in memory.
struct OffloadTiers {
  bool optimizer = false, params = false, grads = false;
  bool any() const { return optimizer || params || grads; }
};

// --zero3-gather: when ZeRO-3 gathers a unit's parameters (DpStep::keep_gathered).
enum class Zero3Gather { kAuto, kStep, kUse };
const char* zero3_gather_name(Zero3Gather g);  // "auto", "step", "use"
Status parse_zero3_gather(const std::string& name, Zero3Gather* out);

struct Layout {
  // ---- Axes: world = tp x cp x dp x pp ranks (comm/mesh.h places them).
  int tp = 1, pp = 1, dp = 1;
  int cp = 1;              // context parallelism: each sequence split over cp ranks
  model::CpComm cp_comm = model::CpComm::kRing;  // how attention crosses the cp ranks
  int cp_a2a = 1;          // hybrid: the a2a groups' size (consecutive cp ranks); ring across them
  int ep = 1;              // expert parallelism, carved out of dp (MoE models)
  int virtual_stages = 1;  // v, model chunks per pipeline rank
  comm::RankOrder order = comm::kDefaultRankOrder;
  // The routed experts on the tp group (--expert-tp): split like the dense MLP, or whole on
  // every tp rank.
  model::ExpertTp expert_tp = model::ExpertTp::kSplit;

  // ---- Batch: global_batch = micro_batch x micro_batches() x dp sequences per step.
  int micro_batch = 1;
  int global_batch = 1;

  // ---- Choices.
  int zero = 0;  // ZeRO stage 0-3 over dp
  Zero3Gather zero3_gather = Zero3Gather::kAuto;
  pp::ScheduleKind schedule = pp::ScheduleKind::k1F1B;
  std::vector<int> stage_layers;  // layers per stage (pp x v entries); empty: balanced
  bool sp = false;                // sequence parallelism over tp
  model::Recompute recompute = model::Recompute::kNone;
  kernels::Precision precision = kernels::Precision::kFp32;
  Compression compression;        // of the dp reduction (--compress)
  QuantizedComm quantized;        // ZeRO++'s int8 collectives
  OffloadTiers offload;           // states in files
  bool memory_budget = false;     // what does not fit a budget goes to files
  bool uneven_steps = false;      // steps of different lengths (a sequence-length curriculum)

  int world() const { return tp * cp * pp * dp; }
  // m, the micro-batches of one step on one dp rank (0 when the batch does not divide).
  int micro_batches() const;
  bool whole_experts() const { return expert_tp == model::ExpertTp::kReplicated && tp > 1; }
  comm::MeshShape mesh() const;
  // Model chunks per pipeline rank the schedule runs: zb-v always 2, else v.
  int chunks() const { return schedule == pp::ScheduleKind::kZbV ? 2 : virtual_stages; }
};

// What the rules need of a model: the engine's GptConfig or the planner's ModelShape.
struct LayoutModel {
  int layers = 0, heads = 0, kv_heads = 0, ffn = 0;
  int experts = 0, expert_ffn = 0;
  int seq_len = 0;  // T, the tokens of a sequence; 0: not checked
  // The head's rows split over tp (the engine's padded vocabulary); 0: not checked (the
  // GPU planner's published models pad as their stacks do).
  int split_vocab = 0;
  bool is_moe() const { return experts > 0; }
};
LayoutModel layout_model(const model::GptConfig& c);

// What data parallelism does in one step of a layout, as parallel::DataParallel runs it:
// when gradients are reduced and parameters gathered. The engine's DpConfig, the GPU and
// local time models and the local planner's memory replay all take it from here, so that a
// change to when the engine reduces or gathers is made once.
struct DpStep {
  // Under a pipeline each micro-batch's backward runs apart from the others': ZeRO-2/3
  // accumulate each unit's gradient over the step and reduce-scatter it once, not after
  // every micro-batch's backward. (ZeRO 0-1 reduce once, after the last, anyway.)
  bool reduce_once_per_step = false;
  // ZeRO-2/3 reducing after every micro-batch's backward.
  bool reduces_per_micro_batch = false;
  // ZeRO-3: each unit gathered once per step and kept to its end (its full parameters
  // resident meanwhile), or at every use. --zero3-gather auto keeps them under a pipeline
  // unless the parameters are in files, where keeping them all would hold the whole model.
  bool keep_gathered = false;
  // ZeRO-3 gathering at every use: per unit and micro-batch, its forward, its backward, and
  // full recomputation's second forward.
  int gathers_per_use_step = 0;
  // ZeRO 1-2: the updated shards all-gathered after the optimizer step.
  bool gathers_updated_params = false;
};
DpStep dp_step(const Layout& l);

// A broken rule: its name (stable, for tests and tools) and the reason, in flag terms.
struct LayoutError {
  std::string rule;
  std::string reason;
};

// Who asks. Most rules bind everyone; a few are limits of this engine's implementation
// (fp32 gradients for --compress, 2bw without --compress, offload tiers), which the GPU
// planner does not apply to the stacks it prices, and one is a limit of the planners' cost
// models (compressed MoE gradients), which the engine runs. The local planner models this
// engine, so it applies both.
enum class LayoutReader { kEngine, kLocalPlanner, kGpuPlanner };

// Every rule the layout breaks, in the table's order; empty when it is legal.
std::vector<LayoutError> validate(const Layout& l, const LayoutModel& m, LayoutReader reader);
// validate() as a Status: every reason, one per line.
Status check_layout(const Layout& l, const LayoutModel& m, LayoutReader reader);

}  // namespace meshtrain::parallel
