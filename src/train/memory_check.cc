#include "train/memory_check.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "comm/mesh.h"
#include "machine/memory_limit.h"
#include "planner/local.h"
#include "train/auto_plan.h"

namespace meshtrain::train {

namespace {

std::string gb(double bytes) {
  char t[32];
  std::snprintf(t, sizeof t, "%.3g GB", bytes / 1e9);
  return t;
}

// The ranks on this host share its memory: the launcher's count of them.
int ranks_on_this_host() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"})
    if (const char* v = std::getenv(name); v && std::atoi(v) > 0) return std::atoi(v);
  return 1;
}

// The run as the planner describes it: the run's own layout, and what only the cost model
// reads.
planner::Layout layout_of(const TrainOptions& o, const Run& run) {
  planner::Layout l;
  static_cast<parallel::Layout&>(l) = run.layout;
  l.dp_overlap = o.overlap;
  return l;
}

// 16-bit storage is not replayed yet (predict_local models fp32 runs): its fp32 replay
// gives a lower bound. Activations are fp32 at every precision (measured: the same bytes);
// parameters and gradients take half the bytes, the optimizer (fp32 master weights and
// moments, 12 bytes per element instead of 8) 1.5 times; transient buffers are left out.
planner::EngineMemory sixteen_bit_floor(planner::EngineMemory e) {
  const double buffers = e.workspace + e.comm + e.gathered;
  e.total += -buffers - e.params / 2 - e.grads / 2 + e.optim / 2;
  e.params /= 2, e.grads /= 2, e.optim *= 1.5;
  e.workspace = e.comm = e.gathered = 0;
  return e;
}

// What one rank must hold in memory, as the planner replays it, and what of it files can
// take instead (--offload's nvme tiers, or all that --memory-budget may move).
struct Need {
  TrainOptions o;
  model::GptConfig config;
  planner::LocalRun local;
  planner::Cluster cluster;
  OffloadTiers tiers;

  // This pipeline rank's bytes (pp_rank < 0: the most loaded one's); < 0 when the planner
  // does not model the layout.
  double bytes(const planner::Layout& l, int seq, int pp_rank, planner::EngineMemory* parts = nullptr) const {
    planner::LocalRun r = local;
    r.seq = seq;
    model::GptConfig c = config;
    if (o.init_from.empty()) c.max_seq_len = seq;  // --seq-len sizes the position table too
    planner::Layout fp32 = l;
    fp32.precision = kernels::Precision::kFp32;
    planner::Prediction p;
    std::vector<planner::EngineMemory> ranks;
    if (!planner::predict_local(c, fp32, r, cluster, &p, &ranks).is_ok() || ranks.empty()) return -1;
    if (l.precision != kernels::Precision::kFp32)
      for (auto& x : ranks) x = sixteen_bit_floor(x);
    const planner::EngineMemory* e = &ranks[std::clamp(pp_rank, 0, (int)ranks.size() - 1)];
    if (pp_rank < 0)
      for (const auto& x : ranks)
        if (x.total > e->total) e = &x;
    if (parts) *parts = *e;
    // A lower bound with files: the category's own peak cannot be in memory at the sum's.
    const bool budget = o.memory_budget_gb > 0, sharded = l.zero == 3;
    double in_files = (tiers.optimizer || budget) ? e->optim : 0;
    if (sharded && (tiers.params || budget)) in_files += e->params;
    if (sharded && (tiers.grads || budget)) in_files += e->grads;
    return e->total - in_files;
  }
};

// Single changes to the flags that would fit `limit`, each with its figure.
std::string fitting_changes(const Need& need, const planner::Layout& l, int T, double limit) {
  std::vector<std::string> out;
  auto fits = [&](const planner::Layout& x, int seq, double* b) {
    *b = need.bytes(x, seq, -1);
    return *b >= 0 && *b <= limit;
  };
  double b = 0;
  if (l.recompute != model::Recompute::kFull) {
    planner::Layout x = l;
    x.recompute = model::Recompute::kFull;
    if (fits(x, T, &b)) out.push_back("--recompute full (" + gb(b) + ")");
  }
  const int rows = l.micro_batch * (l.global_batch / (l.micro_batch * l.dp));  // B x A
  for (int mb = l.micro_batch - 1; mb >= 1; mb--) {
    if (rows % mb != 0) continue;
    planner::Layout x = l;
    x.micro_batch = mb;
    if (!fits(x, T, &b)) continue;
    out.push_back("--micro-batch " + std::to_string(mb) + " --grad-accum " + std::to_string(rows / mb) + " (" +
                  gb(b) + ")");
    break;
  }
  // The longest sequence that fits, to a multiple of 64 (the attention kernel's block).
  int lo = 0, hi = T / 64;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (mid * 64 < T && fits(l, mid * 64, &b)) lo = mid;
    else hi = mid - 1;
  }
  if (lo > 0 && fits(l, lo * 64, &b)) out.push_back("--seq-len " + std::to_string(lo * 64) + " (" + gb(b) + ")");
  std::string text;
  for (const std::string& s : out) text += (text.empty() ? "" : "; ") + s;
  return text;
}

