#include "train/auto_plan.h"

#include <cstdio>
#include <thread>

#include "planner/local.h"
#include "train/options.h"

namespace meshtrain::train {

namespace {

std::string describe(const planner::Candidate& c) {
  const planner::Layout& l = c.layout;
  char buf[320];
  std::string sched = l.pp > 1 ? std::string(" ") + parallel::pp::schedule_name(l.schedule) : "";
  if (l.virtual_stages > 1) sched += " v" + std::to_string(l.virtual_stages);
  std::string cp = l.cp > 1 ? ", cp " + std::to_string(l.cp) + " " + model::cp_comm_name(l.cp_comm) : "";
  if (l.cp > 1 && l.cp_comm == model::CpComm::kHybrid) cp += " (a2a groups of " + std::to_string(l.cp_a2a) + ")";
  std::snprintf(buf, sizeof buf,
                "tp %d%s, pp %d, dp %d, zero %d, micro-batch %d x %d%s%s, recompute %s: predicted %.0f ms per "
                "step, %.3g GB peak per rank",
                l.tp, cp.c_str(), l.pp, l.dp, l.zero, l.micro_batch, c.prediction.micro_batches, sched.c_str(),
                l.sp ? ", sp" : "", planner::recompute_name(l.recompute), c.prediction.step_s * 1e3,
                c.prediction.memory.total() / 1e9);
  return buf;
}

}  // namespace

Status choose_layout(TrainOptions* o, int ranks, const planner::SearchSpace& fixed, std::string* summary) {
  model::GptConfig config;
  int T = 0;
  RETURN_IF_ERROR(resolve_model(*o, &config, &T));
  planner::Precision precision;
  RETURN_IF_ERROR(planner::parse_precision(o->precision, &precision));
  if (precision != planner::Precision::kFp32)
    return Status::error("--plan auto models the engine's fp32 runs; --precision " + o->precision +
                         " (16-bit storage) is not modelled yet: give the layout flags instead");
  const int cores = (int)std::max(1u, std::thread::hardware_concurrency());
  planner::LocalRun run;
  run.threads = o->threads > 0 ? o->threads : std::max(1, cores / ranks);
  run.seq = T;
  planner::Cluster cluster = planner::local_cluster(run.threads);
  // local_cluster() gives the machine's memory; the ranks share it.
  const double budget = o->memory_budget_gb > 0 ? o->memory_budget_gb * 1e9 : cluster.memory_bytes / ranks;
  cluster.memory_bytes = budget, cluster.reserved_bytes = 0;
  const int rows = o->global_batch > 0 ? o->global_batch : o->micro_batch * std::max(1, o->grad_accum) * ranks;
  std::vector<planner::Candidate> all;
  planner::SearchSpace space = fixed;
  space.exact_updates = true;  // never 2bw's delayed update unless --schedule 2bw asks for it
  RETURN_IF_ERROR(planner::search_layouts(
      planner::model_shape(config, T), ranks, rows, precision, ranks, space,
      [&](const planner::Layout& l, planner::Prediction* p) { return planner::predict_local(config, l, run, cluster, p); },
      &all));
  const planner::Candidate& best = all.front();
  if (!best.prediction.fits()) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "--plan auto: no layout of %d ranks fits in %.3g GB per rank; the closest needs %.3g GB more: ",
                  ranks, budget / 1e9, best.over_bytes() / 1e9);
    return Status::error(buf + describe(best));
  }
  const planner::Layout& l = best.layout;
  o->tp = l.tp, o->pp = l.pp, o->dp = l.dp, o->zero = l.zero;
  o->cp = l.cp, o->cp_comm = model::cp_comm_name(l.cp_comm), o->cp_a2a = l.cp_a2a;
  o->micro_batch = l.micro_batch, o->global_batch = rows, o->grad_accum = 0;
  o->schedule = parallel::pp::schedule_name(l.schedule), o->virtual_stages = l.virtual_stages;
  o->sp = l.sp, o->recompute = planner::recompute_name(l.recompute);
  o->expert_tp = l.whole_experts() ? 1 : 0;
  int fitting = 0;
  for (const auto& c : all) fitting += c.prediction.fits();
  *summary = "plan auto: " + std::to_string(all.size()) + " layouts of " + std::to_string(ranks) + " ranks predicted, " +
             std::to_string(fitting) + " fit; running " + describe(best);
  return Status::ok();
}

Status choose_layout_on_every_rank(TrainOptions* o, comm::Group& world, const planner::SearchSpace& fixed,
                                   const Console& console) {
  std::string summary;
  Status s = choose_layout(o, world.size(), fixed, &summary);
  // Every rank must have chosen alike (and failed alike): compare the choice's fields.
  constexpr int kFields = 9;
  double mine[kFields] = {s.is_ok() ? 1.0 : 0.0, (double)o->tp, (double)o->pp, (double)o->zero, (double)o->micro_batch,
                          (double)o->virtual_stages,
                          (double)(o->sp ? 1 : 0) + 2.0 * (o->recompute == "full") + 4.0 * (o->recompute == "selective"),
                          (double)o->cp, (double)o->cp_a2a};
  double lo[kFields], hi[kFields];
  for (int i = 0; i < kFields; i++) lo[i] = -mine[i], hi[i] = mine[i];
  world.all_reduce_f64(lo, kFields, comm::ReduceOp::kMax);
  world.all_reduce_f64(hi, kFields, comm::ReduceOp::kMax);
  for (int i = 0; i < kFields; i++)
    if (-lo[i] != hi[i])
      return Status::error("--plan auto: the ranks chose different layouts (is the GEMM peak cache readable by "
                           "every rank?); give the layout flags instead");
  if (!s.is_ok()) return s;
  if (world.rank() == 0 && !o->quiet) console.line(summary);
  return Status::ok();
}

}  // namespace meshtrain::train
