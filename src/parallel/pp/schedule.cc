#include "parallel/pp/schedule.h"

#include <algorithm>
#include <deque>
#include <limits>
#include <utility>
#include <map>
#include <string>
#include <tuple>

namespace meshtrain::parallel::pp {
namespace {

// One compute step of a rank, before communication is woven in.
struct Compute {
  bool forward;
  int microbatch;
  int chunk;
  bool weight = false;  // a zero-bubble W (forward false)
};

Status check_args(ScheduleKind kind, int p, int m, int v) {
  if (p < 1) return Status::error("pipeline size p must be >= 1, got " + std::to_string(p));
  if (m < 1) return Status::error("micro-batch count m must be >= 1, got " + std::to_string(m));
  if (kind == ScheduleKind::kZbV) {
    if (v != 2) return Status::error("the zb-v schedule runs 2 chunks per rank (a V), got v=" + std::to_string(v));
    return Status::ok();
  }
  if (kind == ScheduleKind::k2BW && m < p)
    return Status::error("the 2bw schedule needs at least as many micro-batches as pipeline stages (m >= p), got m=" +
                         std::to_string(m) + ", p=" + std::to_string(p) +
                         ": with fewer, a third weight version would be in use");
  if (kind != ScheduleKind::kInterleaved) {
    if (v != 1) return Status::error("only the interleaved schedule has v != 1 chunks, got v=" + std::to_string(v));
    return Status::ok();
  }
  if (v < 2) return Status::error("interleaved schedule needs v >= 2 chunks per rank, got " + std::to_string(v));
  if (m % p != 0) {
    return Status::error("interleaved schedule needs m (" + std::to_string(m) +
                         ") to be a multiple of p (" + std::to_string(p) + ")");
  }
  return Status::ok();
}

// The k-th forward of the interleaved order: micro-batches go in groups of p through chunk
// 0, then the same group through chunk 1, ..., then the next group (Megatron's order).
Compute interleaved_forward(int k, int p, int v) {
  int group = k / (p * v);
  int chunk = (k / p) % v;
  return {true, group * p + k % p, chunk};
}

// Backwards visit the chunks of a group in reverse: the last stage's gradient comes first.
Compute interleaved_backward(int k, int p, int v) {
  Compute c = interleaved_forward(k, p, v);
  return {false, c.microbatch, v - 1 - c.chunk};
}

std::vector<Compute> gpipe_order(int m) {
  std::vector<Compute> order;
  for (int i = 0; i < m; ++i) order.push_back({true, i, 0});
  // Reverse order: the last micro-batch's gradient is the first to reach every stage.
  for (int i = m - 1; i >= 0; --i) order.push_back({false, i, 0});
  return order;
}

// Warmup forwards, then one forward one backward, then cooldown backwards, over a sequence
// of n forward/backward units. Both 1F1B and interleaved 1F1B are this shape.
template <typename F, typename B>
std::vector<Compute> one_f_one_b(int n, int warmup, F forward_at, B backward_at) {
  std::vector<Compute> order;
  for (int k = 0; k < warmup; ++k) order.push_back(forward_at(k));
  for (int k = 0; k < n - warmup; ++k) {
    order.push_back(forward_at(warmup + k));
    order.push_back(backward_at(k));
  }
  for (int k = n - warmup; k < n; ++k) order.push_back(backward_at(k));
  return order;
}

std::vector<Compute> compute_order(ScheduleKind kind, int p, int m, int v, int rank, const PassCosts* costs);

// PipeDream-2BW's step on rank `rank` (schedule.h): 1F1B's pairs with the forwards w ahead,
// running on into the next step's micro-batches (m..) unless this is the last step.
std::vector<Compute> two_bw_order(int p, int m, int rank, StepInRun where) {
  const int w = p - 1 - rank;
  std::vector<Compute> order;
  if (where.first)
    for (int k = 0; k < w; k++) order.push_back({true, k, 0});
  for (int k = 0; k < m; k++) {
    if (k + w < m || !where.last) order.push_back({true, k + w, 0});
    order.push_back({false, k, 0});
  }
  return order;
}

// The zero-bubble orders (schedule.h): every rank list-scheduled on the stages' costs
// (unit costs unless given). ZB-H1 keeps 1F1B's order of Fs and Bs and only places the Ws:
// a W runs whenever the next F or B cannot. ZB-V picks among its two chunks' ready work: a
// B first, then an F (the oldest micro-batch, then the stage nearer the loss), else a W.
// Events in time order: the rank with the earliest clock acts; one with nothing ready and no
// W waits until its next input arrives, or, when no rank has produced it yet, until its
// producer does. Returns every rank's order (one scheduling serves them all), or nothing if
// these costs lead the greedy choices into a dead end (the callers then use unit costs).
namespace {

constexpr double kNever = std::numeric_limits<double>::infinity();

// One rank of the zero-bubble list scheduling.
struct ZbRank {
  std::vector<int> forwards, backwards;  // per chunk: how many started (in micro-batch order)
  std::deque<std::pair<int, int>> weights;  // pending Ws (micro-batch, chunk), oldest first
  int sets = 0, limit = 0;
  std::vector<int> chunk_sets;  // per chunk: sets alive (F run, W not yet)
  std::vector<Compute> fixed;  // ZB-H1: 1F1B's order of F and B
  size_t next = 0;             // in `fixed`
  std::vector<Compute> order;
  double clock = 0;
  bool blocked = false;  // waits for an input no rank has produced yet
};

// The state of zero_bubble_orders' event loop: the ranks, and when each stage's inputs
// arrive.
class ZbScheduler {
 public:
  ZbScheduler(ScheduleKind kind, int p, int m, int v, const PassCosts* costs)
      : kind_(kind), p_(p), m_(m), v_(v), costs_(costs), ranks_(p),
        activation_(p * v, std::vector<double>(m, kNever)), gradient_(activation_) {
    for (int mb = 0; mb < m; mb++) activation_[0][mb] = 0;
    for (int r = 0; r < p; r++) {
      ranks_[r].forwards.assign(v, 0);
      ranks_[r].backwards.assign(v, 0);
      ranks_[r].chunk_sets.assign(v, 0);
      ranks_[r].limit = kind == ScheduleKind::kZbH1 ? p : 2 * p;
      if (kind == ScheduleKind::kZbH1) ranks_[r].fixed = compute_order(ScheduleKind::k1F1B, p, m, 1, r, nullptr);
    }
  }

