#include "parallel/pp/schedule.h"

#include <algorithm>
#include <deque>
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
};

Status check_args(ScheduleKind kind, int p, int m, int v) {
  if (p < 1) return Status::error("pipeline size p must be >= 1, got " + std::to_string(p));
  if (m < 1) return Status::error("micro-batch count m must be >= 1, got " + std::to_string(m));
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

std::vector<Compute> compute_order(ScheduleKind kind, int p, int m, int v, int rank) {
  switch (kind) {
    case ScheduleKind::kGpipe:
      return gpipe_order(m);
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
void append_with_comm(const Compute& c, int p, int v, int rank, std::vector<Action>* out) {
  int stage = c.chunk * p + rank;
  int last = p * v - 1;
  int prev_rank = (rank + p - 1) % p;
  int next_rank = (rank + 1) % p;
  // Neighbouring stages on the same rank (p == 1) hand tensors over without messages.
  bool prev_remote = stage > 0 && prev_rank != rank;
  bool next_remote = stage < last && next_rank != rank;
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
  }
  return "?";
}

Status parse_schedule_kind(const std::string& name, ScheduleKind* out) {
  for (ScheduleKind k : {ScheduleKind::kGpipe, ScheduleKind::k1F1B, ScheduleKind::kInterleaved}) {
    if (name == schedule_name(k)) {
      *out = k;
      return Status::ok();
    }
  }
  return Status::error("unknown schedule '" + name + "' (gpipe, 1f1b or interleaved)");
}

Status make_schedule(ScheduleKind kind, int p, int m, int v, int rank, std::vector<Action>* out) {
  RETURN_IF_ERROR(check_args(kind, p, m, v));
  if (rank < 0 || rank >= p) {
    return Status::error("rank " + std::to_string(rank) + " out of range [0, " + std::to_string(p) + ")");
  }
  out->clear();
  for (const Compute& c : compute_order(kind, p, m, v, rank)) append_with_comm(c, p, v, rank, out);
  return Status::ok();
}

namespace {

// A posted send: when its tensor is ready, and which (micro-batch, stage) it is for.
struct Message {
  double ready;
  int microbatch;
  int to_stage;
};

// Channel key: (from rank, to rank, carries gradients). FIFO per key, as in the executor.
using ChannelKey = std::tuple<int, int, bool>;

struct RankState {
  std::vector<Action> actions;
  size_t next = 0;
  double clock = 0;
  double busy = 0;
  int in_flight = 0;
  int peak = 0;
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
bool advance(int r, int p, const std::vector<double>& tf, const std::vector<double>& tb, RankState* s,
             std::map<ChannelKey, std::deque<Message>>* channels, Status* error) {
  bool moved = false;
  while (s->next < s->actions.size()) {
    const Action& a = s->actions[s->next];
    int stage = a.chunk * p + r;
    if (is_recv(a.kind)) {
      auto& queue = (*channels)[{a.peer, r, carries_grad(a.kind)}];
      if (queue.empty()) return moved;
      Message msg = queue.front();
      queue.pop_front();
      if (msg.microbatch != a.microbatch || msg.to_stage != stage) {
        *error = Status::error("receive pairs with a send for micro-batch " + std::to_string(msg.microbatch) +
                               " stage " + std::to_string(msg.to_stage) + " at " + describe(r, a));
        return false;
      }
      s->clock = std::max(s->clock, msg.ready);
    } else if (is_send(a.kind)) {
      int to_stage = carries_grad(a.kind) ? stage - 1 : stage + 1;
      (*channels)[{r, a.peer, carries_grad(a.kind)}].push_back({s->clock, a.microbatch, to_stage});
    } else {
      double cost = a.kind == ActionKind::kForward ? tf[stage] : tb[stage];
      s->spans.push_back({a.kind, a.microbatch, a.chunk, s->clock, s->clock + cost});
      s->clock += cost;
      s->busy += cost;
      s->in_flight += a.kind == ActionKind::kForward ? 1 : -1;
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
  RETURN_IF_ERROR(check_args(kind, p, m, v));
  const size_t stages = (size_t)p * v;
  if (tf.size() != stages || tb.size() != stages)
    return Status::error("stage costs: " + std::to_string(tf.size()) + " forward and " + std::to_string(tb.size()) +
                         " backward given, the pipeline has " + std::to_string(stages) + " stages (p x v)");
  for (size_t i = 0; i < stages; i++)
    if (!(tf[i] >= 0) || !(tb[i] >= 0)) return Status::error("stage costs must be >= 0");
  std::vector<RankState> ranks(p);
  for (int r = 0; r < p; ++r) RETURN_IF_ERROR(make_schedule(kind, p, m, v, r, &ranks[r].actions));

  // Times depend only on dependencies, not on the order ranks are visited, so sweeping the
  // ranks until none moves gives the exact event times; stopping early means deadlock.
  std::map<ChannelKey, std::deque<Message>> channels;
  Status error;
  for (bool moved = true; moved;) {
    moved = false;
    for (int r = 0; r < p; ++r) {
      moved |= advance(r, p, tf, tb, &ranks[r], &channels, &error);
      RETURN_IF_ERROR(error);
    }
  }
  for (int r = 0; r < p; ++r) {
    const RankState& s = ranks[r];
    if (s.next < s.actions.size()) {
      return Status::error("deadlock: " + describe(r, s.actions[s.next]) + " waits on a receive from rank " +
                           std::to_string(s.actions[s.next].peer) + " that is never sent");
    }
  }

  *out = SimResult();
  double total_busy = 0;
  for (const RankState& s : ranks) {
    out->makespan = std::max(out->makespan, s.clock);
    out->busy.push_back(s.busy);
    out->peak_in_flight.push_back(s.peak);
    out->spans.push_back(s.spans);
    total_busy += s.busy;
  }
  double capacity = p * out->makespan;
  out->bubble_fraction = capacity > 0 ? (capacity - total_busy) / capacity : 0;
  return Status::ok();
}

}  // namespace meshtrain::parallel::pp
