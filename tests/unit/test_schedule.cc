// Pipeline schedules (parallel/pp/schedule.h): structural invariants of every rank's action
// list, and the simulator's bubble and activation-memory numbers against closed forms.
//
//   ScheduleTest.EveryComputeExactlyOncePerRank   each (mb, chunk) forward and backward once
//   ScheduleTest.BackwardFollowsForward           on every rank, B(mb, c) after F(mb, c)
//   ScheduleTest.CommunicationBracketsCompute     recv right before / send right after compute,
//                                                 exactly where the stage has a neighbour
//   ScheduleTest.SendsAndRecvsPairAcrossRanks     per (from, to, direction) the k-th send and
//                                                 the k-th receive name the same mb and stage
//   ScheduleTest.WarmupLengths                    1F1B: min(p-r-1, m); interleaved:
//                                                 min(2(p-r-1) + (v-1)p, mv) leading forwards
//   SimulateTest.BubbleIsNarayanan                unit costs (tf=1, tb=2): (p-1)/(vm+p-1), v=1
//                                                 for GPipe and 1F1B; also makespan and busy
//   SimulateTest.BubbleHoldsForOtherCostRatios  same fraction, all kinds, at tf:tb = 1:1, 1:3, 2:1
//   SimulateTest.SpansFollowTheSchedule         per rank: the compute actions in order, back to
//                                                 back or later, tf/tb long, summing to busy
//   SimulateTest.PeakInFlight                     GPipe m; 1F1B min(p-r, m); interleaved
//                                                 min(warmup_r + 1, mv) chunk activation sets
//   ScheduleErrors.InvalidArgumentsAreRejected    p, m, v, m % p, rank, costs
//
// Expected numbers come from the formulas here, never from the engine.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "parallel/pp/schedule.h"