  // Every rank's order, or nothing if the greedy choices reach a dead end.
  std::vector<std::vector<Compute>> run() {
    const size_t actions = (size_t)3 * m_ * v_;
    for (size_t round = 0;; round++) {
      if (round > 64 * actions * (size_t)p_ + 1024) return {};  // no progress: the caller falls back
      bool unfinished = false;
      const int r = earliest_rank(actions, &unfinished);
      if (!unfinished) break;
      if (r < 0) return {};  // every rank waits for another: the caller falls back
      step(r);
    }
    std::vector<std::vector<Compute>> orders;
    for (ZbRank& k : ranks_) orders.push_back(std::move(k.order));
    return orders;
  }

 private:
  double cost(int s, int pass) const {  // pass 0 F, 1 B, 2 W
    if (!costs_) return 1.0;
    return pass == 0 ? costs_->forward[s] : pass == 1 ? costs_->backward[s] : costs_->weight[s];
  }
  // A pass producing stage st's input wakes the rank that runs st.
  void wake(int st) { ranks_[rank_of_stage(kind_, p_, v_, st)].blocked = false; }

  // The unfinished, unblocked rank with the earliest clock (-1: none).
  int earliest_rank(size_t actions, bool* unfinished) const {
    int r = -1;
    for (int q = 0; q < p_; q++) {
      if (ranks_[q].order.size() == actions) continue;
      *unfinished = true;
      if (!ranks_[q].blocked && (r < 0 || ranks_[q].clock < ranks_[r].clock)) r = q;
    }
    return r;
  }