// What `train --plan auto` would run on these ranks within `limit` per rank, if any fits.
std::string planned_layout(const TrainOptions& o, int ranks, double limit) {
  TrainOptions copy = o;
  copy.memory_budget_gb = limit / 1e9;
  std::string summary;
  if (!choose_layout(&copy, ranks, planner::SearchSpace{}, &summary).is_ok()) return "";
  const size_t at = summary.find("running ");
  return at == std::string::npos ? summary : summary.substr(at + 8);
}

}  // namespace

Status check_memory_fits(const TrainOptions& o, const Run& run, int world_rank) {
  Need need{o, run.config, {}, {}, {}};
  need.local.threads = run.threads;
  need.local.stage_layers = o.stage_layers;
  // Memory needs no timing: fixed peaks spare the GEMM measurement.
  need.cluster = planner::local_cluster(run.threads, 100, 100);
  RETURN_IF_ERROR(parse_offload(o, &need.tiers));
  const planner::Layout l = layout_of(o, run);
  const int T = run.shape.T;
  const int pp_rank = comm::Mesh::coordinates(world_rank, run.mesh_shape).pp;
  planner::EngineMemory parts;
  const double bytes = need.bytes(l, T, pp_rank, &parts);
  if (bytes < 0) return Status::ok();  // not modelled: see the header
  // --memory-budget is not the limit here: it says what stays in memory and sends the rest
  // to files, which place_state() decides (and checks) once the state exists.
  const machine::MemoryLimit limit = machine::usable_memory(ranks_on_this_host());
  if (bytes <= limit.bytes) return Status::ok();
  const bool files = need.tiers.any() || o.memory_budget_gb > 0;
  const bool exact = run.layout.precision == kernels::Precision::kFp32;
  std::string msg = "rank " + std::to_string(world_rank) + " would need " + (exact ? "" : "at least ") + gb(bytes) +
                    " at its peak" + (exact ? "" : " (16-bit storage: a lower bound from the fp32 replay)") +
                    (files ? " with the state that can go to files there" : "") +
                    " (the planner's replay of this run: parameters " + gb(parts.params) + ", gradients " +
                    gb(parts.grads) + ", optimizer " + gb(parts.optim) + ", activations " + gb(parts.activations) +
                    ", buffers " + gb(parts.workspace + parts.comm + parts.gathered) + "), more than the " +
                    gb(limit.bytes) + " it can use (" + limit.source + "); refused before any allocation";
  const std::string changes = fitting_changes(need, l, T, limit.bytes);
  const std::string planned = planned_layout(o, run.mesh_shape.world(), limit.bytes);
  msg += changes.empty() ? "; no single change of --recompute, --micro-batch or --seq-len fits"
                         : ". Changes that fit: " + changes;
  msg += planned.empty() ? "; or more ranks (--dp with --zero shares the state, --pp the layers, --tp --sp the "
                           "activations), or --memory-budget with --offload-dir"
                         : "; or the layout --plan auto finds for these ranks: " + planned;
  return Status::error(msg);
}

}  // namespace meshtrain::train
