// The router of one Mixture-of-Experts layer, as pure functions over the token rows of a
// micro-batch (docs/moe.md): scores, top-k choices and their weights, the balancing losses,
// capacity and the dispatch order. Every statistic is taken per sequence (T consecutive
// rows), so a sequence's routing depends on its own tokens only and any split of the batch
// over ranks routes it the same way.
#pragma once
#include <cstdint>
#include <vector>

#include "model/config.h"

namespace meshtrain::model {

// What the balance loss's f_i and P_i average over: each sequence (layout-independent), or
// each micro-batch a rank routes (DeepSpeed's and Megatron's: a different dp split or
// micro-batch size changes the loss). A micro-batch's term counts once per sequence it
// holds, so both weigh a sequence alike.
enum class MoeBalance { kSequence, kMicroBatch };

// Training settings of the MoE layers (not the architecture: a checkpoint does not fix them).
struct MoeTraining {
  // 0: dropless. Else each expert takes at most ceil(top_k * T * factor / experts) of a
  // sequence's assignments; the rest are dropped (their weight contributes nothing).
  double capacity_factor = 0;
  float aux_loss = 0.01f;  // alpha of the Switch/GShard balance loss, per sequence
  float z_loss = 0;        // beta of the router z-loss, per token
  MoeBalance balance = MoeBalance::kSequence;
  // Aux-loss-free balancing's step per update (update_expert_bias; 0: no bias).
  float bias_speed = 0;
};

// Where one layer's routing of N = B*T rows lives (the model's tracked activation memory).
// Assignment a = n * k + j is token n's j-th choice (by descending score).
struct MoeRoute {
  int* expert = nullptr;    // [N*k] the chosen expert
  float* weight = nullptr;  // [N*k] its combine weight (renormalised or not)
  int* slot = nullptr;      // [N*k] its row in the dispatched order, -1 when dropped
  int* order = nullptr;     // [N*k] the assignment of dispatched row s (first `offsets[E]` used)
  int* offsets = nullptr;   // [E+1] expert e's dispatched rows are [offsets[e], offsets[e+1])
};

// What a layer's routing of one micro-batch adds to the step's statistics.
struct MoeRouteStats {
  std::vector<int64_t> chosen;  // [E] assignments per expert before any drop (the load)
  double aux = 0;      // sum over sequences of alpha * E * sum_i f_i P_i (a micro-batch
                       // group counts as its B sequences)
  double z = 0;        // sum over tokens of beta * logsumexp(logits)^2
  int64_t dropped = 0; // assignments over capacity
  std::vector<int64_t> tokens;  // [E] kept assignments per expert
  // Expert parallelism (Gpt): rows this rank sent to other ep ranks' experts, and received
  // from other ranks for its own, in the forward dispatch (the combine and the backward
  // move the same rows again).
  int64_t sent_rows = 0, received_rows = 0;
};

// Where a sequence's rows are, when context parallelism spreads them over ranks
// (model/context_parallel.h): the whole sequence of T rows is cut into `chunks` equal
// chunks in sequence order, and this rank holds `local` of them, chunk `mine[i]` as its
// i-th run of rows. One rank: the whole sequence, one chunk.
struct MoeSequenceSplit {
  int T = 0;  // the whole sequence's rows
  int chunks = 1, local = 1;
  int mine[2] = {0, 0};
  static MoeSequenceSplit whole(int T) { return {T, 1, 1, {0, 0}}; }
};

// What the routing's whole-sequence statistics need from every rank that holds a part of
// the sequences: per balance group, the sum of each expert's balance probability q_i and
// its assignments; per sequence, the choice-j assignments to each expert in each chunk
// (this rank's chunks filled, the others zero). Summed over those ranks (an all-reduce of
// `values`), they are the whole sequences'.
struct MoeRouteSums {
  int groups = 0, B = 0, chunks = 1, k = 0, E = 0;
  std::vector<double> values;  // [groups][2E] (q sums, then assignments), then [B][chunks][k][E] (offers)
  double* group(int g) { return values.data() + (size_t)g * 2 * E; }
  double* offers(int b, int c) { return values.data() + (size_t)groups * 2 * E + ((size_t)b * chunks + c) * k * E; }
};

// Routes N rows of router logits [N, E] (B sequences of T rows) into r: scores (softmax, or
// sigmoid), the top-k experts (ties to the lower index) by score plus `bias` [E] when given
// (aux-loss-free balancing; the weights use the scores alone), their weights, then per sequence
// the capacity drops and the dispatch order (by expert, then by token). Adds to *stats.
// Drop order: a sequence's assignments are offered choice by choice (every token's first
// choice, in position order, then every second choice, ...); an expert past its capacity
// drops what it is offered.
void moe_route(const MoeConfig& config, const MoeTraining& training, const float* logits, int N, int T,
               MoeRoute* r, MoeRouteStats* stats, const float* bias = nullptr);

// moe_route in two halves, for sequences whose rows are spread over ranks (T: the rows of
// each sequence here; split: where they are in it). The first chooses and weighs each
// row's experts and returns this rank's sums; the caller adds them over the ranks that
// share the sequences; the second takes the balance loss (when `count_aux`: one rank of
// those adds it), the capacity drops and the dispatch order.
MoeRouteSums moe_route_local(const MoeConfig& config, const MoeTraining& training, const float* logits, int N, int T,
                             const MoeSequenceSplit& split, MoeRoute* r, MoeRouteStats* stats,
                             const float* bias = nullptr);
void moe_route_finish(const MoeConfig& config, const MoeTraining& training, MoeRouteSums& sums, int N, int T,
                      const MoeSequenceSplit& split, bool count_aux, MoeRoute* r, MoeRouteStats* stats);
// The backward's share of those sums: the assignments per balance group, [groups][E] (to be
// summed over the same ranks).
std::vector<double> moe_group_assignments(const MoeConfig& config, const MoeTraining& training, const MoeRoute& r,
                                          int N, int T);

// Aux-loss-free balancing (DeepSeek-V3, arXiv 2412.19437, 2.1.2): after a step, each
// expert's routing bias moves `speed` down when its load (assignments over the whole step
// and job) is above the layer's mean, up when below, and stays when equal.
void update_expert_bias(const double* load, int E, float speed, float* bias);

// The gradient of the router logits [N, E] from dweight [N*k] (the loss's gradient with
// respect to each assignment's weight; ignored for dropped ones), the balance loss of each
// sequence scaled by aux_scale and the z-loss of each token scaled by z_scale. `assignments`:
// moe_group_assignments summed over the ranks that share the sequences (null: one rank
// holds them, T = T_whole); T_whole the whole sequence's rows.
void moe_route_backward(const MoeConfig& config, const MoeTraining& training, const float* logits,
                        const float* dweight, const MoeRoute& r, int N, int T, float aux_scale, float z_scale,
                        float* dlogits, const double* assignments = nullptr, int T_whole = 0);

// Expert scores of one row of logits: softmax, or elementwise sigmoid.
void moe_scores(MoeScore score, const float* logits, int E, float* out);

}  // namespace meshtrain::model