  // ZB-V: the chunk of the next B and of the next F that may run at time t; else the
  // earliest later arrival this rank could use.
  void choose_free(int r, double t, int* best_b, int* best_f, double* next_input) const {
    const ZbRank& k = ranks_[r];
    // Chunk c's next pass (its micro-batch mb = counts[c], its input there at `ready`)
    // against the best so far: the oldest micro-batch, then the stage nearer the loss.
    auto consider = [&](int c, const std::vector<int>& counts, double ready, int* best) {
      if (ready > t) return void(*next_input = std::min(*next_input, ready));
      const int mb = counts[c];
      if (*best < 0 || mb < counts[*best] ||
          (mb == counts[*best] && stage_of(kind_, p_, v_, r, c) > stage_of(kind_, p_, v_, r, *best)))
        *best = c;
    };
    for (int c = 0; c < v_; c++) {
      const int s = stage_of(kind_, p_, v_, r, c), b = k.backwards[c], f = k.forwards[c];
      if (b < f) consider(c, k.backwards, gradient_[s][b], best_b);
      // The last set is kept for the second chunk while it holds none: a cheap first chunk
      // must not take the memory the second needs to reach the loss (no gradient would
      // ever come).
      const bool reserve = c + 1 < v_ && k.chunk_sets[v_ - 1] == 0;
      if (f < m_ && k.sets < k.limit - (reserve ? 1 : 0)) consider(c, k.forwards, activation_[s][f], best_f);
    }
  }

  // ZB-H1: only the next of 1F1B's order may run.
  void choose_fixed(int r, double t, int* best_b, int* best_f, double* next_input) const {
    const ZbRank& k = ranks_[r];
    if (k.next >= k.fixed.size()) return;
    const Compute& n = k.fixed[k.next];
    const int s = stage_of(kind_, p_, v_, r, 0);
    const double ready = n.forward ? activation_[s][n.microbatch] : gradient_[s][n.microbatch];
    if (ready <= t && (!n.forward || k.sets < k.limit)) (n.forward ? *best_f : *best_b) = 0;
    else if (ready > t) *next_input = ready;
  }

  // Rank r acts at its clock: a B, else an F, else a W, else it waits for its next input
  // (until it arrives if a rank has produced it, else until its producer wakes it).
  void step(int r) {
    ZbRank& k = ranks_[r];
    const double t = k.clock;
    int best_b = -1, best_f = -1;
    double next_input = kNever;
    if (k.fixed.empty()) choose_free(r, t, &best_b, &best_f, &next_input);
    else choose_fixed(r, t, &best_b, &best_f, &next_input);
    if (best_b >= 0 || best_f >= 0) k.next++;
    if (best_b >= 0) {
      const int c = best_b, mb = k.backwards[c]++, s = stage_of(kind_, p_, v_, r, c);
      k.clock = t + cost(s, 1);
      if (s > 0) gradient_[s - 1][mb] = k.clock, wake(s - 1);
      k.weights.push_back({mb, c});
      k.order.push_back({false, mb, c});
    } else if (best_f >= 0) {
      const int c = best_f, mb = k.forwards[c]++, s = stage_of(kind_, p_, v_, r, c);
      k.clock = t + cost(s, 0);
      if (s + 1 < p_ * v_) activation_[s + 1][mb] = k.clock, wake(s + 1);
      else gradient_[s][mb] = k.clock;  // the loss's gradient, once this F ends
      k.sets++, k.chunk_sets[c]++;
      k.order.push_back({true, mb, c});
    } else if (!k.weights.empty()) {
      const auto [mb, c] = k.weights.front();
      k.weights.pop_front();
      k.sets--, k.chunk_sets[c]--;
      k.clock = t + cost(stage_of(kind_, p_, v_, r, c), 2);
      k.order.push_back({false, mb, c, true});
    } else if (next_input < kNever) {
      k.clock = next_input;
    } else {
      k.blocked = true;
    }
  }

