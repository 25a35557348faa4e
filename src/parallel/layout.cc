#include "parallel/layout.h"

#include <algorithm>
#include <functional>

#include "parallel/pp/stages.h"

namespace meshtrain::parallel {

namespace {

std::string str(long long v) { return std::to_string(v); }
std::string zero_flag(int zero) { return "--zero " + str(zero); }

using pp::ScheduleKind;
using Kind = Compression::Kind;

// A rule: its name, its check (which returns the reason when the layout breaks it), and who
// it binds: kAll, or kEngine for a limit of this engine's implementation (the GPU planner
// prices the stacks it models, which do not have it), or kCostModel for what the planners
// do not price yet (the engine runs it).
enum class Binds { kAll, kEngine, kCostModel };
struct Rule {
  const char* name;
  std::function<std::string(const Layout&, const LayoutModel&)> reason;
  Binds binds = Binds::kAll;
};

bool binds(Binds b, LayoutReader reader) {
  switch (b) {
    case Binds::kAll: return true;
    case Binds::kEngine: return reader != LayoutReader::kGpuPlanner;
    case Binds::kCostModel: return reader != LayoutReader::kEngine;
  }
  return true;
}

// ---- Axis sizes -------------------------------------------------------------------------

std::string axis_sizes(const Layout& l, const LayoutModel&) {
  if (l.tp < 1) return "tensor-parallel size (tp) must be >= 1, got " + str(l.tp);
  if (l.pp < 1) return "pipeline-parallel size (pp) must be >= 1, got " + str(l.pp);
  if (l.cp < 1) return "context-parallel size (cp) must be >= 1, got " + str(l.cp);
  if (l.dp < 1) return "data-parallel size (dp) must be >= 1, got " + str(l.dp);
  if (l.ep < 1) return "--ep must be >= 1, got " + str(l.ep);
  if (l.micro_batch < 1) return "--micro-batch must be >= 1, got " + str(l.micro_batch);
  if (l.virtual_stages < 1) return "--virtual-stages must be >= 1";
  if (l.zero < 0 || l.zero > 3) return "--zero must be 0, 1, 2 or 3, got " + str(l.zero);
  return "";
}

std::string global_batch(const Layout& l, const LayoutModel&) {
  if (l.global_batch < 1) return "--global-batch must be >= 1, got " + str(l.global_batch);
  if (l.global_batch % ((long long)l.micro_batch * l.dp) != 0)
    return "--global-batch " + str(l.global_batch) + " is not divisible by --micro-batch x dp = " +
           str(l.micro_batch) + " x " + str(l.dp);
  return "";
}

// ---- The model over tp and ep (Megatron's splits) ------------------------------------------

std::string tp_splits_model(const Layout& l, const LayoutModel& m) {
  return model::tp_split_error(l.tp, m.heads, m.kv_heads > 0 ? m.kv_heads : m.heads, m.ffn,
                               m.is_moe() ? m.expert_ffn : 0, m.split_vocab);
}

std::string sp_needs_tp(const Layout& l, const LayoutModel&) {
  return l.sp && l.tp < 2 ? "--sp (sequence parallelism) needs --tp > 1" : "";
}

std::string ep_inside_dp(const Layout& l, const LayoutModel&) {
  if (l.ep < 1 || l.dp % l.ep == 0) return "";
  return "--ep " + str(l.ep) + " must divide the data-parallel size dp = " + str(l.dp) +
         " (expert parallelism is carved out of dp)";
}

std::string ep_splits_experts(const Layout& l, const LayoutModel& m) {
  return l.ep > 1 ? model::ep_split_error(l.ep, m.experts) : "";
}

std::string whole_experts_need_moe(const Layout& l, const LayoutModel& m) {
  return l.whole_experts() && !m.is_moe() ? "--expert-tp needs a Mixture-of-Experts model (--moe-experts)" : "";
}

// ---- Context parallelism ------------------------------------------------------------------

// The load-balanced split cuts each sequence into 2 x cp chunks (model/context_parallel.h).
std::string cp_splits_sequence(const Layout& l, const LayoutModel& m) {
  if (l.cp <= 1 || m.seq_len <= 0 || m.seq_len % (2 * l.cp) == 0) return "";
  return "--cp " + str(l.cp) + " cuts each sequence into 2 x cp = " + str(2 * l.cp) +
         " chunks (rank r holds chunks r and 2cp-1-r): --seq-len " + str(m.seq_len) + " is not divisible by " +
         str(2 * l.cp);
}

// hybrid (Megatron-Core's a2a+p2p, USP): Ulysses inside groups of --cp-a2a consecutive cp
// ranks and the ring across the cp / cp_a2a groups, so both must be real splits.
std::string cp_hybrid_groups(const Layout& l, const LayoutModel&) {
  const bool hybrid = l.cp > 1 && l.cp_comm == model::CpComm::kHybrid;
  if (!hybrid && l.cp_a2a != 1)
    return "--cp-a2a " + str(l.cp_a2a) + " sizes --cp-comm hybrid's all-to-all groups: it needs --cp-comm hybrid and --cp > 1";
  if (!hybrid || (l.cp_a2a > 1 && l.cp_a2a < l.cp && l.cp % l.cp_a2a == 0)) return "";
  return "--cp-comm hybrid runs Ulysses inside groups of --cp-a2a ranks and the ring across them: --cp-a2a (got " +
         str(l.cp_a2a) + ") must divide --cp " + str(l.cp) + " and lie strictly between 1 and it";
}

// Ulysses trades sequence for heads: each tp rank's query heads split over cp, and its
// key/value heads too, or (fewer than cp) each serves a whole number of cp ranks.
std::string cp_a2a_heads(const Layout& l, const LayoutModel& m) {
  const bool hybrid = l.cp_comm == model::CpComm::kHybrid;
  const int n = hybrid ? l.cp_a2a : l.cp;  // the ranks each a2a splits heads over
  if (l.cp <= 1 || !(hybrid || l.cp_comm == model::CpComm::kA2a) || m.heads <= 0 || l.tp < 1 || n < 1) return "";
  const int heads = m.heads / l.tp, kv = std::max(1, (m.kv_heads > 0 ? m.kv_heads : m.heads) / l.tp);
  if (heads % n == 0 && (kv % n == 0 || n % kv == 0)) return "";
  const std::string over = hybrid ? "--cp-a2a " + str(n) : "--cp " + str(n), by = hybrid ? "cp_a2a" : "cp";
  return "--cp-comm " + std::string(model::cp_comm_name(l.cp_comm)) + " splits each tp rank's " + str(heads) +
         " query heads and " + str(kv) + " key/value heads over " + over + ": the query heads must divide by " + by +
         ", and the key/value heads divide by " + by + " or divide it";
}

// ---- Pipeline schedules -------------------------------------------------------------------

std::string stages_have_layers(const Layout& l, const LayoutModel& m) {
  return l.pp > 1 && m.layers > 0 ? pp::stage_count_error(m.layers, l.pp * l.chunks()) : "";
}

std::string schedule_chunks(const Layout& l, const LayoutModel&) {
  const bool interleaved = l.schedule == ScheduleKind::kInterleaved;
  if (l.schedule == ScheduleKind::kZbV)
    return l.virtual_stages != 2 ? "--schedule zb-v runs 2 chunks per rank (--virtual-stages 2 or unset)" : "";
  if (interleaved && l.virtual_stages < 2) return "--schedule interleaved needs --virtual-stages >= 2";
  if (!interleaved && l.virtual_stages > 1) return "--virtual-stages > 1 needs --schedule interleaved";
  return "";
}

std::string schedule_needs_pipeline(const Layout& l, const LayoutModel&) {
  if (l.pp > 1) return "";
  if (l.schedule == ScheduleKind::kInterleaved || l.schedule == ScheduleKind::kZbH1 ||
      l.schedule == ScheduleKind::kZbV)
    return std::string("--schedule ") + pp::schedule_name(l.schedule) + " needs --pp > 1";
  if (!l.stage_layers.empty()) return "--stage-layers needs --pp > 1";
  return "";
}

std::string interleaved_micro_batches(const Layout& l, const LayoutModel&) {
  const int m = l.micro_batches();
  if (l.schedule != ScheduleKind::kInterleaved || l.pp <= 1 || m == 0 || m % l.pp == 0) return "";
  return "--schedule interleaved needs the micro-batches per step (" + str(m) +
         ", --grad-accum or --global-batch/(micro-batch x dp)) to be a multiple of --pp " + str(l.pp);
}

// PipeDream-2BW's second weight version lives beside the model's fp32 parameters, and a
// step's list reaches into the next step's micro-batches (of the same length).
std::string two_bw_zero3(const Layout& l, const LayoutModel&) {
  if (!pp::never_flushes(l.schedule) || l.zero != 3) return "";
  return "--schedule 2bw keeps the weights before the last update beside the current ones in the model's full "
         "buffers: it runs with --zero 0, 1 or 2, not 3";
}

std::string two_bw_compress(const Layout& l, const LayoutModel&) {
  return pp::never_flushes(l.schedule) && l.compression.kind != Kind::kNone
             ? "--schedule 2bw does not run with --compress yet"
             : "";
}

std::string two_bw_even_steps(const Layout& l, const LayoutModel&) {
  if (!pp::never_flushes(l.schedule) || !l.uneven_steps) return "";
  return "--schedule 2bw runs the next step's first micro-batches in this step's list: every step must have the "
         "same length, so it does not run with --curriculum";
}

std::string two_bw_micro_batches(const Layout& l, const LayoutModel&) {
  const int m = l.micro_batches();
  if (!pp::never_flushes(l.schedule) || m == 0 || m >= l.pp) return "";
  return "--schedule 2bw needs at least as many micro-batches per step (" + str(m) +
         ") as pipeline stages (--pp " + str(l.pp) + "): with fewer, a third weight version would be in use";
}

// ---- Data-parallel traffic: compression, ZeRO++, offload -----------------------------------

std::string compression_zero(const Layout& l, const LayoutModel&) {
  if (l.compression.kind == Kind::kNone) return "";
  const int max_zero = l.compression.kind == Kind::kPowerSgd ? 0 : 1;
  if (l.zero <= max_zero) return "";
  return std::string("--compress ") + compression_name(l.compression.kind) + " runs with --zero " +
         (max_zero == 0 ? "0 (its bucket all-reduce)" : "0 or 1") + ", got " + zero_flag(l.zero);
}

std::string compression_precision(const Layout& l, const LayoutModel&) {
  if (l.compression.kind == Kind::kNone || l.precision == kernels::Precision::kFp32) return "";
  return std::string("--compress ") + compression_name(l.compression.kind) +
         " needs --precision fp32 (fp32 gradients), got " + kernels::precision_name(l.precision);
}

// The experts' own parameter groups (ep > 1, or whole experts on tp ranks) reduce apart
// from the dense ones, and the compressors run over one group.
bool expert_groups(const Layout& l, const LayoutModel& m) { return m.is_moe() && (l.ep > 1 || l.whole_experts()); }

std::string compression_expert_groups(const Layout& l, const LayoutModel& m) {
  if (l.compression.kind == Kind::kNone || !expert_groups(l, m)) return "";
  return std::string("--compress ") + compression_name(l.compression.kind) +
         " does not run with MoE experts yet (their parameter groups)";
}

std::string compression_priced_dense(const Layout& l, const LayoutModel& m) {
  if (l.compression.kind == Kind::kNone || !m.is_moe() || expert_groups(l, m)) return "";
  return std::string("--compress ") + compression_name(l.compression.kind) +
         " on an MoE model: the planners do not price compressed expert gradients yet";
}

std::string onebit_in_memory(const Layout& l, const LayoutModel&) {
  if (l.compression.kind != Kind::kOneBitAdam || !(l.offload.any() || l.memory_budget)) return "";
  return "--compress onebit-adam keeps the optimizer state in memory: drop --offload and --memory-budget";
}

std::string quantized_weights_zero3(const Layout& l, const LayoutModel&) {
  if (!l.quantized.weights || l.zero == 3) return "";
  return "--zero-quantized-weights quantizes ZeRO-3's parameter gathers: it needs --zero 3, got " + zero_flag(l.zero);
}

std::string quantized_grads_zero(const Layout& l, const LayoutModel&) {
  if (!l.quantized.grads || l.zero >= 1) return "";
  return "--zero-quantized-gradients quantizes the gradient reduce-scatter of ZeRO 1-3: it needs --zero 1, 2 or 3, "
         "got --zero 0 (its all-reduce: see --compress)";
}

std::string quantized_or_compressed(const Layout& l, const LayoutModel&) {
  if (!l.quantized.any() || l.compression.kind == Kind::kNone) return "";
  return std::string("--compress ") + compression_name(l.compression.kind) +
         " and --zero-quantized-* both compress the data-parallel traffic: choose one";
}

std::string offload_sharded(const Layout& l, const LayoutModel&) {
  if (!(l.offload.params || l.offload.grads) || l.zero == 3) return "";
  return "--offload params=nvme / grads=nvme needs --zero 3: only ZeRO-3 shards the parameters and gradients (got " +
         zero_flag(l.zero) + ")";
}

// Every rule, each once. The order is the order reasons are listed in.
const std::vector<Rule>& rules() {
  static const std::vector<Rule> table = {
      {"axis-sizes", axis_sizes},
      {"global-batch", global_batch},
      {"tp-splits-model", tp_splits_model},
      {"sp-needs-tp", sp_needs_tp},
      {"ep-inside-dp", ep_inside_dp},
      {"ep-splits-experts", ep_splits_experts},
      {"whole-experts-need-moe", whole_experts_need_moe},
      {"cp-splits-sequence", cp_splits_sequence},
      {"cp-hybrid-groups", cp_hybrid_groups},
      {"cp-a2a-heads", cp_a2a_heads},
      {"stages-have-layers", stages_have_layers},
      {"schedule-chunks", schedule_chunks},
      {"schedule-needs-pipeline", schedule_needs_pipeline},
      {"interleaved-micro-batches", interleaved_micro_batches},
      {"2bw-not-zero3", two_bw_zero3},
      {"2bw-no-compress", two_bw_compress, Binds::kEngine},
      {"2bw-even-steps", two_bw_even_steps, Binds::kEngine},
      {"2bw-micro-batches", two_bw_micro_batches},
      {"compression-zero", compression_zero},
      {"compression-fp32", compression_precision, Binds::kEngine},
      {"compression-expert-groups", compression_expert_groups},
      {"compression-priced-dense", compression_priced_dense, Binds::kCostModel},
      {"onebit-in-memory", onebit_in_memory, Binds::kEngine},
      {"quantized-weights-zero3", quantized_weights_zero3},
      {"quantized-grads-zero", quantized_grads_zero},
      {"quantized-or-compressed", quantized_or_compressed},
      {"offload-sharded", offload_sharded, Binds::kEngine},
  };
  return table;
}

}  // namespace

int Layout::micro_batches() const {
  const long long rows = (long long)micro_batch * dp;
  return rows > 0 && global_batch % rows == 0 ? (int)(global_batch / rows) : 0;
}

comm::MeshShape Layout::mesh() const {
  comm::MeshShape s;
  s.tp = tp, s.pp = pp, s.dp = dp, s.cp = cp, s.ep = ep, s.order = order;
  s.cp_a2a = cp_comm == model::CpComm::kHybrid ? cp_a2a : 1;
  return s;
}

LayoutModel layout_model(const model::GptConfig& c) {
  LayoutModel m;
  m.layers = c.layers, m.heads = c.heads, m.kv_heads = c.kv_head_count(), m.ffn = c.ffn();
  if (c.is_moe()) m.experts = c.moe.experts, m.expert_ffn = c.expert_ffn();
  m.split_vocab = c.padded_vocab();
  return m;
}

std::vector<LayoutError> validate(const Layout& l, const LayoutModel& m, LayoutReader reader) {
  std::vector<LayoutError> out;
  const std::string sizes = axis_sizes(l, m);
  if (!sizes.empty()) return {{"axis-sizes", sizes}};  // the other rules divide by them
  for (const Rule& r : rules())
    if (!binds(r.binds, reader)) continue;
    else if (std::string why = r.reason(l, m); !why.empty()) out.push_back({r.name, std::move(why)});
  return out;
}

Status check_layout(const Layout& l, const LayoutModel& m, LayoutReader reader) {
  std::string text;
  for (const LayoutError& e : validate(l, m, reader)) text += (text.empty() ? "" : "\n") + e.reason;
  return text.empty() ? Status::ok() : Status::error(text);
}

const char* zero3_gather_name(Zero3Gather g) {
  switch (g) {
    case Zero3Gather::kStep: return "step";
    case Zero3Gather::kUse: return "use";
    default: return "auto";
  }
}

Status parse_zero3_gather(const std::string& name, Zero3Gather* out) {
  for (Zero3Gather g : {Zero3Gather::kAuto, Zero3Gather::kStep, Zero3Gather::kUse})
    if (name == zero3_gather_name(g)) return *out = g, Status::ok();
  return Status::error("--zero3-gather must be auto, step or use, got '" + name + "'");
}

DpStep dp_step(const Layout& l) {
  DpStep s;
  s.reduce_once_per_step = l.pp > 1;
  s.reduces_per_micro_batch = l.zero >= 2 && !s.reduce_once_per_step;
  s.keep_gathered = l.zero3_gather == Zero3Gather::kStep ||
                    (l.zero3_gather == Zero3Gather::kAuto && l.pp > 1 && !l.offload.params);
  if (l.zero == 3 && !s.keep_gathered) s.gathers_per_use_step = l.recompute == model::Recompute::kFull ? 3 : 2;
  s.gathers_updated_params = l.zero == 1 || l.zero == 2;
  return s;
}

}  // namespace meshtrain::parallel