namespace meshtrain::parallel::pp::test_schedule {
namespace {

struct Config {
  ScheduleKind kind;
  int p, m, v;
  std::string name() const {
    const char* k = kind == ScheduleKind::kGpipe ? "gpipe" : kind == ScheduleKind::k1F1B ? "1f1b" : "interleaved";
    return std::string(k) + " p=" + std::to_string(p) + " m=" + std::to_string(m) + " v=" + std::to_string(v);
  }
};

// The brief's grid: p in {1,2,4}, m in {1,2,4,8,16}; interleaved only m % p == 0, v in {2,3}.
std::vector<Config> all_configs() {
  std::vector<Config> configs;
  for (int p : {1, 2, 4}) {
    for (int m : {1, 2, 4, 8, 16}) {
      configs.push_back({ScheduleKind::kGpipe, p, m, 1});
      configs.push_back({ScheduleKind::k1F1B, p, m, 1});
      if (m % p != 0) continue;
      for (int v : {2, 3}) configs.push_back({ScheduleKind::kInterleaved, p, m, v});
    }
  }
  return configs;
}

std::vector<Action> schedule_of(const Config& c, int rank) {
  std::vector<Action> actions;
  Status s = make_schedule(c.kind, c.p, c.m, c.v, rank, &actions);
  EXPECT_TRUE(s.is_ok()) << c.name() << ": " << s.message();
  return actions;
}

bool is_compute(const Action& a) { return a.kind == ActionKind::kForward || a.kind == ActionKind::kBackward; }

int warmup_of(const Config& c, int r) {
  if (c.kind == ScheduleKind::kGpipe) return c.m;
  if (c.kind == ScheduleKind::k1F1B) return std::min(c.p - r - 1, c.m);
  return std::min(2 * (c.p - r - 1) + (c.v - 1) * c.p, c.m * c.v);
}

TEST(ScheduleTest, EveryComputeExactlyOncePerRank) {
  for (const Config& c : all_configs()) {
    for (int r = 0; r < c.p; ++r) {
      std::map<std::tuple<ActionKind, int, int>, int> count;
      for (const Action& a : schedule_of(c, r)) {
        if (!is_compute(a)) continue;
        EXPECT_EQ(a.peer, -1) << c.name();
        ++count[{a.kind, a.microbatch, a.chunk}];
      }
      EXPECT_EQ(count.size(), size_t(2 * c.m * c.v)) << c.name() << " rank " << r;
      for (int mb = 0; mb < c.m; ++mb) {
        for (int ch = 0; ch < c.v; ++ch) {
          EXPECT_EQ((count[{ActionKind::kForward, mb, ch}]), 1) << c.name() << " rank " << r;
          EXPECT_EQ((count[{ActionKind::kBackward, mb, ch}]), 1) << c.name() << " rank " << r;
        }
      }
    }
  }
}

TEST(ScheduleTest, BackwardFollowsForward) {
  for (const Config& c : all_configs()) {
    for (int r = 0; r < c.p; ++r) {
      std::set<std::pair<int, int>> forwarded;
      for (const Action& a : schedule_of(c, r)) {
        if (a.kind == ActionKind::kForward) forwarded.insert({a.microbatch, a.chunk});
        if (a.kind == ActionKind::kBackward) {
          EXPECT_TRUE(forwarded.count({a.microbatch, a.chunk}))
              << c.name() << " rank " << r << " mb " << a.microbatch << " chunk " << a.chunk;
        }
      }
    }
  }
}

// Walks the list and checks each compute's neighbours: the receive (if any) immediately
// before it and the send (if any) immediately after, with the right peer and identity.
TEST(ScheduleTest, CommunicationBracketsCompute) {
  for (const Config& c : all_configs()) {
    int last = c.p * c.v - 1;
    for (int r = 0; r < c.p; ++r) {
      std::vector<Action> actions = schedule_of(c, r);
      int prev_rank = (r + c.p - 1) % c.p, next_rank = (r + 1) % c.p;
      size_t comm_seen = 0, comm_expected = 0;
      for (size_t i = 0; i < actions.size(); ++i) {
        const Action& a = actions[i];
        if (!is_compute(a)) {
          ++comm_seen;
          continue;
        }
        int stage = a.chunk * c.p + r;
        bool fwd = a.kind == ActionKind::kForward;
        // Same-rank neighbours (p == 1) exchange nothing.
        bool has_before = fwd ? stage > 0 && prev_rank != r : stage < last && next_rank != r;
        bool has_after = fwd ? stage < last && next_rank != r : stage > 0 && prev_rank != r;
        if (has_before) {
          ASSERT_GT(i, 0u) << c.name();
          const Action& b = actions[i - 1];
          EXPECT_EQ(b.kind, fwd ? ActionKind::kRecvActivation : ActionKind::kRecvGrad) << c.name();
          EXPECT_EQ(b.peer, fwd ? prev_rank : next_rank) << c.name();
          EXPECT_EQ(b.microbatch, a.microbatch) << c.name();
          EXPECT_EQ(b.chunk, a.chunk) << c.name();
        }
        if (has_after) {
          ASSERT_LT(i + 1, actions.size()) << c.name();
          const Action& n = actions[i + 1];
          EXPECT_EQ(n.kind, fwd ? ActionKind::kSendActivation : ActionKind::kSendGrad) << c.name();
          EXPECT_EQ(n.peer, fwd ? next_rank : prev_rank) << c.name();
          EXPECT_EQ(n.microbatch, a.microbatch) << c.name();
          EXPECT_EQ(n.chunk, a.chunk) << c.name();
        }
        comm_expected += has_before + has_after;
      }
      EXPECT_EQ(comm_seen, comm_expected) << c.name() << " rank " << r;
    }
  }
}

TEST(ScheduleTest, SendsAndRecvsPairAcrossRanks) {
  for (const Config& c : all_configs()) {
    // (from, to, grad) -> ordered (micro-batch, destination stage) of sends and receives.
    std::map<std::tuple<int, int, bool>, std::vector<std::pair<int, int>>> sent, received;
    for (int r = 0; r < c.p; ++r) {
      for (const Action& a : schedule_of(c, r)) {
        int stage = a.chunk * c.p + r;
        switch (a.kind) {
          case ActionKind::kSendActivation: sent[{r, a.peer, false}].push_back({a.microbatch, stage + 1}); break;
          case ActionKind::kSendGrad: sent[{r, a.peer, true}].push_back({a.microbatch, stage - 1}); break;
          case ActionKind::kRecvActivation: received[{a.peer, r, false}].push_back({a.microbatch, stage}); break;
          case ActionKind::kRecvGrad: received[{a.peer, r, true}].push_back({a.microbatch, stage}); break;
          default: break;
        }
      }
    }
    EXPECT_EQ(sent, received) << c.name();
    // Every boundary between stages on different ranks carries m activations and m grads.
    size_t messages = 0;
    for (const auto& [key, list] : sent) messages += list.size();
    size_t boundaries = c.p == 1 ? 0 : size_t(c.p * c.v - 1);
    EXPECT_EQ(messages, 2 * boundaries * c.m) << c.name();
  }
}

TEST(ScheduleTest, WarmupLengths) {
  for (const Config& c : all_configs()) {
    if (c.kind == ScheduleKind::kGpipe) continue;
    for (int r = 0; r < c.p; ++r) {
      std::vector<Action> computes;
      for (const Action& a : schedule_of(c, r)) {
        if (is_compute(a)) computes.push_back(a);
      }
      int leading = 0;
      while (leading < int(computes.size()) && computes[leading].kind == ActionKind::kForward) ++leading;
      // Warmup forwards, then the first steady-state forward (if any forward is left).
      int expected = std::min(warmup_of(c, r) + 1, c.m * c.v);
      EXPECT_EQ(leading, expected) << c.name() << " rank " << r;
    }
  }
}

double narayanan_bubble(const Config& c) { return double(c.p - 1) / (c.v * c.m + c.p - 1); }

TEST(SimulateTest, BubbleIsNarayanan) {
  const double tf = 1, tb = 2;
  for (const Config& c : all_configs()) {
    SimResult sim;
    Status s = simulate(c.kind, c.p, c.m, c.v, tf, tb, &sim);
    ASSERT_TRUE(s.is_ok()) << c.name() << ": " << s.message();
    // Each rank computes v*m chunk forwards and backwards; the pipeline fill and drain add
    // p - 1 (forward + backward) slots of one chunk, so the step is (vm + p - 1)(tf + tb).
    EXPECT_DOUBLE_EQ(sim.makespan, (c.v * c.m + c.p - 1) * (tf + tb)) << c.name();
    ASSERT_EQ(sim.busy.size(), size_t(c.p));
    for (double b : sim.busy) EXPECT_DOUBLE_EQ(b, c.v * c.m * (tf + tb)) << c.name();
    EXPECT_NEAR(sim.bubble_fraction, narayanan_bubble(c), 1e-12) << c.name();
  }
}

TEST(SimulateTest, BubbleHoldsForOtherCostRatios) {
  for (auto [tf, tb] : {std::pair{1.0, 1.0}, {1.0, 3.0}, {2.0, 1.0}}) {
    for (const Config& c : all_configs()) {
      SimResult sim;
      ASSERT_TRUE(simulate(c.kind, c.p, c.m, c.v, tf, tb, &sim).is_ok()) << c.name();
      EXPECT_NEAR(sim.bubble_fraction, narayanan_bubble(c), 1e-12) << c.name() << " tf " << tf << " tb " << tb;
    }
  }
}

TEST(SimulateTest, SpansFollowTheSchedule) {
  const double tf = 1, tb = 2;
  for (const Config& c : all_configs()) {
    SimResult sim;
    ASSERT_TRUE(simulate(c.kind, c.p, c.m, c.v, tf, tb, &sim).is_ok()) << c.name();
    ASSERT_EQ(sim.spans.size(), size_t(c.p)) << c.name();
    for (int r = 0; r < c.p; ++r) {
      std::vector<Action> compute;
      for (const Action& a : schedule_of(c, r))
        if (is_compute(a)) compute.push_back(a);
      const auto& spans = sim.spans[r];
      ASSERT_EQ(spans.size(), compute.size()) << c.name();
      double busy = 0, previous_end = 0;
      for (size_t i = 0; i < spans.size(); ++i) {
        EXPECT_EQ(spans[i].kind, compute[i].kind) << c.name();
        EXPECT_EQ(spans[i].microbatch, compute[i].microbatch) << c.name();
        EXPECT_EQ(spans[i].chunk, compute[i].chunk) << c.name();
        EXPECT_GE(spans[i].start, previous_end) << c.name();
        EXPECT_DOUBLE_EQ(spans[i].end - spans[i].start, spans[i].kind == ActionKind::kForward ? tf : tb);
        busy += spans[i].end - spans[i].start;
        previous_end = spans[i].end;
      }
      EXPECT_DOUBLE_EQ(busy, sim.busy[r]) << c.name();
      EXPECT_LE(previous_end, sim.makespan) << c.name();
    }
  }
}

TEST(SimulateTest, PeakInFlight) {
  for (const Config& c : all_configs()) {
    SimResult sim;
    ASSERT_TRUE(simulate(c.kind, c.p, c.m, c.v, 1, 2, &sim).is_ok()) << c.name();
    ASSERT_EQ(sim.peak_in_flight.size(), size_t(c.p));
    for (int r = 0; r < c.p; ++r) {
      int expected = 0;
      switch (c.kind) {
        case ScheduleKind::kGpipe: expected = c.m; break;
        case ScheduleKind::k1F1B: expected = std::min(c.p - r, c.m); break;
        // Warmup forwards plus the steady state's one extra, counted in chunk activation sets.
        case ScheduleKind::kInterleaved: expected = std::min(warmup_of(c, r) + 1, c.m * c.v); break;
        case ScheduleKind::kZbH1:
        case ScheduleKind::kZbV: FAIL() << "zero-bubble schedules: ZeroBubbleTest";
        case ScheduleKind::k2BW: FAIL() << "2bw: TwoBwTest";
      }
      EXPECT_EQ(sim.peak_in_flight[r], expected) << c.name() << " rank " << r;
    }
  }
  // Concrete values of the interleaved case, p = 4, m = 8, v = 2: rank 0 keeps 11 chunk
  // sets = 5.5 micro-batches of its layers, against 4 for plain 1F1B.
  SimResult sim;
  ASSERT_TRUE(simulate(ScheduleKind::kInterleaved, 4, 8, 2, 1, 2, &sim).is_ok());
  EXPECT_EQ(sim.peak_in_flight, (std::vector<int>{11, 9, 7, 5}));
}

TEST(ScheduleErrors, InvalidArgumentsAreRejected) {
  std::vector<Action> out;
  SimResult sim;
  auto fails = [&](ScheduleKind k, int p, int m, int v, int rank, const std::string& needle) {
    Status s = make_schedule(k, p, m, v, rank, &out);
    EXPECT_FALSE(s.is_ok()) << needle;
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
  };
  fails(ScheduleKind::k1F1B, 0, 4, 1, 0, "p must be >= 1");
  fails(ScheduleKind::kGpipe, 2, 0, 1, 0, "m must be >= 1");
  fails(ScheduleKind::k1F1B, 2, 4, 2, 0, "v != 1");
  fails(ScheduleKind::kInterleaved, 2, 4, 1, 0, "v >= 2");
  fails(ScheduleKind::kInterleaved, 4, 6, 2, 0, "multiple of p");
  fails(ScheduleKind::k1F1B, 4, 4, 1, 4, "out of range");
  fails(ScheduleKind::k1F1B, 4, 4, 1, -1, "out of range");
  EXPECT_FALSE(simulate(ScheduleKind::kInterleaved, 4, 6, 2, 1, 2, &sim).is_ok());
  EXPECT_FALSE(simulate(ScheduleKind::k1F1B, 0, 4, 1, 1, 2, &sim).is_ok());
  EXPECT_FALSE(simulate(ScheduleKind::k1F1B, 2, 4, 1, -1, 2, &sim).is_ok());  // negative cost
  EXPECT_TRUE(make_schedule(ScheduleKind::kInterleaved, 4, 8, 2, 3, &out).is_ok());
}

// Zero-bubble schedules (Qi et al. 2023): the backward split into B and W.
struct ZbConfig {
  ScheduleKind kind;
  int p, m;
  int v() const { return kind == ScheduleKind::kZbV ? 2 : 1; }
  std::string name() const {
    return std::string(schedule_name(kind)) + " p=" + std::to_string(p) + " m=" + std::to_string(m);
  }
};
std::vector<ZbConfig> zero_bubble_configs() {
  std::vector<ZbConfig> out;
  for (ScheduleKind k : {ScheduleKind::kZbH1, ScheduleKind::kZbV})
    for (int p : {1, 2, 3, 4, 8})
      for (int m : {1, 2, 3, 4, 8, 16}) out.push_back({k, p, m});
  return out;
}

// Every F, B and W of every (micro-batch, chunk) once, in that order, and nothing else
// computes; the V folds stages r and 2p-1-r onto rank r.
TEST(ZeroBubbleTest, EveryPassOnceAndInOrder) {
  EXPECT_EQ(stage_of(ScheduleKind::kZbV, 4, 2, 0, 1), 7);
  EXPECT_EQ(stage_of(ScheduleKind::kZbV, 4, 2, 3, 1), 4);
  EXPECT_EQ(rank_of_stage(ScheduleKind::kZbV, 4, 2, 4), 3);
  for (const ZbConfig& c : zero_bubble_configs()) {
    for (int r = 0; r < c.p; ++r) {
      std::vector<Action> actions;
      ASSERT_TRUE(make_schedule(c.kind, c.p, c.m, c.v(), r, &actions).is_ok()) << c.name();
      std::map<std::pair<int, int>, std::string> passes;  // (mb, chunk) -> "FBW" as they come
      for (const Action& a : actions) {
        if (a.kind == ActionKind::kForward) passes[{a.microbatch, a.chunk}] += 'F';
        if (a.kind == ActionKind::kBackward) passes[{a.microbatch, a.chunk}] += 'B';
        if (a.kind == ActionKind::kBackwardWeight) passes[{a.microbatch, a.chunk}] += 'W';
      }
      ASSERT_EQ(passes.size(), size_t(c.m * c.v())) << c.name() << " rank " << r;
      for (const auto& [key, order] : passes) EXPECT_EQ(order, "FBW") << c.name() << " rank " << r;
      EXPECT_EQ(stage_of(c.kind, c.p, c.v(), r, 0), r);
      for (int ch = 0; ch < c.v(); ch++)
        EXPECT_EQ(rank_of_stage(c.kind, c.p, c.v(), stage_of(c.kind, c.p, c.v(), r, ch)), r) << c.name();
    }
  }
}

// ZB-H1 is 1F1B with Ws added: without them, the same actions in the same order.
TEST(ZeroBubbleTest, H1IsOneFOneBWithTheWeightsPlaced) {
  for (int p : {2, 4})
    for (int m : {2, 8})
      for (int r = 0; r < p; r++) {
        std::vector<Action> h1, plain, kept;
        ASSERT_TRUE(make_schedule(ScheduleKind::kZbH1, p, m, 1, r, &h1).is_ok());
        ASSERT_TRUE(make_schedule(ScheduleKind::k1F1B, p, m, 1, r, &plain).is_ok());
        for (const Action& a : h1)
          if (a.kind != ActionKind::kBackwardWeight) kept.push_back(a);
        ASSERT_EQ(kept.size(), plain.size());
        for (size_t i = 0; i < kept.size(); i++) {
          EXPECT_EQ(kept[i].kind, plain[i].kind) << "p " << p << " m " << m << " rank " << r << " action " << i;
          EXPECT_EQ(kept[i].microbatch, plain[i].microbatch);
          EXPECT_EQ(kept[i].peer, plain[i].peer);
        }
      }
}

// In unit time (F = B = W for the whole of a rank's layers; a V chunk half of that): the
// simulator pairs every message (it fails on a mismatch or deadlock), and for m >= p the
// bubble is ZB-H1's (p-1)/(3m+p-1), a third of 1F1B's idle time, and ZB-V's (p-1)/(6m+p-1),
// the first forward's way to the last rank. Memory: ZB-H1 holds at most min(p, m) sets on
// every rank and ZB-V 2 min(p, m) chunk sets: 1F1B's first rank's (min(p, m) whole sets).
TEST(ZeroBubbleTest, BubbleAndMemoryInUnitTime) {
  for (const ZbConfig& c : zero_bubble_configs()) {
    const int v = c.v();
    const std::vector<double> cost(c.p * v, 1.0 / v);
    SimResult sim, one_f_one_b;
    ASSERT_TRUE(simulate(c.kind, c.p, c.m, v, cost, cost, cost, &sim).is_ok()) << c.name();
    ASSERT_TRUE(simulate(ScheduleKind::k1F1B, c.p, c.m, 1, std::vector<double>(c.p, 1.0),
                         std::vector<double>(c.p, 1.0), std::vector<double>(c.p, 1.0), &one_f_one_b)
                    .is_ok());
    const double p = c.p, m = c.m;
    EXPECT_LE(sim.bubble_fraction, one_f_one_b.bubble_fraction + 1e-12) << c.name();
    if (c.m >= c.p) {
      const double theory = c.kind == ScheduleKind::kZbH1 ? (p - 1) / (3 * m + p - 1) : (p - 1) / (6 * m + p - 1);
      EXPECT_NEAR(sim.bubble_fraction, theory, 1e-12) << c.name();
    }
    for (int r = 0; r < c.p; r++) EXPECT_LE(sim.peak_in_flight[r], v * std::min(c.p, c.m)) << c.name() << " rank " << r;
    if (c.kind == ScheduleKind::kZbH1) EXPECT_EQ(sim.peak_in_flight[0], std::min(c.p, c.m)) << c.name();
  }
}

// Other costs: the lists placed for them (make_schedule's costs, as the executor places
// them for the costs it measured) run without deadlock, every pass timed as given, and stay
// below 1F1B's bubble where the paper's assumptions roughly hold (B within 2x of W).
TEST(ZeroBubbleTest, OtherCostsRunTheSameLists) {
  for (ScheduleKind k : {ScheduleKind::kZbH1, ScheduleKind::kZbV}) {
    const int p = 4, m = 8, v = k == ScheduleKind::kZbV ? 2 : 1;
    for (auto [tf, tb, tw] : {std::tuple{1.0, 1.2, 0.8}, std::tuple{1.0, 1.5, 0.5}, std::tuple{1.0, 2.0, 1.0},
                              std::tuple{2.0, 1.0, 1.0}, std::tuple{1.0, 2.5, 0.5}}) {
      SimResult sim, flushing;
      const auto all = [&](double x) { return std::vector<double>(p * v, x); };
      ASSERT_TRUE(simulate(k, p, m, v, all(tf), all(tb), all(tw), &sim).is_ok());
      for (int r = 0; r < p; r++) EXPECT_NEAR(sim.busy[r], m * v * (tf + tb + tw), 1e-9);
      const auto one = [&](double x) { return std::vector<double>(p, x * v); };
      ASSERT_TRUE(simulate(ScheduleKind::k1F1B, p, m, 1, one(tf), one(tb), one(tw), &flushing).is_ok());
      if (tb <= 2 * tw) EXPECT_LT(sim.bubble_fraction, flushing.bubble_fraction) << schedule_name(k) << " " << tb;
    }
  }
}

// Lists placed for random stage costs (the executor's measured ones can be anything): every
// one complete and deadlock-free (the simulator checks both), on p 2-5, m 1-12, both kinds.
TEST(ZeroBubbleTest, RandomCostsGiveCompleteLists) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> pass(0.2, 3.0), weight(0.0, 2.0);
  for (int trial = 0; trial < 300; trial++) {
    const ScheduleKind k = trial % 2 ? ScheduleKind::kZbV : ScheduleKind::kZbH1;
    const int p = 2 + trial % 4, m = 1 + trial % 12, v = k == ScheduleKind::kZbV ? 2 : 1;
    std::vector<double> tf(p * v), tb(p * v), tw(p * v);
    for (int s = 0; s < p * v; s++) tf[s] = pass(rng), tb[s] = pass(rng), tw[s] = weight(rng);
    SimResult sim;
    const Status s = simulate(k, p, m, v, tf, tb, tw, &sim);
    ASSERT_TRUE(s.is_ok()) << schedule_name(k) << " p " << p << " m " << m << ": " << s.message();
    for (int r = 0; r < p; r++) EXPECT_LE(sim.peak_in_flight[r], v * p) << schedule_name(k) << " rank " << r;
  }
}

TEST(ZeroBubbleTest, InvalidArgumentsAreRejected) {
  std::vector<Action> out;
  Status s = make_schedule(ScheduleKind::kZbV, 2, 4, 1, 0, &out);
  EXPECT_NE(s.message().find("zb-v schedule runs 2 chunks"), std::string::npos) << s.message();
  s = make_schedule(ScheduleKind::kZbH1, 2, 4, 2, 0, &out);
  EXPECT_NE(s.message().find("v != 1"), std::string::npos) << s.message();
  ScheduleKind kind;
  ASSERT_TRUE(parse_schedule_kind("zb-h1", &kind).is_ok());
  EXPECT_EQ(kind, ScheduleKind::kZbH1);
  EXPECT_NE(parse_schedule_kind("zb", &kind).message().find("zb-h1, zb-v or 2bw"), std::string::npos);
}

// ---- PipeDream-2BW ----------------------------------------------------------------------

// A run of K steps of 2bw lists, the next step's micro-batches (m..) renumbered as the
// run's, is exactly 1F1B over the run's K x m micro-batches: one pipeline that never
// flushes. Every send of the run pairs with its receive in order (the channels are FIFO
// across steps), and rank r starts every step but the first with p - 1 - r forwards of it
// already done.
TEST(TwoBwTest, StepsJoinIntoOneUnflushedOneFOneB) {
  for (int p : {1, 2, 4})
    for (int m : {4, 5, 8})
      for (int K : {1, 2, 3}) {
        if (m < p) continue;
        for (int r = 0; r < p; r++) {
          SCOPED_TRACE(testing::Message() << "p " << p << " m " << m << " K " << K << " rank " << r);
          std::vector<Action> run;
          for (int k = 0; k < K; k++) {
            std::vector<Action> step;
            ASSERT_TRUE(make_schedule(ScheduleKind::k2BW, p, m, 1, r, &step, nullptr, {k == 0, k == K - 1}).is_ok());
            for (Action a : step) {
              a.microbatch += k * m;  // the list's m.. are the next step's 0..
              run.push_back(a);
            }
          }
          std::vector<Action> plain;
          ASSERT_TRUE(make_schedule(ScheduleKind::k1F1B, p, K * m, 1, r, &plain).is_ok());
          ASSERT_EQ(run.size(), plain.size());
          for (size_t i = 0; i < run.size(); i++) {
            EXPECT_EQ(run[i].kind, plain[i].kind) << "action " << i;
            EXPECT_EQ(run[i].microbatch, plain[i].microbatch) << "action " << i;
            EXPECT_EQ(run[i].peer, plain[i].peer) << "action " << i;
          }
          // A middle step holds m backwards of its own and m forwards, w of them the next step's.
          if (K == 3) {
            std::vector<Action> mid;
            ASSERT_TRUE(make_schedule(ScheduleKind::k2BW, p, m, 1, r, &mid, nullptr, {false, false}).is_ok());
            int own_b = 0, own_f = 0, next_f = 0;
            for (const Action& a : mid) {
              own_b += a.kind == ActionKind::kBackward && a.microbatch < m;
              own_f += a.kind == ActionKind::kForward && a.microbatch < m;
              next_f += a.kind == ActionKind::kForward && a.microbatch >= m;
            }
            EXPECT_EQ(own_b, m);
            EXPECT_EQ(own_f, m - (p - 1 - r));
            EXPECT_EQ(next_f, p - 1 - r);
          }
        }
      }
}

// The steady state in time: each step ends at the optimizer's global checks (a sync), so a
// rank's first backward waits for the gradient to come back from the last rank, p - 1
// backwards away; the forwards of the step were done ahead. Bubble (p-1) tb / (m (tf + tb)
// + (p-1) tb), against 1F1B's (p-1) (tf + tb) / (m (tf + tb) + (p-1) (tf + tb)); every
// rank holds 1F1B's sets, min(p, m) = p - r at rank r.
TEST(TwoBwTest, SteadyStateBubbleAndMemory) {
  for (int p : {2, 4})
    for (int m : {4, 8, 16}) {
      for (double tb : {1.0, 2.0, 3.0}) {
        SimResult two_bw, one_f_one_b;
        ASSERT_TRUE(simulate(ScheduleKind::k2BW, p, m, 1, 1.0, tb, &two_bw).is_ok());
        ASSERT_TRUE(simulate(ScheduleKind::k1F1B, p, m, 1, 1.0, tb, &one_f_one_b).is_ok());
        const double busy = m * (1 + tb), idle = (p - 1) * tb;
        EXPECT_NEAR(two_bw.makespan, busy + idle, 1e-9) << "p " << p << " m " << m << " tb " << tb;
        EXPECT_NEAR(two_bw.bubble_fraction, idle / (busy + idle), 1e-12);
        EXPECT_LT(two_bw.bubble_fraction, one_f_one_b.bubble_fraction);
        for (int r = 0; r < p; r++) EXPECT_EQ(two_bw.peak_in_flight[r], p - r) << "rank " << r;
      }
    }
}

TEST(TwoBwTest, InvalidArgumentsAreRejected) {
  std::vector<Action> out;
  Status s = make_schedule(ScheduleKind::k2BW, 4, 3, 1, 0, &out);
  EXPECT_NE(s.message().find("needs at least as many micro-batches as pipeline stages (m >= p), got m=3, p=4"),
            std::string::npos)
      << s.message();
  EXPECT_NE(make_schedule(ScheduleKind::k2BW, 2, 4, 2, 0, &out).message().find("v != 1"), std::string::npos);
  ScheduleKind kind;
  ASSERT_TRUE(parse_schedule_kind("2bw", &kind).is_ok());
  EXPECT_EQ(kind, ScheduleKind::k2BW);
  EXPECT_TRUE(never_flushes(kind));
  EXPECT_FALSE(never_flushes(ScheduleKind::k1F1B));
}

}  // namespace
}  // namespace meshtrain::parallel::pp::test_schedule