  ScheduleKind kind_;
  int p_, m_, v_;
  const PassCosts* costs_;
  std::vector<ZbRank> ranks_;
  // When stage s's input activation (gradient) of micro-batch mb is there.
  std::vector<std::vector<double>> activation_, gradient_;
};

}  // namespace

// The list scheduling is a pure function of its inputs, and the planner's search asks it
// again and again with the same ones (layouts that differ only in what the passes' costs do
// not see: ZeRO stage, rank order); it keeps this thread's last answers.
std::vector<std::vector<Compute>> zero_bubble_orders(ScheduleKind kind, int p, int m, int v, const PassCosts* costs) {
  using Key = std::tuple<int, int, int, int, bool, std::vector<double>, std::vector<double>, std::vector<double>>;
  thread_local std::map<Key, std::vector<std::vector<Compute>>> cache;
  Key key{(int)kind, p, m, v, costs != nullptr, costs ? costs->forward : std::vector<double>{},
          costs ? costs->backward : std::vector<double>{}, costs ? costs->weight : std::vector<double>{}};
  if (auto hit = cache.find(key); hit != cache.end()) return hit->second;
  if (cache.size() >= 512) cache.clear();
  return cache[std::move(key)] = ZbScheduler(kind, p, m, v, costs).run();
}

std::vector<Compute> compute_order(ScheduleKind kind, int p, int m, int v, int rank, const PassCosts* costs) {
  switch (kind) {
    case ScheduleKind::kZbH1:
    case ScheduleKind::kZbV: {
      std::vector<std::vector<Compute>> orders = zero_bubble_orders(kind, p, m, v, costs);
      if (orders.empty()) orders = zero_bubble_orders(kind, p, m, v, nullptr);
      return orders[rank];
    }
    case ScheduleKind::kGpipe:
      return gpipe_order(m);
    case ScheduleKind::k2BW:  // one step alone is 1F1B (the steady state: two_bw_order)
    case ScheduleKind::k1F1B: {
      // A rank needs p - r - 1 forwards in flight before the first gradient can reach it.
      int warmup = std::min(p - rank - 1, m);
      return one_f_one_b(m, warmup, [](int k) { return Compute{true, k, 0}; },
                         [](int k) { return Compute{false, k, 0}; });
    }
    case ScheduleKind::kInterleaved: {
      int n = m * v;
      int warmup = std::min((p - rank - 1) * 2 + (v - 1) * p, n);
      return one_f_one_b(n, warmup, [=](int k) { return interleaved_forward(k, p, v); },
                         [=](int k) { return interleaved_backward(k, p, v); });
    }
  }
  return {};
}

// Appends one compute step with the receive before it and the send after it.
void append_with_comm(ScheduleKind kind, const Compute& c, int p, int v, int rank, std::vector<Action>* out) {
  const int stage = stage_of(kind, p, v, rank, c.chunk), last = p * v - 1;
  if (c.weight) return out->push_back({ActionKind::kBackwardWeight, c.microbatch, c.chunk, -1});
  const int prev_rank = stage > 0 ? rank_of_stage(kind, p, v, stage - 1) : -1;
  const int next_rank = stage < last ? rank_of_stage(kind, p, v, stage + 1) : -1;
  // Neighbouring stages on the same rank (p == 1 interleaved, ZB-V's turn) hand tensors
  // over without messages.
  const bool prev_remote = stage > 0 && prev_rank != rank;
  const bool next_remote = stage < last && next_rank != rank;
  if (c.forward) {
    if (prev_remote) out->push_back({ActionKind::kRecvActivation, c.microbatch, c.chunk, prev_rank});
    out->push_back({ActionKind::kForward, c.microbatch, c.chunk, -1});
    if (next_remote) out->push_back({ActionKind::kSendActivation, c.microbatch, c.chunk, next_rank});
  } else {
    if (next_remote) out->push_back({ActionKind::kRecvGrad, c.microbatch, c.chunk, next_rank});
    out->push_back({ActionKind::kBackward, c.microbatch, c.chunk, -1});
    if (prev_remote) out->push_back({ActionKind::kSendGrad, c.microbatch, c.chunk, prev_rank});
  }
}

}  // namespace

const char* schedule_name(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kGpipe: return "gpipe";
    case ScheduleKind::k1F1B: return "1f1b";
    case ScheduleKind::kInterleaved: return "interleaved";
    case ScheduleKind::kZbH1: return "zb-h1";
    case ScheduleKind::kZbV: return "zb-v";
    case ScheduleKind::k2BW: return "2bw";
  }
  return "?";
}

bool splits_backward(ScheduleKind kind) { return kind == ScheduleKind::kZbH1 || kind == ScheduleKind::kZbV; }
bool never_flushes(ScheduleKind kind) { return kind == ScheduleKind::k2BW; }

int stage_of(ScheduleKind kind, int p, int v, int rank, int chunk) {
  if (kind == ScheduleKind::kZbV) return chunk == 0 ? rank : 2 * p - 1 - rank;
  return chunk * p + rank;
}

