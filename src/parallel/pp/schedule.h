// Pipeline-parallel schedules as pure functions, and a discrete-event simulator of them.
//
// A schedule is the ordered list of actions one pipeline rank executes in one training
// step. Keeping it a pure function of (kind, p, m, v, rank) lets the executor stay a dumb
// loop, lets tests check every invariant (each compute exactly once, backward after
// forward, sends and receives pairing up across ranks) without running a model, and lets
// the simulator measure bubbles and activation memory of a schedule before it ever runs.
//
// Stages: rank r of p holds v model chunks; chunk c of rank r is model stage c * p + r
// (Megatron's interleaving), so consecutive stages sit on consecutive ranks and the
// activation of the last rank's chunk c travels to rank 0's chunk c + 1. ZB-V instead folds
// the stages into a V (stage_of): rank r holds stage r and stage 2p - 1 - r, so the last
// rank hands its chunk 0's output to its own chunk 1, and rank 0 holds the first stage and
// the last.
//
// Zero-bubble schedules (Qi et al. 2023, "Zero Bubble Pipeline Parallelism") split each
// backward into B, the input gradients (on the critical path: the stage before waits for
// them), and W, the weight gradients (needed only by the optimizer step), and place the Ws
// in the bubbles. A micro-batch's activations live from its F to its W.
#pragma once
#include <string>
#include <vector>

#include "core/status.h"

