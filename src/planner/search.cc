#include "planner/search.h"

#include <algorithm>
#include <string>

namespace meshtrain::planner {

namespace {

using parallel::pp::ScheduleKind;

// The values of one choice: the fixed one, or every candidate.
template <typename T>
std::vector<T> choices(const std::optional<T>& fixed, std::vector<T> all) {
  if (fixed) return {*fixed};
  return all;
}

std::vector<int> divisors(int n) {
  std::vector<int> out;
  for (int d = 1; d <= n; d++)
    if (n % d == 0) out.push_back(d);
  return out;
}

std::vector<int> powers_of_two_up_to(int n) {
  std::vector<int> out;
  for (int p = 1; p <= n; p *= 2) out.push_back(p);
  return out;
}

// MoE: the divisors of dp that divide the experts; dense: 1.
std::vector<int> expert_parallel_sizes(const ModelShape& m, int dp) {
  std::vector<int> out;
  for (int e : divisors(dp))
    if (e == 1 || (m.is_moe() && m.experts % e == 0)) out.push_back(e);
  return out;
}

// The orders among `orders` that place a tp x pp x dp mesh differently: the axes of size
// above 1, in order, tell them apart.
std::vector<comm::RankOrder> distinct_orders(const std::vector<comm::RankOrder>& orders, int tp, int pp, int dp) {
  if (orders.empty()) return {comm::kDefaultRankOrder};
  const comm::MeshShape shape{.tp = tp, .pp = pp, .dp = dp};
  std::vector<comm::RankOrder> out;
  std::vector<std::vector<comm::MeshAxis>> seen;
  for (const comm::RankOrder& order : orders) {
    std::vector<comm::MeshAxis> key;
    for (comm::MeshAxis a : order)
      if (shape.size(a) > 1) key.push_back(a);
    if (std::find(seen.begin(), seen.end(), key) != seen.end()) continue;
    seen.push_back(key);
    out.push_back(order);
  }
  return out;
}

// The schedules (and chunks per rank) to try for pp stages and m micro-batches.
std::vector<std::pair<ScheduleKind, int>> schedule_choices(const ModelShape& model, const SearchSpace& space, int pp,
                                                           int m) {
  std::vector<std::pair<ScheduleKind, int>> schedules;
  if (pp == 1) {
    schedules.push_back({space.schedule.value_or(ScheduleKind::k1F1B), 1});
  } else {
    for (ScheduleKind k : choices(space.schedule, {ScheduleKind::k1F1B, ScheduleKind::kInterleaved,
                                                    ScheduleKind::kZbH1, ScheduleKind::kZbV,
                                                    ScheduleKind::k2BW})) {
      if (k == ScheduleKind::k2BW && space.exact_updates && !space.schedule)
        continue;  // (its updates are one step stale; the layout rules skip m < p)
      if (k == ScheduleKind::kZbV) {  // always two chunks per rank
        if (space.stage_layers.empty() ? model.layers % (2 * pp) == 0 : (int)space.stage_layers.size() == 2 * pp)
          schedules.push_back({k, 2});
        continue;
      }
      if (k != ScheduleKind::kInterleaved) {
        schedules.push_back({k, 1});
        continue;
      }
      for (int v : choices(space.virtual_stages, {2, 3, 4, 6, 8}))
        // (Uneven layer counts are fine: split_layers balances the chunks on their costs, as
        // Llama 3 405B's 126 layers over 16 ranks' chunks with lighter edges.)
        if (v > 1 && m % pp == 0 && pp * v <= model.layers)
          schedules.push_back({k, v});
    }
  }
  return schedules;
}

// The context-parallel sizes to try for `rest` GPUs beside tp and pp: the fixed one, or on
// long sequences each power of two that splits the sequence into 2 cp chunks.
std::vector<int> cp_choices(const ModelShape& model, const SearchSpace& space, int rest) {
  if (space.cp) return {*space.cp};
  std::vector<int> out;
  for (int cp : powers_of_two_up_to(rest))
    if (cp == 1 || (model.seq >= kCpSearchMinSeq && model.seq % (2 * cp) == 0)) out.push_back(cp);
  return out;
}

// How attention crosses the cp GPUs, and hybrid's all-to-all group size: ring, a2a and
// all-gather, and hybrid with each group of a consecutive cp GPUs (1 < a < cp) that stays
// inside a node beside tp (its all-to-alls on the node's links, the ring across nodes;
// every size when hybrid is fixed and none does); the fixed mode or size, if given.
std::vector<std::pair<model::CpComm, int>> cp_comm_choices(const SearchSpace& space, int cp, int tp, int max_tp) {
  using model::CpComm;
  // (A fixed size goes to every mode as given: the layout rules say where it does not apply.)
  if (cp == 1) return {{CpComm::kRing, space.cp_a2a.value_or(1)}};
  std::vector<std::pair<CpComm, int>> out;
  for (CpComm mode : choices(space.cp_comm, {CpComm::kRing, CpComm::kA2a, CpComm::kAllGather, CpComm::kHybrid})) {
    if (mode != CpComm::kHybrid || space.cp_a2a) {
      out.push_back({mode, space.cp_a2a.value_or(1)});
      continue;
    }
    const size_t before = out.size();
    for (int a = 2; a < cp; a *= 2)
      if (cp % a == 0 && tp * a <= max_tp) out.push_back({mode, a});
    if (space.cp_comm && out.size() == before)  // hybrid asked for, and no group fits a node: every size
      for (int a = 2; a < cp; a *= 2)
        if (cp % a == 0) out.push_back({mode, a});
  }
  return out;
}

// One point of the search: the axes' sizes and the choices that vary.
struct Point {
  int tp, pp, dp, micro_batch, global_batch, zero;
  int cp = 1;
  model::CpComm cp_comm = model::CpComm::kRing;
  int cp_a2a = 1;
  bool sp;
  Recompute recompute;
  bool elementwise_recompute = false;
  ScheduleKind schedule;
  int virtual_stages, ep;
  model::ExpertTp expert_tp;
};

// The layout of one point, with the space's fixed settings.
Layout make_layout(const SearchSpace& space, const comm::RankOrder& order, const Point& x, Precision precision) {
  Layout l;
  l.order = order;
  l.tp = x.tp, l.pp = x.pp, l.dp = x.dp, l.cp = x.cp, l.cp_comm = x.cp_comm, l.cp_a2a = x.cp_a2a, l.micro_batch = x.micro_batch, l.global_batch = x.global_batch;
  l.zero = x.zero, l.sp = x.sp, l.recompute = x.recompute, l.elementwise_recompute = x.elementwise_recompute, l.schedule = x.schedule, l.virtual_stages = x.virtual_stages;
  l.ep = x.ep, l.expert_tp = x.expert_tp, l.moe_imbalance = space.moe_imbalance;
  l.precision = precision;
  l.compression = space.compression;
  l.quantized = space.quantized;
  l.quantized.weights = l.quantized.weights && x.zero == 3;
  l.quantized.grads = l.quantized.grads && x.zero >= 1;
  l.attention = space.attention;
  l.stage_layers = space.stage_layers;
  return l;
}

}  // namespace

Status search_layouts(const ModelShape& model, int gpus, int global_batch, Precision precision,
                      const Cluster& cluster, const SearchSpace& space, std::vector<Candidate>* out) {
  return search_layouts(model, gpus, global_batch, precision, cluster.gpus_per_node, space,
                        [&](const Layout& l, Prediction* p) { return predict(model, l, cluster, p); }, out);
}

Status search_layouts(const ModelShape& model, int gpus, int global_batch, Precision precision, int max_tp,
                      const SearchSpace& space, const Predictor& predictor, std::vector<Candidate>* out) {
  out->clear();
  if (gpus < 1) return Status::error("--gpus must be >= 1, got " + std::to_string(gpus));
  if (global_batch < 1) return Status::error("--global-batch must be >= 1, got " + std::to_string(global_batch));
  Status last_error = Status::error("no layout of " + std::to_string(gpus) + " GPUs matches the fixed choices");
  const std::vector<Recompute> recompute_modes =
      space.attention == Attention::kFused ? std::vector<Recompute>{Recompute::kNone, Recompute::kFull}
                                           : std::vector<Recompute>{Recompute::kNone, Recompute::kSelective,
                                                                    Recompute::kFull};
  for (int tp : choices(space.tp, powers_of_two_up_to(std::min(gpus, max_tp))))
    for (int pp : choices(space.pp, divisors(gpus / tp)))
    for (int cp : cp_choices(model, space, gpus / (tp * pp)))
    for (auto [cp_comm, cp_a2a] : cp_comm_choices(space, cp, tp, max_tp)) {
      if (gpus % (tp * pp * cp) != 0 || pp > model.layers) continue;
      const int dp = gpus / (tp * pp * cp);
      if (space.dp && *space.dp != dp) continue;
      if (global_batch % dp != 0) continue;
      for (int b : choices(space.micro_batch, {1, 2, 4, 8, 16})) {
        if ((global_batch / dp) % b != 0) continue;
        const int m = global_batch / dp / b;
        const std::vector<std::pair<ScheduleKind, int>> schedules = schedule_choices(model, space, pp, m);
        for (auto [kind, v] : schedules)
          // (ZeRO stages differ only with dp > 1.)
          for (int ep : choices(space.ep, expert_parallel_sizes(model, dp)))
          for (model::ExpertTp etp : choices(space.expert_tp, model.is_moe() && tp > 1
                                                                  ? std::vector{model::ExpertTp::kSplit, model::ExpertTp::kReplicated}
                                                                  : std::vector{model::ExpertTp::kSplit}))
          for (int zero : choices(space.zero, dp == 1 ? std::vector<int>{0} : std::vector<int>{0, 1, 2, 3}))
            for (bool sp : choices(space.sp, tp > 1 ? std::vector<bool>{false, true} : std::vector<bool>{false}))
              for (Recompute r : choices(space.recompute, recompute_modes))
              for (const comm::RankOrder& order : distinct_orders(space.rank_orders, tp, pp, dp)) {
                Point x{.tp = tp, .pp = pp, .dp = dp, .micro_batch = b, .global_batch = global_batch,
                        .zero = zero, .cp = cp, .cp_comm = cp_comm, .cp_a2a = cp_a2a, .sp = sp, .recompute = r,
                        .elementwise_recompute = space.elementwise_recompute.value_or(false),
                        .schedule = kind, .virtual_stages = v, .ep = ep, .expert_tp = etp};
                Candidate c;
                c.layout = make_layout(space, order, x, precision);
                if (Status s = predictor(c.layout, &c.prediction); !s.is_ok()) {
                  last_error = s;
                  continue;
                }
                out->push_back(c);
                // Element-wise recompute only trades time for memory: where the layout fits
                // without it, it cannot be faster, so it is tried only where it does not.
                if (space.elementwise_recompute || r == Recompute::kFull || c.prediction.fits()) continue;
                x.elementwise_recompute = true;
                Candidate e;
                e.layout = make_layout(space, order, x, precision);
                if (predictor(e.layout, &e.prediction).is_ok()) out->push_back(e);
              }
      }
    }
  if (out->empty()) return last_error;
  std::stable_sort(out->begin(), out->end(), [](const Candidate& a, const Candidate& b) {
    const bool fa = a.prediction.fits(), fb = b.prediction.fits();
    if (fa != fb) return fa;
    return fa ? a.prediction.step_s < b.prediction.step_s : a.over_bytes() < b.over_bytes();
  });
  return Status::ok();
}

}  // namespace meshtrain::planner