int rank_of_stage(ScheduleKind kind, int p, int v, int stage) {
  if (kind == ScheduleKind::kZbV) return stage < p ? stage : 2 * p - 1 - stage;
  return stage % p;
}

Status parse_schedule_kind(const std::string& name, ScheduleKind* out) {
  for (ScheduleKind k : {ScheduleKind::kGpipe, ScheduleKind::k1F1B, ScheduleKind::kInterleaved, ScheduleKind::kZbH1,
                         ScheduleKind::kZbV, ScheduleKind::k2BW}) {
    if (name == schedule_name(k)) {
      *out = k;
      return Status::ok();
    }
  }
  return Status::error("unknown schedule '" + name + "' (gpipe, 1f1b, interleaved, zb-h1, zb-v or 2bw)");
}

Status make_schedule(ScheduleKind kind, int p, int m, int v, int rank, std::vector<Action>* out,
                     const PassCosts* costs, StepInRun where) {
  RETURN_IF_ERROR(check_args(kind, p, m, v));
  if (rank < 0 || rank >= p) {
    return Status::error("rank " + std::to_string(rank) + " out of range [0, " + std::to_string(p) + ")");
  }
  if (costs) {
    const size_t stages = (size_t)p * v;
    if (costs->forward.size() != stages || costs->backward.size() != stages || costs->weight.size() != stages)
      return Status::error("pass costs: one per stage (p x v) for the forward, B and W");
    for (size_t s = 0; s < stages; s++)
      if (!(costs->forward[s] > 0) || !(costs->backward[s] > 0) || !(costs->weight[s] >= 0))
        return Status::error("pass costs must be > 0 (a W's >= 0)");
  }
  out->clear();
  const std::vector<Compute> order =
      never_flushes(kind) ? two_bw_order(p, m, rank, where) : compute_order(kind, p, m, v, rank, costs);
  for (const Compute& c : order) append_with_comm(kind, c, p, v, rank, out);
  return Status::ok();
}

namespace {

// Every rank's actions, as make_schedule gives them (arguments already checked); a
// zero-bubble schedule's scheduled once for all ranks.
std::vector<std::vector<Action>> all_schedules(ScheduleKind kind, int p, int m, int v, const PassCosts* costs) {
  std::vector<std::vector<Action>> out(p);
  if (never_flushes(kind)) {  // the steady state
    for (int r = 0; r < p; r++)
      for (const Compute& c : two_bw_order(p, m, r, {false, false})) append_with_comm(kind, c, p, v, r, &out[r]);
    return out;
  }
  std::vector<std::vector<Compute>> orders;
  if (splits_backward(kind)) orders = zero_bubble_orders(kind, p, m, v, costs);
  if (splits_backward(kind) && orders.empty()) orders = zero_bubble_orders(kind, p, m, v, nullptr);
  for (int r = 0; r < p; r++)
    for (const Compute& c : splits_backward(kind) ? orders[r] : compute_order(kind, p, m, v, r, costs))
      append_with_comm(kind, c, p, v, r, &out[r]);
  return out;
}

}  // namespace

