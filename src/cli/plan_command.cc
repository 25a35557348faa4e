#include <algorithm>
#include <cmath>
#include <functional>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "planner/cluster_file.h"
#include "cli/commands.h"
#include "cli/in_process.h"
#include "planner/local.h"
#include "planner/memory.h"
#include "planner/models.h"
#include "planner/search.h"

namespace meshtrain::cli {

namespace {

using nlohmann::json;
using planner::Candidate;

// Everything `meshtrain plan` reads from its flags.
struct PlanFlags {
  bool memory = false;  // the ZeRO model-state table only
  double params = 0;
  std::vector<int> dp_values;  // --memory: N_d sizes; otherwise one fixed dp
  std::string state = "mixed";
  std::string model = "gpt3-175b", cluster = "a100-80g", precision;  // precision: bf16 (fp32 on local)
  int layers = 0, heads = 0, dim = 0, seq_len = 0, vocab = 0;
  int kv_heads = 0, ffn_dim = 0;  // 0: the model's
  std::string arch;               // gpt2 or llama: that family's parts on the model's shape
  std::vector<int> stage_layers;  // layers per pipeline stage (fixed; balanced when absent)
  std::string attention = "fused";
  int gpus = 0, global_batch = 0, top = 10;
  double tokens = 0;
  bool as_json = false, sp = false, no_sp = false;
  bool elementwise = false, no_elementwise = false;
  // Fixed choices: 0 (zero: -1) means searched.
  int tp = 0, pp = 0, zero = -1, micro_batch = 0, virtual_stages = 0, ep = 0, expert_tp = 0, cp = 0, cp_a2a = 0;
  std::string cp_comm;  // fixed; empty: every mode searched
  double moe_imbalance = 1.0;
  std::string schedule, recompute;
  std::string rank_order;  // fixed; empty: tp-dp-pp, or every order on a local cluster of several hosts
  std::string compress = "none";  // as train --compress
  int powersgd_rank = 4;
  bool quantized_weights = false, quantized_gradients = false;  // as train's ZeRO++ flags
};

// The table as JSON: for each N_d, each stage's bytes per rank in decimal GB.
json memory_table_json(double params, const std::string& state, const planner::StateDtypes& d,
                       const std::vector<int>& sizes) {
  json rows = json::array();
  for (int n : sizes) {
    json stages = json::array();
    for (int z = 0; z <= 3; z++) {
      const planner::StateBytes b = planner::model_state_bytes(params, d, z, n);
      stages.push_back({{"zero", z}, {"params_gb", b.params / 1e9}, {"grads_gb", b.grads / 1e9},
                        {"optim_gb", b.optim / 1e9}, {"total_gb", b.total() / 1e9}});
    }
    rows.push_back({{"dp", n}, {"stages", stages}});
  }
  return {{"parameters", params}, {"state", state},
          {"bytes_per_parameter", {{"params", d.param}, {"grads", d.grad}, {"optim", d.optim}}}, {"rows", rows}};
}

int memory_table(const PlanFlags& f) {
  if (!(f.params > 0)) return fail(Status::error("--memory needs --params > 0"));
  if (f.state != "mixed" && f.state != "fp32")
    return fail(Status::error("--state must be mixed or fp32, got '" + f.state + "'"));
  const std::vector<int> sizes = f.dp_values.empty() ? std::vector<int>{1, 4, 16, 64, 256, 1024} : f.dp_values;
  for (int n : sizes)
    if (n < 1) return fail(Status::error("--dp sizes must be >= 1, got " + std::to_string(n)));
  const planner::StateDtypes d = f.state == "mixed" ? planner::kMixedState : planner::kFp32State;
  if (f.as_json) {
    emit_json(memory_table_json(f.params, f.state, d, sizes), 1);
    return 0;
  }
  std::printf("model state per rank, %.4g parameters, %s (%g + %g + %g bytes per parameter), decimal GB\n",
              f.params, f.state.c_str(), d.param, d.grad, d.optim);
  std::printf("%8s | %12s | %12s | %12s | %12s\n", "N_d", "zero 0", "zero 1 (os)", "zero 2 (os+g)",
              "zero 3 (os+g+p)");
  for (int n : sizes) {
    std::printf("%8d", n);
    for (int z = 0; z <= 3; z++) std::printf(" | %12.4g", planner::model_state_bytes(f.params, d, z, n).total() / 1e9);
    std::printf("\n");
  }
  return 0;
}

// The model to plan: a preset, its parts replaced by --arch, any dimension overridden; the
// engine's record (for --cluster local) and the time model's view of it.
Status plan_model(const PlanFlags& f, model::GptConfig* config, planner::ModelShape* m) {
  int seq = 0;
  RETURN_IF_ERROR(planner::planning_config(f.model, config, &seq));
  for (auto [flag, v] : {std::pair{"--layers", f.layers}, {"--heads", f.heads}, {"--dim", f.dim},
                         {"--seq-len", f.seq_len}, {"--vocab", f.vocab}, {"--kv-heads", f.kv_heads},
                         {"--ffn-dim", f.ffn_dim}})
    if (v < 0) return Status::error(std::string(flag) + " must be >= 1, got " + std::to_string(v));
  model::GptConfig& c = *config;
  if (f.layers) c.layers = f.layers;
  if (f.heads) c.heads = f.heads;  // the key/value heads stay: --kv-heads to change them
  if (f.dim) c.dim = f.dim;
  if (f.seq_len) seq = f.seq_len, c.max_seq_len = std::max(c.max_seq_len, f.seq_len);
  if (f.vocab) c.vocab = f.vocab;
  if (!f.arch.empty()) RETURN_IF_ERROR(model::apply_arch(f.arch, &c));
  if (f.kv_heads) c.kv_heads = f.kv_heads;
  if (f.ffn_dim) c.ffn_dim = f.ffn_dim;
  if (c.dim % c.heads != 0)
    return Status::error("--heads " + std::to_string(c.heads) + " must divide --dim " + std::to_string(c.dim));
  if (c.heads % c.kv_head_count() != 0)
    return Status::error("--kv-heads " + std::to_string(c.kv_head_count()) + " must divide --heads " +
                         std::to_string(c.heads));
  *m = planner::model_shape(c, seq);
  return Status::ok();
}

Status search_space(const PlanFlags& f, planner::SearchSpace* s) {
  auto fixed = [](const char* flag, int v, int lowest, std::optional<int>* out) -> Status {
    if (v == (lowest == 0 ? -1 : 0)) return Status::ok();
    if (v < lowest) return Status::error(std::string(flag) + " must be >= " + std::to_string(lowest) + ", got " + std::to_string(v));
    *out = v;
    return Status::ok();
  };
  RETURN_IF_ERROR(fixed("--tp", f.tp, 1, &s->tp));
  RETURN_IF_ERROR(fixed("--pp", f.pp, 1, &s->pp));
  RETURN_IF_ERROR(fixed("--ep", f.ep, 1, &s->ep));
  RETURN_IF_ERROR(fixed("--cp", f.cp, 1, &s->cp));
  RETURN_IF_ERROR(fixed("--cp-a2a", f.cp_a2a, 1, &s->cp_a2a));
  if (!f.cp_comm.empty()) {
    model::CpComm c = model::CpComm::kRing;
    RETURN_IF_ERROR(model::parse_cp_comm(f.cp_comm, &c).with_context("--cp-comm"));
    s->cp_comm = c;
  }
  if (f.expert_tp == 1) {
    s->expert_tp = model::ExpertTp::kReplicated;
  } else if (f.expert_tp != 0) {  // split: the experts' tp is the layout's
    if (f.expert_tp < 0 || f.tp != f.expert_tp)
      return Status::error("--expert-tp must be 1 (each expert whole on every tp rank) or equal a fixed --tp, got " +
                           std::to_string(f.expert_tp));
    s->expert_tp = model::ExpertTp::kSplit;
  }
  if (!(f.moe_imbalance >= 1)) return Status::error("--moe-imbalance must be >= 1 (the most loaded expert over the mean)");
  s->moe_imbalance = f.moe_imbalance;
  RETURN_IF_ERROR(fixed("--micro-batch", f.micro_batch, 1, &s->micro_batch));
  RETURN_IF_ERROR(fixed("--virtual-stages", f.virtual_stages, 1, &s->virtual_stages));
  RETURN_IF_ERROR(fixed("--zero", f.zero, 0, &s->zero));
  if (s->zero && *s->zero > 3) return Status::error("--zero must be 0, 1, 2 or 3, got " + std::to_string(*s->zero));
  if (f.dp_values.size() > 1) return Status::error("--dp takes one size when planning (several only with --memory)");
  if (f.dp_values.size() == 1) RETURN_IF_ERROR(fixed("--dp", f.dp_values[0], 1, &s->dp));
  if (f.sp && f.no_sp) return Status::error("--sp and --no-sp contradict each other");
  if (f.sp) s->sp = true;
  if (f.no_sp) s->sp = false;
  if (f.elementwise && f.no_elementwise)
    return Status::error("--elementwise-recompute and --no-elementwise-recompute contradict each other");
  if (f.elementwise) s->elementwise_recompute = true;
  if (f.no_elementwise) s->elementwise_recompute = false;
  if (!f.schedule.empty()) {
    parallel::pp::ScheduleKind k;
    RETURN_IF_ERROR(parallel::pp::parse_schedule_kind(f.schedule, &k));
    s->schedule = k;
  }
  if (!f.recompute.empty()) {
    planner::Recompute r;
    RETURN_IF_ERROR(planner::parse_recompute(f.recompute, &r));
    s->recompute = r;
  }
  RETURN_IF_ERROR(planner::parse_attention(f.attention, &s->attention));
  if (!f.rank_order.empty()) {
    comm::RankOrder order;
    RETURN_IF_ERROR(comm::parse_rank_order(f.rank_order, &order).with_context("--rank-order"));
    s->rank_orders = {order};
  }
  RETURN_IF_ERROR(parallel::parse_compression_kind(f.compress, &s->compression.kind));
  if (f.powersgd_rank < 1) return Status::error("--powersgd-rank must be >= 1");
  s->compression.rank = f.powersgd_rank;
  s->quantized.weights = f.quantized_weights;
  s->quantized.grads = f.quantized_gradients;
  if (!f.stage_layers.empty()) {
    if (!s->pp) return Status::error("--stage-layers needs --pp (the layers of each of its stages)");
    s->stage_layers = f.stage_layers;
  }
  return Status::ok();
}

// The table's TFLOP/s convention, printed above it.
constexpr const char* kFlopConvention =
    "TFLOP/s: model FLOPs per GPU (6 per weight per token, 12 s h per token per layer for attention, no "
    "recompute), as MFU; --json adds Narayanan et al.'s, which count a recomputed forward";

std::string short_number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2g", v);
  return buf;
}

std::vector<comm::RankOrder> all_rank_orders() {
  using comm::MeshAxis;
  comm::RankOrder order = {MeshAxis::kTp, MeshAxis::kDp, MeshAxis::kPp};
  std::vector<comm::RankOrder> out;
  std::sort(order.begin(), order.end());
  do out.push_back(order);
  while (std::next_permutation(order.begin(), order.end()));
  return out;
}

// Layers per stage, runs of equal stages counted: "7,8(x14),7".
std::string stage_layers_text(const std::vector<int>& layers) {
  std::string out;
  for (size_t i = 0; i < layers.size();) {
    size_t j = i;
    while (j < layers.size() && layers[j] == layers[i]) j++;
    out += (out.empty() ? "" : ",") + std::to_string(layers[i]) + (j - i > 1 ? "(x" + std::to_string(j - i) + ")" : "");
    i = j;
  }
  return out;
}

// The layout in one line; the layers per stage where they are not all equal.
std::string layout_name(const Candidate& c) {
  const planner::Layout& l = c.layout;
  const std::vector<int>& stages = c.prediction.stage_layers;
  char buf[160];
  std::string sched = l.pp == 1 ? "-" : parallel::pp::schedule_name(l.schedule);
  if (l.virtual_stages > 1) sched += " v" + std::to_string(l.virtual_stages);
  const std::string ep = (l.ep > 1 ? " ep" + std::to_string(l.ep) : "") + (l.whole_experts() ? " etp1" : "");
  std::string cp = l.cp > 1 ? " cp" + std::to_string(l.cp) + " " + model::cp_comm_name(l.cp_comm) : "";
  if (l.cp > 1 && l.cp_comm == model::CpComm::kHybrid) cp += "/a2a" + std::to_string(l.cp_a2a);
  std::snprintf(buf, sizeof buf, "tp%d%s pp%d dp%d%s zero%d b%d %s%s rc:%s", l.tp, cp.c_str(), l.pp, l.dp, ep.c_str(), l.zero,
                l.micro_batch, sched.c_str(), l.sp ? " sp" : "",
                (planner::recompute_name(l.recompute) + std::string(l.elementwise_recompute ? "+ew" : "")).c_str());
  const bool even = std::adjacent_find(stages.begin(), stages.end(), std::not_equal_to<>()) == stages.end();
  std::string name = even ? buf : std::string(buf) + " layers " + stage_layers_text(stages);
  if (l.order != comm::kDefaultRankOrder) name += " order " + comm::rank_order_name(l.order);
  if (l.compression.kind != parallel::Compression::Kind::kNone)
    name += std::string(" ") + parallel::compression_name(l.compression.kind) +
            (l.compression.kind == parallel::Compression::Kind::kPowerSgd ? " r" + std::to_string(l.compression.rank) : "");
  if (l.quantized.weights) name += " qwZ";
  if (l.quantized.grads) name += " qgZ";
  return name;
}

// The model in words: its shape and the parts that are not GPT's.
std::string model_text(const model::GptConfig& c, const planner::ModelShape& m) {
  char buf[200];
  std::snprintf(buf, sizeof buf, "L=%d h=%d heads=%d kv=%d ffn=%d s=%d V=%d", m.layers, m.hidden, m.heads, m.kv(),
                m.ffn_width(), m.seq, m.vocab);
  return model::describe_arch(c) + " " + buf;
}

json candidate_json(const Candidate& c) {
  const planner::Layout& l = c.layout;
  const planner::Prediction& p = c.prediction;
  auto comm = [](const planner::CommTime& t) { return json{{"hidden", t.hidden}, {"exposed", t.exposed}}; };
  const auto& m = p.memory;
  return {{"layout",
           {{"tp", l.tp}, {"cp", l.cp}, {"cp_comm", model::cp_comm_name(l.cp_comm)}, {"cp_a2a", l.cp_a2a}, {"pp", l.pp}, {"dp", l.dp}, {"ep", l.ep}, {"expert_tp", l.whole_experts() ? 1 : l.tp}, {"zero", l.zero}, {"micro_batch", l.micro_batch},
            {"micro_batches", p.micro_batches}, {"schedule", parallel::pp::schedule_name(l.schedule)},
            {"virtual_stages", l.virtual_stages}, {"sp", l.sp}, {"recompute", planner::recompute_name(l.recompute)},
            {"elementwise_recompute", l.elementwise_recompute},
            {"attention", planner::attention_name(l.attention)}, {"stage_layers", p.stage_layers},
            {"compress", parallel::compression_name(l.compression.kind)},
            {"zero_quantized_weights", l.quantized.weights}, {"zero_quantized_gradients", l.quantized.grads},
            {"memory_rank", p.memory_rank}, {"rank_order", comm::rank_order_name(l.order)}}},
          {"step_s", p.step_s},
          {"tokens_per_s", p.tokens_per_s},
          {"tflops_per_gpu", p.model_tflops_per_gpu},
          {"narayanan_tflops_per_gpu", p.tflops_per_gpu},
          {"mfu", p.mfu},
          {"bubble", p.bubble},
          {"comm_s", {{"tp", comm(p.tp)}, {"cp", comm(p.cp)}, {"pp", comm(p.pp)}, {"dp", comm(p.dp)}, {"ep", comm(p.ep)}}},
          {"mem_gb",
           {{"params", m.params / 1e9}, {"grads", m.grads / 1e9}, {"optim", m.optim / 1e9},
            {"activations", m.activations / 1e9}, {"buffers", m.buffers / 1e9}, {"total", m.total() / 1e9},
            {"available", p.memory_available / 1e9}}},
          {"fits", p.fits()},
          {"over_gb", std::max(0.0, c.over_bytes() / 1e9)}};
}

void print_table(const model::GptConfig& config, const planner::ModelShape& m, const planner::Cluster& cluster,
                 const PlanFlags& f, planner::Precision precision, const std::vector<Candidate>& all) {
  int fitting = 0;
  for (const auto& c : all) fitting += c.prediction.fits();
  std::printf("plan: %s (%.4g parameters) on %d x %s, global batch %d, %s, %s attention\n",
              model_text(config, m).c_str(), planner::parameter_count(m), f.gpus, cluster.name.c_str(),
              f.global_batch, planner::precision_name(precision), f.attention.c_str());
  std::printf("%zu layouts predicted, %d fit in %.1f GB per GPU; the fastest %d that fit:\n", all.size(), fitting,
              all.empty() ? 0.0 : all.front().prediction.memory_available / 1e9, std::min(f.top, fitting));
  std::printf("(%s)\n\n", kFlopConvention);
  // Memory in GB, or in MB for models whose best layout needs under a GB.
  const bool mb = all.front().prediction.memory.total() < 1e9;
  const double unit = mb ? 1e6 : 1e9;
  // The layout column as wide as the widest layout shown.
  int width = 52, listed = 0;
  for (const auto& c : all)
    if (c.prediction.fits() && listed++ < f.top) width = std::max(width, (int)layout_name(c).size());
  std::printf("%3s  %-*s %8s %9s %7s %5s %6s | %6s %6s %6s %6s %6s %6s | %-23s\n", "#", width, "layout", "step s",
              "tokens/s", "TFLOP/s", "MFU", "bubble", "param", "grad", "optim", "act", "buf",
              mb ? "tot MB" : "tot GB", "comm s exposed (hidden)");
  auto row = [&](int i, const Candidate& c) {
    const auto& p = c.prediction;
    const auto& mem = p.memory;
    char comm[96];
    const std::string cp = c.layout.cp > 1 ? "cp " + short_number(p.cp.exposed) + " " : "";
    std::snprintf(comm, sizeof comm, "tp %.2g %spp %.2g dp %.2g (%.2g)", p.tp.exposed, cp.c_str(), p.pp.exposed,
                  p.dp.exposed, p.tp.hidden + p.cp.hidden + p.pp.hidden + p.dp.hidden);
    std::printf("%3d  %-*s %8.3g %9.4g %7.4g %4.1f%% %6.3f | %6.1f %6.1f %6.1f %6.1f %6.1f %6.1f | %s\n", i, width,
                layout_name(c).c_str(), p.step_s, p.tokens_per_s, p.model_tflops_per_gpu, 100 * p.mfu, p.bubble,
                mem.params / unit, mem.grads / unit, mem.optim / unit, mem.activations / unit, mem.buffers / unit,
                mem.total() / unit, comm);
  };
  int shown = 0;
  for (const auto& c : all)
    if (c.prediction.fits() && shown < f.top) row(++shown, c);
  if (fitting == 0) {
    std::printf("\nno layout fits; the closest ones (memory in GB per GPU over what is available):\n");
    for (size_t i = 0; i < all.size() && (int)i < f.top; i++)
      std::printf("  %-52s needs %.1f GB more\n", layout_name(all[i]).c_str(), all[i].over_bytes() / 1e9);
    return;
  }
  const auto& best = all.front().prediction;
  if (f.tokens > 0)
    std::printf("\n%.3g tokens at the best layout's %.4g tokens/s: %.1f days\n", f.tokens, best.tokens_per_s,
                f.tokens / best.tokens_per_s / 86400);
  // The nearest misses of the layouts that do not fit: how much they are over.
  int over = 0;
  for (const auto& c : all)
    if (!c.prediction.fits() && over++ < 3)
      std::printf("%s  %-52s does not fit: %.2f GB over\n", over == 1 ? "\n" : "", layout_name(c).c_str(),
                  c.over_bytes() / 1e9);
}

int run_plan(PlanFlags f) {
  if (f.memory) return memory_table(f);
  planner::ModelShape m;
  model::GptConfig config;
  if (Status s = plan_model(f, &config, &m); !s.is_ok()) return fail(s);
  // "local": this machine, one rank per "GPU", predicted by the engine's own accounting and
  // the local calibration (planner/local.h; fp32 runs only); a cluster file with base =
  // "local" is this machine split into hosts (network namespaces, scripts/hosts.sh).
  planner::Cluster cluster;
  if (f.cluster == "local") {
    cluster = planner::local_cluster(1);
    cluster.name = "local (1 thread per rank)";
  } else if (Status s = planner::resolve_cluster(f.cluster, &cluster); !s.is_ok()) {
    return fail(s);
  }
  const bool local = cluster.cores > 0;
  // A cluster file that counts its hosts: all of their ranks, unless --gpus says otherwise.
  if (f.gpus == 0 && cluster.nodes > 0) f.gpus = cluster.nodes * cluster.gpus_per_node;
  planner::Precision precision;
  const std::string precision_name = f.precision.empty() ? (local ? "fp32" : "bf16") : f.precision;
  if (Status s = planner::parse_precision(precision_name, &precision); !s.is_ok()) return fail(s);
  if (local && precision != planner::Precision::kFp32)
    return fail(Status::error("--cluster local models the engine's fp32 runs only; 16-bit storage is not modelled yet"));
  if (f.gpus < 1) return fail(Status::error("--gpus must be >= 1 (the number of GPUs to plan for)"));
  if (f.global_batch < 1) return fail(Status::error("--global-batch must be >= 1 (sequences per step)"));
  if (f.top < 1) return fail(Status::error("--top must be >= 1"));
  planner::SearchSpace space;
  if (Status s = search_space(f, &space); !s.is_ok()) return fail(s);
  // Placement matters once the ranks span hosts: every rank order is tried (on GPU presets
  // the default, tp inside a node, unless --rank-order fixes one).
  if (local && space.rank_orders.empty() && f.gpus > cluster.gpus_per_node) space.rank_orders = all_rank_orders();
  std::vector<Candidate> all;
  Status searched;
  if (local) {
    if (Status s = model::validate(config); !s.is_ok()) return fail(s);
    planner::LocalRun run;
    run.seq = m.seq;
    run.stage_layers = f.stage_layers;
    searched = planner::search_layouts(
        m, f.gpus, f.global_batch, precision, f.gpus, space,
        [&](const planner::Layout& l, planner::Prediction* p) { return planner::predict_local(config, l, run, cluster, p); },
        &all);
  } else {
    searched = planner::search_layouts(m, f.gpus, f.global_batch, precision, cluster, space, &all);
  }
  if (!searched.is_ok()) return fail(searched);
  if (f.as_json) {
    json layouts = json::array();
    for (size_t i = 0; i < all.size() && (int)i < f.top; i++) layouts.push_back(candidate_json(all[i]));
    json out = {{"model",
                 {{"arch", model::arch_name(config)}, {"parts", model::describe_arch(config)}, {"layers", m.layers},
                  {"hidden", m.hidden}, {"heads", m.heads}, {"kv_heads", m.kv()}, {"ffn", m.ffn_width()},
                  {"seq", m.seq}, {"vocab", m.vocab}, {"parameters", planner::parameter_count(m)}}},
                {"cluster", cluster.name},
                {"gpus", f.gpus},
                {"global_batch", f.global_batch},
                {"precision", precision_name},
                {"predicted", all.size()},
                {"flops", {{"tflops_per_gpu", "model FLOPs: 6 per weight per token (blocks and head) and 12 s h per "
                                              "token per layer for attention's two products, no recompute; mfu "
                                              "divides the same"},
                           {"narayanan_tflops_per_gpu", "Narayanan et al. 2021: model FLOPs with one recomputed "
                                                        "forward counted (8 per weight per token, 16 s h for "
                                                        "attention), as their Table 1"}}},
                {"layouts", layouts}};
    emit_json(out, 1);
    return 0;
  }
  print_table(config, m, cluster, f, precision, all);
  return 0;
}

// The layout's axes and choices: each fixed when given, searched when absent.
void add_layout_flags(CLI::App* cmd, PlanFlags* f) {
  cmd->add_option("--tp", f->tp, "Tensor-parallel size (fixed; searched when absent)");
  cmd->add_option("--ep", f->ep, "Expert-parallel size, MoE models (fixed; searched when absent)");
  cmd->add_option("--cp", f->cp,
                  "Context-parallel size: each sequence split over cp GPUs (fixed; searched from --seq-len 16384)");
  cmd->add_option("--cp-comm", f->cp_comm,
                  "ring, a2a (Ulysses), all-gather (Llama 3) or hybrid (a2a inside groups of --cp-a2a GPUs, ring "
                  "across): how attention crosses the cp GPUs (fixed; all searched)");
  cmd->add_option("--cp-a2a", f->cp_a2a,
                  "With --cp-comm hybrid: GPUs in each all-to-all group (fixed; searched: the groups that stay inside "
                  "a node beside tp)");
  cmd->add_option("--expert-tp", f->expert_tp,
                  "MoE: 1 keeps each routed expert whole on every tp rank, --tp splits it (fixed; searched when "
                  "absent)");
  cmd->add_option("--moe-imbalance", f->moe_imbalance,
                  "MoE: the most loaded expert's tokens over the mean (1: balanced)")
      ->capture_default_str();
  cmd->add_option("--pp", f->pp, "Pipeline stages (fixed)");
  cmd->add_option("--zero", f->zero, "ZeRO stage 0-3 (fixed)");
  cmd->add_option("--micro-batch", f->micro_batch, "Sequences per micro-batch (fixed)");
  cmd->add_option("--schedule", f->schedule, "gpipe, 1f1b, interleaved, zb-h1, zb-v or 2bw (fixed; 2bw trains with a one-step delayed update)");
  cmd->add_option("--virtual-stages", f->virtual_stages, "Chunks per pipeline rank, interleaved (fixed)");
  cmd->add_option("--stage-layers", f->stage_layers,
                  "Layers per pipeline stage, comma-separated, pp x virtual-stages of them (default: balanced "
                  "on predicted times)")
      ->delimiter(',');
  cmd->add_option("--attention", f->attention,
                  "fused (FlashAttention-style: no s x s scores in memory) or unfused (Megatron 2021-22)")
      ->capture_default_str();
  cmd->add_flag("--sp", f->sp, "Sequence parallelism on (fixed)");
  cmd->add_flag("--no-sp", f->no_sp, "Sequence parallelism off (fixed)");
  cmd->add_option("--recompute", f->recompute, "none, selective or full (fixed)");
  cmd->add_flag("--elementwise-recompute", f->elementwise,
                "The backward recomputes the norms' and the MLP activation's outputs instead of keeping them "
                "(fixed on; searched when neither flag is given)");
  cmd->add_flag("--no-elementwise-recompute", f->no_elementwise, "Element-wise recompute off (fixed)");
  cmd->add_option("--rank-order", f->rank_order,
                  "Rank order, fastest first, e.g. dp-tp-pp (fixed; default tp-dp-pp, every order searched on a "
                  "local cluster file of several hosts)");
}

}  // namespace

