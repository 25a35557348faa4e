// Runs a pipeline schedule (schedule.h) on this rank's stages of the model.
//
// The executor is a loop over the rank's action list. Activations and their gradients
// travel between neighbouring pipeline ranks as non-blocking point-to-point messages:
// receives are posted ahead (up to the next two compute actions, so a message can arrive
// while the rank still computes), sends return at once and complete in the background.
// Every forward keeps its micro-batch's activations in a set of its own until the
// matching backward, so the schedule alone decides the activation memory: GPipe keeps m
// sets, 1F1B at most p on the first stage.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "comm/group.h"
#include "model/gpt.h"
#include "parallel/dp/grad_sync.h"
#include "parallel/pp/schedule.h"

namespace meshtrain::parallel::pp {

// Where micro-batch mb of the step comes from: its tokens and targets (B x T each) and the
// global index of its first token row (for dropout masks).
struct MicroBatches {
  std::function<void(int mb, int* inputs, int* targets)> fill;
  std::function<int64_t(int mb)> first_token_row;  // the same rows in every step
  // The next step's micro-batch mb, where its first forwards run in this step's list (2bw);
  // null: no step follows, the pipeline drains.
  std::function<void(int mb, int* inputs, int* targets)> fill_next;
};

// Time of one rank in one step: compute (forward and backward) and the pipeline window,
// from entering the schedule to the moment every pipeline rank has finished it.
// A compute span's name in traces: "F3" / "B3" (/ "W3", a zero-bubble schedule's weight
// gradients) for micro-batch 3, "F3.1" for chunk 1 when the rank runs several chunks (v > 1).
std::string span_name(char pass, int mb, int chunk, int v);

struct PipelineTimes {
  double compute_s = 0;
  double window_s = 0;
  int peak_sets = 0;  // activation sets alive at once (micro-batch x chunk)
  // Per chunk of this rank: the step's time in forwards, backwards (B under a zero-bubble
  // schedule) and Ws (zero otherwise), summed over the micro-batches.
  std::vector<double> forward_s, backward_s, weight_s;
  // Every stage's (p x v, model order) per micro-batch, the same on every pipeline rank.
  PassCosts stages;
  int carried = 0;  // 2bw: the next step's micro-batches this step ran forwards of
};

class PipelineExecutor {
 public:
  // `gpt` holds this rank's chunks (its part must come from rank_part() with pp's size).
  // `everyone`: every rank of the job (null: the pp group is all of it). A zero-bubble
  // schedule's lists follow measured costs, and every pipeline group must run the same
  // lists: the tp and dp peers of a stage meet in its collectives.
  PipelineExecutor(model::Gpt& gpt, comm::Group& pp, ScheduleKind kind, int virtual_stages,
                   comm::Group* everyone = nullptr);

  // One step of m micro-batches of B x T: forwards and backwards as the schedule orders,
  // gradients synchronised through `grads` (end_micro_batch after each backward). Returns the
  // sum of token losses on the last stage (0 elsewhere), not yet reduced over pp.
  double train_step(int m, int B, int T, int64_t step, const MicroBatches& data, float loss_scale,
                    GradSync& grads);
  // Forward only, one micro-batch through every stage in order: the mean loss of inputs
  // on the last stage (0 elsewhere).
  double forward_only(const int* inputs, const int* targets, int B, int T);
  const PipelineTimes& times() const { return times_; }

 private:
  // One train_step's inputs and what it accumulates.
  struct StepState {
    int m, B, T;
    int64_t step;
    const MicroBatches& data;
    float loss_scale;
    GradSync& grads;
    size_t n;    // elements of a stage boundary's activation or gradient
    bool split;  // the backward split into B and W (zero-bubble)
    std::vector<int> inputs, targets;
    double loss_sum;  // of token losses on the last stage
  };
  struct Pass;
  void run_action(const Action& a, StepState& s);
  void run_forward(const Action& a, const Pass& pass, StepState& s);
  void run_backward(const Action& a, const Pass& pass, StepState& s);
  void run_weight(const Action& a, const Pass& pass, StepState& s);
  void finish_step(int m, double start, double* loss_sum);
  // Fills times_.stages from every rank's chunks (pp collectives: all ranks call it).
  void share_stage_costs(int m);
  enum Kind { kActivation = 0, kGrad = 1 };
  using Key = std::tuple<int, int, int>;  // kind, micro-batch, chunk (this rank's)
  struct Inbox {
    Buffer<float> data;
    comm::RequestPtr request;
  };
  void post_receive(const Action& a, int id, size_t n);  // id: set_id's
  const float* take(Kind kind, int mb, int chunk);
  void send(Kind kind, int mb, int chunk, const float* data, size_t n, int peer, bool copy);
  int chunk_of(int stage) const;
  void hand_over(Kind kind, int mb, int from_chunk, const float* data, size_t n);
  void wait_sends(bool all);
  // The id a micro-batch of the schedule's list has in activation sets and messages: itself,
  // or under 2bw (whose list numbers the next step's micro-batches m..) one that alternates
  // between steps, so a step's sets never meet the carried ones of the step before.
  int set_id(int mb, int m, int64_t step) const;

  model::Gpt& gpt_;
  comm::Group& pp_;
  comm::Group* everyone_;
  ScheduleKind kind_;
  int v_;
  std::map<Key, Inbox> inbox_;
  struct Outgoing {
    Key key;
    Buffer<float> copy;  // gradients: dresidual is overwritten by the next backward
    comm::RequestPtr request;
  };
  std::vector<Outgoing> outgoing_;
  Buffer<float> received_;  // the last taken message (valid until the next take)
  PipelineTimes times_;
  // A zero-bubble schedule places its Ws for the stage costs measured in the previous step
  // (unit costs in the first): every rank holds the same numbers, so the lists pair.
  bool measured_ = false;
  PassCosts last_costs_;
  bool carrying_ = false;  // 2bw: the last step left forwards of this one in flight
};

}  // namespace meshtrain::parallel::pp