namespace {

// A posted send: when its tensor is ready, and which (micro-batch, stage) it is for.
struct Message {
  double ready;
  int microbatch;
  int to_stage;
};

// The sends posted on one channel (from rank, to rank, carries gradients), oldest first: FIFO
// per channel, as in the executor. A vector read from `head` on (the planner simulates many
// schedules: no allocation per message).
struct Channel {
  std::vector<Message> messages;
  size_t head = 0;
  bool empty() const { return head == messages.size(); }
};

// Every channel between p ranks.
struct Channels {
  explicit Channels(int p) : p(p), all((size_t)p * p * 2) {}
  Channel& at(int from, int to, bool grad) { return all[((size_t)from * p + to) * 2 + grad]; }
  int p;
  std::vector<Channel> all;
};

struct RankState {
  std::vector<Action> actions;
  size_t next = 0;
  double clock = 0;
  double busy = 0;
  int in_flight = 0;
  int peak = 0;
  int pending_weights = 0, peak_pending_weights = 0;
  std::vector<SimSpan> spans;
};

bool is_send(ActionKind k) { return k == ActionKind::kSendActivation || k == ActionKind::kSendGrad; }
bool is_recv(ActionKind k) { return k == ActionKind::kRecvActivation || k == ActionKind::kRecvGrad; }
bool carries_grad(ActionKind k) { return k == ActionKind::kSendGrad || k == ActionKind::kRecvGrad; }

std::string describe(int rank, const Action& a) {
  return "rank " + std::to_string(rank) + " micro-batch " + std::to_string(a.microbatch) +
         " chunk " + std::to_string(a.chunk);
}

// Runs rank r's actions until it finishes or blocks on a receive with nothing to take.
// Returns whether it advanced; *error is set on a mismatched pairing.
bool advance(ScheduleKind kind, int r, int p, int v, const std::vector<double>& tf, const std::vector<double>& tb,
             const std::vector<double>& tw, RankState* s, Channels* channels, Status* error) {
  bool moved = false;
  const bool split = splits_backward(kind);
  while (s->next < s->actions.size()) {
    const Action& a = s->actions[s->next];
    const int stage = stage_of(kind, p, v, r, a.chunk);
    if (is_recv(a.kind)) {
      Channel& queue = channels->at(a.peer, r, carries_grad(a.kind));
      if (queue.empty()) return moved;
      const Message msg = queue.messages[queue.head++];
      if (msg.microbatch != a.microbatch || msg.to_stage != stage) {
        *error = Status::error("receive pairs with a send for micro-batch " + std::to_string(msg.microbatch) +
                               " stage " + std::to_string(msg.to_stage) + " at " + describe(r, a));
        return false;
      }
      s->clock = std::max(s->clock, msg.ready);
    } else if (is_send(a.kind)) {
      int to_stage = carries_grad(a.kind) ? stage - 1 : stage + 1;
      channels->at(r, a.peer, carries_grad(a.kind)).messages.push_back({s->clock, a.microbatch, to_stage});
    } else {
      const double cost = a.kind == ActionKind::kForward          ? tf[stage]
                          : a.kind == ActionKind::kBackwardWeight ? tw[stage]
                          : split                                 ? tb[stage]
                                                                  : tb[stage] + tw[stage];
      s->spans.push_back({a.kind, a.microbatch, a.chunk, s->clock, s->clock + cost});
      s->clock += cost;
      s->busy += cost;
      // A set lives from the forward to the backward, or to W when the backward is split.
      if (a.kind == ActionKind::kForward) s->in_flight++;
      else if (a.kind == (split ? ActionKind::kBackwardWeight : ActionKind::kBackward)) s->in_flight--;
      if (split && a.kind == ActionKind::kBackward) s->pending_weights++;
      if (a.kind == ActionKind::kBackwardWeight) s->pending_weights--;
      s->peak_pending_weights = std::max(s->peak_pending_weights, s->pending_weights);
      s->peak = std::max(s->peak, s->in_flight);
    }
    ++s->next;
    moved = true;
  }
  return moved;
}

}  // namespace

Status simulate(ScheduleKind kind, int p, int m, int v, double tf, double tb, SimResult* out) {
  RETURN_IF_ERROR(check_args(kind, p, m, v));
  if (!(tf >= 0) || !(tb >= 0)) return Status::error("costs tf and tb must be >= 0");
  const size_t stages = (size_t)p * v;
  return simulate(kind, p, m, v, std::vector<double>(stages, tf), std::vector<double>(stages, tb), out);
}

Status simulate(ScheduleKind kind, int p, int m, int v, const std::vector<double>& tf,
                const std::vector<double>& tb, SimResult* out) {
  // The backward's two halves at equal cost: its input-gradient and weight-gradient GEMMs.
  std::vector<double> half(tb);
  for (double& t : half) t /= 2;
  return simulate(kind, p, m, v, tf, half, half, out);
}