namespace meshtrain::parallel::pp {

// kBackward is the whole backward, or under a zero-bubble schedule its input-gradient half
// B; kBackwardWeight is the weight-gradient half W (zero-bubble schedules only).
enum class ActionKind { kForward, kBackward, kSendActivation, kRecvActivation, kSendGrad, kRecvGrad, kBackwardWeight };

struct Action {
  ActionKind kind;
  int microbatch;
  int chunk;  // virtual stage chunk on this rank, 0..v-1 (for send/recv: this rank's chunk)
  int peer;   // for send/recv: the other pipeline rank; -1 for compute
};

enum class ScheduleKind { kGpipe, k1F1B, kInterleaved, kZbH1, kZbV, k2BW };

// "gpipe", "1f1b", "interleaved", "zb-h1", "zb-v", "2bw": the names flags and traces use.
const char* schedule_name(ScheduleKind kind);
Status parse_schedule_kind(const std::string& name, ScheduleKind* out);
// Whether the schedule splits the backward into B and W actions.
bool splits_backward(ScheduleKind kind);
// Whether the schedule runs on over step boundaries (PipeDream-2BW): a step's list then
// holds forwards of the next step, and its model computes with the weights of one update
// before (parallel::DataParallel's weight versions).
bool never_flushes(ScheduleKind kind);

// PipeDream-2BW (Narayanan et al. 2021, "Memory-Efficient Pipeline-Parallel DNN Training")
// is 1F1B without the flush: rank r runs the step's m backwards, each after a forward
// w = p - 1 - r micro-batches ahead, so the last w forwards of a step's list are the next
// step's micro-batches 0..w-1 (numbered m..m+w-1 in the list), whose activations stay in
// flight over the step boundary. The first step of a run starts with those w forwards of
// its own (1F1B's warm-up); the last has none of the next step (1F1B's cool-down), so a
// run of one step is 1F1B. The other schedules ignore where the step lies.
struct StepInRun {
  bool first = true, last = true;
};
// The model stage that rank `rank`'s chunk `chunk` runs (p ranks, v chunks each), and the
// rank that runs stage `stage`.
int stage_of(ScheduleKind kind, int p, int v, int rank, int chunk);
int rank_of_stage(ScheduleKind kind, int p, int v, int stage);

// The ordered actions of pipeline rank `rank` of p ranks for m micro-batches and v chunks
// per rank (v must be 1 except for kInterleaved, which needs v >= 2 and m % p == 0, and
// kZbV, which needs v == 2).
//
// The zero-bubble orders come from list-scheduling all ranks in unit time (F = B = W, the
// case the paper's handcrafted ZB-H1 and ZB-V are drawn for), so they are fixed lists that
// any real costs then run. ZB-H1 runs 1F1B's order of Fs and Bs and puts each W in the
// first slot where the next F or B is not ready: bubble (p-1)/(3m+p-1) for m >= p, a third
// of 1F1B's idle time, with at most min(p, m) activation sets on every rank (1F1B's first
// rank). ZB-V takes on each free rank a ready B first (the gradient chain is the critical
// path), else a ready F while it holds under 2p chunk sets (p sets of its whole layers,
// 1F1B's first-rank memory), else its oldest pending W: bubble (p-1)/(6m+p-1) for m >= p,
// only the first forward's way to the last rank.
//
// Communication appears where the executor must post it: a forward of a stage other than
// the first is preceded by a kRecvActivation from the previous stage's rank, and a forward
// of a stage other than the last is followed by a kSendActivation to the next stage's
// rank; symmetrically a backward of a stage other than the last is preceded by a kRecvGrad
// from the next stage's rank and, unless it is the first stage, followed by a kSendGrad to
// the previous one. Sends are meant to be non-blocking (posted, completed later); receives
// block. Between two stages on the same rank (only p == 1 interleaved) nothing is sent:
// the tensor never leaves the rank.
//
// For every ordered rank pair and direction, the k-th send matches the k-th receive, so
// FIFO point-to-point channels (one tag per direction) suffice.
// Each stage's time for one micro-batch's F, B and W (p x v entries, in model order).
struct PassCosts {
  std::vector<double> forward, backward, weight;
};
// `costs` (zero-bubble schedules only; null: unit costs) lets the list scheduling place the
// Ws for these costs: every rank must pass the same, or the lists will not pair.
Status make_schedule(ScheduleKind kind, int p, int m, int v, int rank, std::vector<Action>* out,
                     const PassCosts* costs = nullptr, StepInRun where = {});

// Discrete-event simulation of all p ranks executing their schedules. Each forward costs tf
// and each backward tb (per chunk); sends take no time; a receive waits until the matching
// send has been posted, i.e. until the compute that produced the tensor has finished. Under
// a zero-bubble schedule B and W cost tb / 2 each unless given apart (the overload with tw).
// One forward or backward of one rank in the simulation.
struct SimSpan {
  ActionKind kind;  // kForward or kBackward
  int microbatch;
  int chunk;
  double start, end;
};

struct SimResult {
  double makespan = 0;         // time at which the last rank finishes
  double bubble_fraction = 0;  // idle time of all ranks within the makespan / (p * makespan)
  std::vector<double> busy;    // per rank: total compute time
  // Per rank: the peak number of (micro-batch, chunk) activation sets alive at once
  // (forward done, backward, or under a zero-bubble schedule W, not yet). With v == 1 this is micro-batches; with v chunks a
  // set holds 1/v of the rank's layers, so peak / v is the memory in micro-batch units.
  std::vector<int> peak_in_flight;
  // Per rank, under a zero-bubble schedule: the peak number of Bs whose W has not run.
  std::vector<int> peak_pending_weights;
  // Per rank: every forward and backward in execution order with its start and end, the
  // schedule's theoretical timeline (pp/sim_trace.h turns it into trace events).
  std::vector<std::vector<SimSpan>> spans;
};

// 2BW is simulated in its steady state, a step of a long run (neither first nor last): the
// forwards carried in from the step before are done, their activations sent, at time 0.
// Fails on invalid arguments, on a deadlock (some rank waits on a receive whose send never
// comes) and on a receive that pairs with a send of a different micro-batch or stage.
Status simulate(ScheduleKind kind, int p, int m, int v, double tf, double tb, SimResult* out);
// The same with a cost per stage (p x v entries, in model order: stage = chunk x p + rank):
// uneven layer counts, and the first stage's embedding and the last one's head.
Status simulate(ScheduleKind kind, int p, int m, int v, const std::vector<double>& tf,
                const std::vector<double>& tb, SimResult* out);
// The same with the backward's halves apart: B costs tb and W tw under a zero-bubble
// schedule; under the others a backward costs tb + tw.
Status simulate(ScheduleKind kind, int p, int m, int v, const std::vector<double>& tf, const std::vector<double>& tb,
                const std::vector<double>& tw, SimResult* out);

// A measured bubble explained by the simulator: the schedule's own share (every stage at
// the stages' mean F, B and W), what unequal stages add (each stage at its own costs, less
// the first), and the rest, communication and runtime overhead. `stages` holds each stage's
// costs per micro-batch (p x v entries, model order). The three sum to `measured`.
struct BubbleParts {
  double schedule = 0, imbalance = 0, overhead = 0;
};
Status explain_bubble(ScheduleKind kind, int p, int m, int v, const PassCosts& stages, double measured,
                      BubbleParts* out);

}  // namespace meshtrain::parallel::pp
