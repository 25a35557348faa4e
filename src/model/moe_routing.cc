#include "model/moe_routing.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"

namespace meshtrain::model {

void moe_scores(MoeScore score, const float* logits, int E, float* out) {
  if (score == MoeScore::kSigmoid) {
    for (int e = 0; e < E; e++) out[e] = 1.0f / (1.0f + std::exp(-logits[e]));
    return;
  }
  const float mx = *std::max_element(logits, logits + E);
  double sum = 0;
  for (int e = 0; e < E; e++) sum += out[e] = std::exp(logits[e] - mx);
  for (int e = 0; e < E; e++) out[e] = (float)(out[e] / sum);
}

namespace {

float row_logsumexp(const float* logits, int E) {
  const float mx = *std::max_element(logits, logits + E);
  double sum = 0;
  for (int e = 0; e < E; e++) sum += std::exp((double)logits[e] - mx);
  return (float)(mx + std::log(sum));
}

// P_i's per-token term: the score itself (softmax), or the score normalised over all experts
// (sigmoid, DeepSeek-V3's sequence-wise balance loss).
void balance_probabilities(MoeScore score, const float* scores, int E, float* q) {
  if (score == MoeScore::kSoftmax) {
    std::copy(scores, scores + E, q);
    return;
  }
  double sum = 0;
  for (int e = 0; e < E; e++) sum += scores[e];
  for (int e = 0; e < E; e++) q[e] = (float)(scores[e] / sum);
}

// Top-k of one row of scores by descending score, ties to the lower expert index.
void top_k(const float* scores, int E, int k, int* chosen) {
  for (int j = 0; j < k; j++) {
    int best = -1;
    for (int e = 0; e < E; e++) {
      if (std::find(chosen, chosen + j, e) != chosen + j) continue;
      if (best < 0 || scores[e] > scores[best]) best = e;
    }
    chosen[j] = best;
  }
}

// f_i of a balance group (one sequence, or one micro-batch) of G rows: its assignments to
// expert i over k G, before any drop.
std::vector<double> group_fractions(const MoeRoute& r, int first_row, int G, int E, int k) {
  std::vector<double> f(E, 0.0);
  for (int a = first_row * k; a < (first_row + G) * k; a++) f[r.expert[a]] += 1.0;
  for (double& x : f) x /= (double)k * G;
  return f;
}

// Rows per balance group.
int balance_rows(const MoeTraining& training, int N, int T) {
  return training.balance == MoeBalance::kMicroBatch ? N : T;
}

// Balance groups of B sequences, and sequence b's.
int balance_groups(const MoeTraining& training, int B) { return training.balance == MoeBalance::kMicroBatch ? 1 : B; }
int group_of(const MoeTraining& training, int b) { return training.balance == MoeBalance::kMicroBatch ? 0 : b; }

// A row's experts (top-k by score, plus the bias when given) and their combine weights.
void choose(const MoeConfig& config, const float* scores, const float* bias, float* biased, int* chosen,
            float* weight) {
  const int E = config.experts, k = config.top_k;
  if (bias) {
    for (int e = 0; e < E; e++) biased[e] = scores[e] + bias[e];
    top_k(biased, E, k, chosen);
  } else {
    top_k(scores, E, k, chosen);
  }
  double sum = 0;
  for (int j = 0; j < k; j++) sum += scores[chosen[j]];
  for (int j = 0; j < k; j++) weight[j] = config.renormalize ? (float)(scores[chosen[j]] / sum) : scores[chosen[j]];
}

}  // namespace

MoeRouteSums moe_route_local(const MoeConfig& config, const MoeTraining& training, const float* logits, int N, int T,
                             const MoeSequenceSplit& split, MoeRoute* r, MoeRouteStats* stats, const float* bias) {
  const int E = config.experts, k = config.top_k;
  CHECK_MSG(T > 0 && N % T == 0, "MoE routing needs whole sequences");
  CHECK_MSG(split.local >= 1 && T % split.local == 0 && split.T >= T, "a sequence's rows in equal runs");
  if ((int)stats->tokens.size() != E) stats->tokens.assign(E, 0);
  if ((int)stats->chosen.size() != E) stats->chosen.assign(E, 0);
  const int B = N / T, run = T / split.local;
  MoeRouteSums sums{balance_groups(training, B), B, split.chunks, k, E, {}};
  sums.values.assign((size_t)sums.groups * 2 * E + (size_t)B * split.chunks * k * E, 0.0);
  std::vector<float> scores(E), q(E), biased(E);
  for (int b = 0; b < B; b++) {
    double* group = sums.group(group_of(training, b));
    for (int n = b * T; n < (b + 1) * T; n++) {
      const float* row = logits + (size_t)n * E;
      moe_scores(config.score, row, E, scores.data());
      int* chosen = r->expert + (size_t)n * k;
      choose(config, scores.data(), bias, biased.data(), chosen, r->weight + (size_t)n * k);
      double* offers = sums.offers(b, split.mine[(n - b * T) / run]);
      for (int j = 0; j < k; j++) stats->chosen[chosen[j]]++, group[E + chosen[j]] += 1.0, offers[j * E + chosen[j]] += 1.0;
      balance_probabilities(config.score, scores.data(), E, q.data());
      for (int e = 0; e < E; e++) group[e] += q[e];
      if (training.z_loss > 0) {
        const double lse = row_logsumexp(row, E);
        stats->z += training.z_loss * lse * lse;
      }
    }
  }
  return sums;
}

namespace {

// Each group's balance loss, alpha E sum_i f_i P_i, once per sequence it holds: f_i the
// group's assignments to i over k G, P_i its mean q_i (G rows of whole sequences).
void balance_loss(const MoeTraining& training, MoeRouteSums& sums, int B, int T_whole, MoeRouteStats* stats) {
  const int E = sums.E;
  const double G = training.balance == MoeBalance::kMicroBatch ? (double)B * T_whole : T_whole;
  for (int g = 0; g < sums.groups; g++) {
    const double* group = sums.group(g);
    double aux = 0;
    for (int e = 0; e < E; e++) aux += group[E + e] / ((double)sums.k * G) * (group[e] / G);
    stats->aux += training.aux_loss * E * aux * (G / T_whole);
  }
}

// Capacity, choice by choice in position order: an assignment is kept while fewer than
// `capacity` offers to its expert came before it in that order: every earlier choice's in
// the whole sequence, and its own choice's in earlier chunks and earlier rows of its chunk.
// Slot 0 marks kept for now.
void take_capacity(const MoeTraining& training, MoeRouteSums& sums, int N, int T, const MoeSequenceSplit& split,
                   MoeRoute* r, MoeRouteStats* stats) {
  const int E = sums.E, k = sums.k, run = T / split.local;
  const bool dropless = training.capacity_factor <= 0;
  const int64_t capacity = dropless ? 0 : (int64_t)std::ceil(k * (double)split.T * training.capacity_factor / E);
  std::vector<double> before(E);
  for (int b = 0; b < N / T; b++)
    for (int j = 0; j < k; j++)
      for (int i = 0; i < split.local; i++) {
        const int chunk = split.mine[i];
        std::fill(before.begin(), before.end(), 0.0);
        for (int c = 0; c < split.chunks; c++)
          for (int jj = 0; jj < (c < chunk ? j + 1 : j); jj++)
            for (int e = 0; e < E; e++) before[e] += sums.offers(b, c)[jj * E + e];
        for (int n = b * T + i * run; n < b * T + (i + 1) * run; n++) {
          const int a = n * k + j, e = r->expert[a];
          const bool keep = dropless || before[e] < (double)capacity;
          before[e] += 1.0;
          r->slot[a] = keep ? 0 : -1;
          stats->dropped += !keep;
        }
      }
}

// Dispatch order: by expert, then by token (a counting sort over the kept assignments).
void dispatch_order(int N, int E, int k, MoeRoute* r, MoeRouteStats* stats) {
  std::fill(r->offsets, r->offsets + E + 1, 0);
  for (int a = 0; a < N * k; a++)
    if (r->slot[a] >= 0) r->offsets[r->expert[a] + 1]++;
  for (int e = 0; e < E; e++) {
    stats->tokens[e] += r->offsets[e + 1];
    r->offsets[e + 1] += r->offsets[e];
  }
  std::vector<int> next(r->offsets, r->offsets + E);
  for (int a = 0; a < N * k; a++) {
    if (r->slot[a] < 0) continue;
    const int s = next[r->expert[a]]++;
    r->slot[a] = s;
    r->order[s] = a;
  }
}

}  // namespace

void moe_route_finish(const MoeConfig& config, const MoeTraining& training, MoeRouteSums& sums, int N, int T,
                      const MoeSequenceSplit& split, bool count_aux, MoeRoute* r, MoeRouteStats* stats) {
  if (count_aux) balance_loss(training, sums, N / T, split.T, stats);
  take_capacity(training, sums, N, T, split, r, stats);
  dispatch_order(N, config.experts, config.top_k, r, stats);
}

void moe_route(const MoeConfig& config, const MoeTraining& training, const float* logits, int N, int T,
               MoeRoute* r, MoeRouteStats* stats, const float* bias) {
  const MoeSequenceSplit split = MoeSequenceSplit::whole(T);
  MoeRouteSums sums = moe_route_local(config, training, logits, N, T, split, r, stats, bias);
  moe_route_finish(config, training, sums, N, T, split, /*count_aux=*/true, r, stats);
}

std::vector<double> moe_group_assignments(const MoeConfig& config, const MoeTraining& training, const MoeRoute& r,
                                          int N, int T) {
  const int E = config.experts, k = config.top_k;
  std::vector<double> out((size_t)balance_groups(training, N / T) * E, 0.0);
  for (int b = 0; b < N / T; b++)
    for (int a = b * T * k; a < (b + 1) * T * k; a++) out[(size_t)group_of(training, b) * E + r.expert[a]] += 1.0;
  return out;
}

void update_expert_bias(const double* load, int E, float speed, float* bias) {
  double total = 0;
  for (int e = 0; e < E; e++) total += load[e];
  for (int e = 0; e < E; e++) {  // load vs the mean, compared as load * E vs the total: exact
    const double over = load[e] * E - total;
    bias[e] += over > 0 ? -speed : over < 0 ? speed : 0.0f;
  }
}

void moe_route_backward(const MoeConfig& config, const MoeTraining& training, const float* logits,
                        const float* dweight, const MoeRoute& r, int N, int T, float aux_scale, float z_scale,
                        float* dlogits, const double* assignments, int T_whole) {
  const int E = config.experts, k = config.top_k, Tw = T_whole > 0 ? T_whole : T;
  std::vector<float> scores(E), q(E), ds(E), dq(E);
  const int G = balance_rows(training, N, T);
  const double G_whole = training.balance == MoeBalance::kMicroBatch ? (double)(N / T) * Tw : Tw;
  std::vector<double> f(E);
  for (int b = 0; b < N / T; b++) {
    // dL/dq_i(t) = aux_scale * alpha * E * f_i / T for every token of the group: its G/T
    // sequences' worth of alpha E sum f_i P_i, where P_i averages q_i over G rows (T and
    // G the whole sequences').
    if (b * T % G == 0 && assignments) {
      for (int e = 0; e < E; e++) f[e] = assignments[(size_t)group_of(training, b) * E + e] / ((double)k * G_whole);
    } else if (b * T % G == 0) {
      f = group_fractions(r, b * T, G, E, k);
    }
    for (int e = 0; e < E; e++) dq[e] = (float)(aux_scale * training.aux_loss * E * f[e] / Tw);
    for (int n = b * T; n < (b + 1) * T; n++) {
      const float* row = logits + (size_t)n * E;
      float* drow = dlogits + (size_t)n * E;
      moe_scores(config.score, row, E, scores.data());
      std::fill(ds.begin(), ds.end(), 0.0f);
      // The weights: w_j = s_j / S (S the chosen scores' sum) when renormalised, else s_j.
      const int* chosen = r.expert + (size_t)n * k;
      const float* dw = dweight + (size_t)n * k;
      const float* w = r.weight + (size_t)n * k;
      auto live = [&](int j) { return r.slot[n * k + j] >= 0 ? dw[j] : 0.0f; };
      if (config.renormalize) {
        double S = 0, dot = 0;
        for (int j = 0; j < k; j++) S += scores[chosen[j]], dot += (double)live(j) * w[j];
        for (int j = 0; j < k; j++) ds[chosen[j]] += (float)((live(j) - dot) / S);
      } else {
        for (int j = 0; j < k; j++) ds[chosen[j]] += live(j);
      }
      // The balance loss through P: q = s (softmax), or s / sum(s) (sigmoid).
      if (training.aux_loss > 0) {
        if (config.score == MoeScore::kSoftmax) {
          for (int e = 0; e < E; e++) ds[e] += dq[e];
        } else {
          double sum = 0, dot = 0;
          for (int e = 0; e < E; e++) sum += scores[e];
          balance_probabilities(config.score, scores.data(), E, q.data());
          for (int e = 0; e < E; e++) dot += (double)dq[e] * q[e];
          for (int e = 0; e < E; e++) ds[e] += (float)((dq[e] - dot) / sum);
        }
      }
      // Through the scores to the logits.
      if (config.score == MoeScore::kSoftmax) {
        double dot = 0;
        for (int e = 0; e < E; e++) dot += (double)ds[e] * scores[e];
        for (int e = 0; e < E; e++) drow[e] = (float)(scores[e] * (ds[e] - dot));
      } else {
        for (int e = 0; e < E; e++) drow[e] = ds[e] * scores[e] * (1.0f - scores[e]);
      }
      // z-loss: d(beta * lse^2)/dlogit_e = 2 beta lse softmax_e.
      if (training.z_loss > 0) {
        const float lse = row_logsumexp(row, E);
        for (int e = 0; e < E; e++)
          drow[e] += z_scale * training.z_loss * 2.0f * lse * std::exp(row[e] - lse);
      }
    }
  }
}

}  // namespace meshtrain::model