Command add_plan_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("plan", "Predict memory and speed of layouts on a cluster and rank them");
  auto f = std::make_shared<PlanFlags>();
  cmd->add_flag("--memory", f->memory, "Only the model-state bytes per rank for every ZeRO stage (with --params)");
  cmd->add_option("--params", f->params, "--memory: parameters (e.g. 7.5e9)");
  cmd->add_option("--dp", f->dp_values,
                  "Data-parallel size (fixed; searched when absent). With --memory: sizes N_d, comma-separated "
                  "(default 1,4,16,64,256,1024)")
      ->delimiter(',');
  cmd->add_option("--state", f->state,
                  "--memory: bytes per parameter, mixed (2 + 2 + 12, the ZeRO paper's) or fp32 (4 + 4 + 8)")
      ->capture_default_str();
  cmd->add_option("--model", f->model,
                  "Model: gpt3-1.3b, gpt3-13b, gpt3-175b, megatron-1t, or an engine preset (llama2-7b/13b/70b, "
                  "llama3-8b/70b/405b, gpt2-124m, llama-124m, ...)")
      ->capture_default_str();
  cmd->add_option("--arch", f->arch, "Replace the model's parts by a family's: gpt2 or llama");
  cmd->add_option("--kv-heads", f->kv_heads, "Override the key/value heads (GQA; 1: MQA)");
  cmd->add_option("--ffn-dim", f->ffn_dim, "Override the MLP's hidden width");
  cmd->add_option("--layers", f->layers, "Override the model's layers");
  cmd->add_option("--heads", f->heads, "Override the model's attention heads");
  cmd->add_option("--dim", f->dim, "Override the model's hidden size");
  cmd->add_option("--seq-len", f->seq_len, "Override the sequence length");
  cmd->add_option("--vocab", f->vocab, "Override the vocabulary");
  cmd->add_option("--cluster", f->cluster,
                  "a100-80g, h100-80g, h200, local (this machine, one rank per GPU), or a cluster TOML file")
      ->capture_default_str();
  cmd->add_option("--gpus", f->gpus, "GPUs to lay the model out on");
  cmd->add_option("--global-batch", f->global_batch, "Sequences per optimizer step");
  cmd->add_option("--precision", f->precision, "bf16, fp16 or fp32 (default bf16; fp32 on --cluster local)");
  add_layout_flags(cmd, f.get());
  cmd->add_option("--compress", f->compress,
                  "Gradient compression as train --compress: none, powersgd, onebit-adam (the compressed phase "
                  "is predicted: its bytes and the compressor's compute, measured on a local cluster, as GEMMs and "
                  "passes over memory on GPUs)")
      ->capture_default_str();
  cmd->add_option("--powersgd-rank", f->powersgd_rank, "PowerSGD's rank r (with --compress powersgd)")
      ->capture_default_str();
  cmd->add_flag("--zero-quantized-weights", f->quantized_weights,
                "ZeRO++ qwZ on every ZeRO-3 layout: int8 parameter gathers (their bytes and quantization)");
  cmd->add_flag("--zero-quantized-gradients", f->quantized_gradients,
                "ZeRO++ qgZ on every ZeRO 1-3 layout: int8 gradient reduce-scatters (their bytes and quantization)");
  cmd->add_option("--top", f->top, "Layouts shown")->capture_default_str();
  cmd->add_option("--tokens", f->tokens, "Also print the training time for this many tokens (e.g. 2e12)");
  cmd->add_flag("--json", f->as_json,
                "Machine-readable output: the top layouts with every predicted field (with --memory: the table)");
  return {cmd, [f] { return run_plan(*f); }};
}

}  // namespace meshtrain::cli