Status simulate(ScheduleKind kind, int p, int m, int v, const std::vector<double>& tf, const std::vector<double>& tb,
                const std::vector<double>& tw, SimResult* out) {
  RETURN_IF_ERROR(check_args(kind, p, m, v));
  const size_t stages = (size_t)p * v;
  if (tf.size() != stages || tb.size() != stages || tw.size() != stages)
    return Status::error("stage costs: " + std::to_string(tf.size()) + " forward, " + std::to_string(tb.size()) +
                         " input-gradient and " + std::to_string(tw.size()) + " weight-gradient given, the pipeline "
                         "has " + std::to_string(stages) + " stages (p x v)");
  for (size_t i = 0; i < stages; i++)
    if (!(tf[i] >= 0) || !(tb[i] >= 0) || !(tw[i] >= 0)) return Status::error("stage costs must be >= 0");
  std::vector<RankState> ranks(p);
  // A zero-bubble schedule's lists placed for these costs, as the executor places them for
  // the costs it measured (when they can be: every F and B takes time).
  const PassCosts costs{tf, tb, tw};
  bool timed = splits_backward(kind);
  for (size_t i = 0; i < stages; i++) timed = timed && tf[i] > 0 && tb[i] > 0;
  std::vector<std::vector<Action>> actions = all_schedules(kind, p, m, v, timed ? &costs : nullptr);
  for (int r = 0; r < p; ++r) {
    ranks[r].actions = std::move(actions[r]);
    ranks[r].spans.reserve((size_t)(splits_backward(kind) ? 3 : 2) * m * v);
  }
  Channels channels(p);
  if (never_flushes(kind))  // 2BW's steady state: what the step before left in flight
    for (int r = 0; r < p; ++r) {
      const int w = p - 1 - r;  // forwards carried in, their sets alive
      ranks[r].in_flight = ranks[r].peak = w;
      if (w > 0) channels.at(r, r + 1, false).messages.push_back({0.0, w - 1, r + 1});  // the next rank's first input
    }

  // Times depend only on dependencies, not on the order ranks are visited, so sweeping the
  // ranks until none moves gives the exact event times; stopping early means deadlock.
  Status error;
  for (bool moved = true; moved;) {
    moved = false;
    for (int r = 0; r < p; ++r) {
      moved |= advance(kind, r, p, v, tf, tb, tw, &ranks[r], &channels, &error);
      RETURN_IF_ERROR(error);
    }
  }
  for (int r = 0; r < p; ++r) {
    const RankState& s = ranks[r];
    if (s.next < s.actions.size()) {
      return Status::error("deadlock: " + describe(r, s.actions[s.next]) + " waits on a receive from rank " +
                           std::to_string(s.actions[s.next].peer) + " that is never sent");
    }
    // Every pass of every (micro-batch, chunk) ran: a list missing one is a bug, said loudly.
    if (s.spans.size() != (size_t)(splits_backward(kind) ? 3 : 2) * m * v)
      return Status::error("rank " + std::to_string(r) + "'s schedule has " + std::to_string(s.spans.size()) +
                           " passes, not one F, B" + (splits_backward(kind) ? " and W" : "") + " per micro-batch and chunk");
  }

  *out = SimResult();
  double total_busy = 0;
  for (const RankState& s : ranks) {
    out->makespan = std::max(out->makespan, s.clock);
    out->busy.push_back(s.busy);
    out->peak_in_flight.push_back(s.peak);
    out->peak_pending_weights.push_back(s.peak_pending_weights);
    out->spans.push_back(s.spans);
    total_busy += s.busy;
  }
  double capacity = p * out->makespan;
  out->bubble_fraction = capacity > 0 ? (capacity - total_busy) / capacity : 0;
  return Status::ok();
}

Status explain_bubble(ScheduleKind kind, int p, int m, int v, const PassCosts& stages, double measured,
                      BubbleParts* out) {
  const size_t S = stages.forward.size();
  std::vector<double> mean(3, 0.0);
  for (size_t s = 0; s < S; s++)
    mean[0] += stages.forward[s] / S, mean[1] += stages.backward[s] / S, mean[2] += stages.weight[s] / S;
  SimResult even, own;
  RETURN_IF_ERROR(simulate(kind, p, m, v, std::vector<double>(S, mean[0]), std::vector<double>(S, mean[1]),
                           std::vector<double>(S, mean[2]), &even));
  RETURN_IF_ERROR(simulate(kind, p, m, v, stages.forward, stages.backward, stages.weight, &own));
  *out = {even.bubble_fraction, own.bubble_fraction - even.bubble_fraction, measured - own.bubble_fraction};
  return Status::ok();
}

}  // namespace meshtrain::parallel::pp
