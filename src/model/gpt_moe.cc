// The MoE layer's MLP of Gpt (docs/moe.md): the router in fp32, the routing of
// model/moe_routing.h, the experts as grouped GEMMs over the dispatched rows, the shared
// experts as one dense MLP, and the weighted combine. Under tensor parallelism every
// expert is split like the dense MLP (its first projection by rows, its down projection by
// columns): each tp rank routes all N rows identically (the router is replicated and its
// input gathered) and computes its slice of every expert, and the combine's partial sums
// are reduced with the dense MLP's reduction.
#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "core/check.h"
#include "kernels/ops.h"
#include "model/gpt.h"

namespace meshtrain::model {

namespace k = meshtrain::kernels;

std::vector<float>& Gpt::moe_bias() {
  if (moe_bias_.empty()) moe_bias_.assign((size_t)config_.layers * config_.moe.experts, 0.0f);
  return moe_bias_;
}

void Gpt::reset_moe_stats() {
  for (auto& s : moe_stats_) s = MoeRouteStats{};
}

// Router, experts (the dispatched rows) and shared experts, 2 FLOPs per multiply-add.
double Gpt::moe_flops(int N, int dispatched) const {
  const double C = config_.dim, S = config_.moe.shared_experts;
  return 2.0 * N * C * config_.moe.experts + 2.0 * (double)dispatched * C * ((double)Fcel_ + Fel_) +
         2.0 * S * N * C * ((double)Fcsl_ + Fsl_);
}

// How many rows each ep rank sends for each of this rank's experts: an all-to-all of the
// routing's per-expert counts (rank q's experts are [q El, (q+1) El), a contiguous run of
// the dispatch order).
void Gpt::moe_count_received(BlockActivations& a) {
  const int E = config_.moe.experts;
  std::vector<float> mine(E), theirs(E);
  for (int e = 0; e < E; e++) mine[e] = (float)(a.route.offsets[e + 1] - a.route.offsets[e]);  // exact below 2^24
  if (ep_) ep_->all_to_all(mine.data(), theirs.data(), (size_t)E / ep_->size());
  else theirs = mine;
  for (int e = 0; e < E; e++) a.received[e] = (int)theirs[e];
}

namespace {

// The share of n rows that tp rank t of T carries over ep: [chunk_start(t), chunk_start(t+1)).
int chunk_start(int n, int t, int T) { return (int)((int64_t)n * t / T); }

// Rows in the exchange buffer. It holds the segments of the tp ranks whose rows this rank's
// experts compute on: every tp rank's when the experts are split over tp (each rank computes
// its slice on every row), its own when they are replicated (each computes whole experts on
// its share). Tp rank t's segment holds, for each ep source q, the t-th share of the rows q
// sent for this rank's experts (their counts in received[q * El + j]). Without tp (T = 1)
// that is the all-to-all's source-major order.
struct ExchangeShape {
  std::vector<int> block;          // [P] rows each ep source sends for this rank's experts
  std::vector<int> segment_start;  // [T + 1] where each tp rank's segment starts, all held
  int first = 0, last = 1;         // the segments held: [first, last)
  std::vector<int> held;           // [P * El] rows of each (source, expert) in them
  // Where held segment t starts in the buffer.
  int offset(int t) const { return segment_start[t] - segment_start[first]; }
};

ExchangeShape exchange_shape(const int* received, int P, int El, int T, int t, bool replicated) {
  ExchangeShape x;
  x.block.assign(P, 0);
  for (int q = 0; q < P; q++)
    for (int j = 0; j < El; j++) x.block[q] += received[q * El + j];
  x.segment_start.assign(T + 1, 0);
  for (int r = 0; r < T; r++) {
    x.segment_start[r + 1] = x.segment_start[r];
    for (int q = 0; q < P; q++) x.segment_start[r + 1] += chunk_start(x.block[q], r + 1, T) - chunk_start(x.block[q], r, T);
  }
  x.first = replicated ? t : 0, x.last = replicated ? t + 1 : T;
  x.held.assign((size_t)P * El, 0);
  for (int q = 0; q < P; q++) {
    const int lo = chunk_start(x.block[q], x.first, T), hi = chunk_start(x.block[q], x.last, T);
    for (int j = 0, before = 0; j < El; before += received[q * El + j], j++)
      x.held[q * El + j] = std::max(0, std::min(hi, before + received[q * El + j]) - std::max(lo, before));
  }
  return x;
}

// Where each exchange-buffer row goes among the rows this rank's experts compute on, which
// are expert-major: expert j's held rows from every source in rank order.
std::vector<int> exchange_targets(const int* received, const ExchangeShape& x, int P, int El, int T) {
  std::vector<int> expert_at(P * El);
  int at = 0;
  for (int j = 0; j < El; j++)
    for (int q = 0; q < P; q++) expert_at[q * El + j] = at, at += x.held[q * El + j];
  std::vector<int> target;
  target.reserve(at);
  for (int t = x.first; t < x.last; t++)
    for (int q = 0; q < P; q++) {
      // Expert j's rows start at `before` in q's block, its held ones at max(before, lo).
      const int lo = chunk_start(x.block[q], x.first, T);
      int j = 0, before = 0;
      for (int p = chunk_start(x.block[q], t, T); p < chunk_start(x.block[q], t + 1, T); p++) {
        while (p >= before + received[q * El + j]) before += received[q * El + j], j++;
        target.push_back(expert_at[q * El + j] + p - std::max(before, lo));
      }
    }
  return target;
}

}  // namespace

// The exchange of this rank's MoE layer: over the ep group with the tp shares when rows are
// dispatched (ep_ set), else this rank's own routing with every row held.
Gpt::MoeExchange Gpt::moe_exchange(const BlockActivations& a) const {
  const int P = layout_.ep(), El = config_.moe.experts / P;
  const bool dispatched = ep_ != nullptr;
  return MoeExchange{P, El, dispatched ? tp_size_ : 1, dispatched ? tp_rank_ : 0,
                     dispatched && layout_.experts_replicated(), a.received};
}

namespace {
// The shape of a Gpt::MoeExchange (a generic lambda: the type is Gpt's own).
const auto shape_of = [](const auto& e) { return exchange_shape(e.received, e.P, e.El, e.T, e.t, e.replicated); };
}  // namespace

// This rank's experts' rows, expert-major: expert j's rows are [offsets[j], offsets[j+1]),
// the held rows from every source rank in rank order.
std::vector<int> Gpt::moe_expert_offsets(const BlockActivations& a) const {
  const MoeExchange e = moe_exchange(a);
  const ExchangeShape x = shape_of(e);
  std::vector<int> off(e.El + 1, 0);
  for (int j = 0; j < e.El; j++) {
    off[j + 1] = off[j];
    for (int q = 0; q < e.P; q++) off[j + 1] += x.held[q * e.El + j];
  }
  return off;
}

// The tp group's part of a dispatch: every rank ends with every segment (reduce = false:
// each sends its own to the others), or with its own segment summed over the group
// (reduce = true: each sends the others theirs, and adds what it receives; `scratch` holds
// one segment). Point-to-point, so unequal segments move exactly their rows.
void Gpt::moe_tp_exchange(float* staging, const std::vector<int>& segment_start, bool reduce, float* scratch) {
  const int T = tp_->size(), t = tp_->rank(), C = config_.dim, kTag = 71;
  auto segment = [&](int r) { return staging + (size_t)segment_start[r] * C; };
  auto rows = [&](int r) { return (size_t)(segment_start[r + 1] - segment_start[r]) * C; };
  std::vector<comm::RequestPtr> sends;
  for (int r = 0; r < T; r++)
    if (r != t) sends.push_back(tp_->isend(segment(reduce ? r : t), rows(reduce ? r : t), r, kTag));
  for (int r = 0; r < T; r++) {
    if (r == t) continue;
    if (!reduce) {
      tp_->irecv(segment(r), rows(r), r, kTag)->wait();
      continue;
    }
    tp_->irecv(scratch, rows(t), r, kTag)->wait();
    float* mine = segment(t);
    for (size_t i = 0; i < rows(t); i++) mine[i] += scratch[i];
  }
  for (auto& s : sends) s->wait();
}

Gpt::MoeDispatch Gpt::moe_to_experts_begin(const BlockActivations& a, const float* rows, float* pack) {
  const MoeExchange e = moe_exchange(a);
  const int P = e.P, El = e.El, T = e.T, t = e.t, C = config_.dim, me = ep_->rank();
  const ExchangeShape x = shape_of(e);
  std::vector<size_t> send(P), recv(P);
  MoeDispatch d;
  size_t packed = 0;
  for (int q = 0; q < P; q++) {
    const int first = a.route.offsets[q * El], n = a.route.offsets[(q + 1) * El] - first;
    const int lo = chunk_start(n, t, T), hi = chunk_start(n, t + 1, T);
    if (T > 1) std::memcpy(pack + packed * C, rows + (size_t)(first + lo) * C, sizeof(float) * (hi - lo) * C);
    packed += hi - lo, send[q] = (size_t)(hi - lo) * C;
    recv[q] = (size_t)(chunk_start(x.block[q], t + 1, T) - chunk_start(x.block[q], t, T)) * C;
    if (q != me) d.sent += hi - lo, d.received += recv[q] / C;
  }
  d.request = ep_->iall_to_allv(T > 1 ? pack : rows, send.data(), moe_xchg_ + (size_t)x.offset(t) * C, recv.data());
  return d;
}

// Split experts need every tp rank's segment (the tp group exchanges them); replicated
// ones compute on this rank's own.
void Gpt::moe_to_experts_end(const BlockActivations& a, MoeDispatch& d, float* out) {
  const MoeExchange e = moe_exchange(a);
  const int C = config_.dim;
  d.request->wait();
  const ExchangeShape x = shape_of(e);
  if (e.T > 1 && !e.replicated) moe_tp_exchange(moe_xchg_, x.segment_start, false, nullptr);
  const std::vector<int> target = exchange_targets(a.received, x, e.P, e.El, e.T);
  for (size_t i = 0; i < target.size(); i++)
    std::memcpy(out + (size_t)target[i] * C, moe_xchg_ + i * C, sizeof(float) * C);
}

// Under tp each rank returns only its share of the rows, leaving the other rows of `out`
// zero; the combine's tp reduction then completes every row (a sum over tp of shares is the
// whole). Split experts' outputs are partial sums, so each rank first sums its share over
// the tp group; replicated experts computed its share whole.
void Gpt::moe_from_experts(const BlockActivations& a, float* rows, float* out) {
  const MoeExchange e = moe_exchange(a);
  const int P = e.P, El = e.El, T = e.T, t = e.t, C = config_.dim;
  const ExchangeShape x = shape_of(e);
  const std::vector<int> target = exchange_targets(a.received, x, P, El, T);
  for (size_t i = 0; i < target.size(); i++)
    std::memcpy(moe_xchg_ + i * C, rows + (size_t)target[i] * C, sizeof(float) * C);
  if (T > 1 && !e.replicated) moe_tp_exchange(moe_xchg_, x.segment_start, true, rows);
  std::vector<size_t> send(P), recv(P);
  for (int q = 0; q < P; q++) {
    const int n = a.route.offsets[(q + 1) * El] - a.route.offsets[q * El];
    send[q] = (size_t)(chunk_start(x.block[q], t + 1, T) - chunk_start(x.block[q], t, T)) * C;
    recv[q] = (size_t)(chunk_start(n, t + 1, T) - chunk_start(n, t, T)) * C;
  }
  ep_->all_to_allv(moe_xchg_ + (size_t)x.offset(t) * C, send.data(), T > 1 ? rows : out, recv.data());
  if (T == 1) return;
  const int M = a.route.offsets[config_.moe.experts];
  std::fill(out, out + (size_t)M * C, 0.0f);
  size_t at = 0;
  for (int q = 0; q < P; q++) {
    const int first = a.route.offsets[q * El], n = a.route.offsets[(q + 1) * El] - first;
    const int lo = chunk_start(n, t, T), hi = chunk_start(n, t + 1, T);
    std::memcpy(out + (size_t)(first + lo) * C, rows + at * C, sizeof(float) * (hi - lo) * C);
    at += hi - lo;
  }
}

// Under cp a sequence's rows are spread over the cp group: each rank routes its own, and
// the balance loss and capacity read the whole sequences' sums (added over the group; the
// loss counted on its first rank, as the token losses are summed over it).
void Gpt::moe_route_rows(BlockActivations& a, int N, int T, MoeRouteStats* stats, const float* bias) {
  if (!cp_) return moe_route(config_.moe, moe_training_, a.router_logits, N, T, &a.route, stats, bias);
  const int p = cp_->size(), r = cp_->rank();
  const MoeSequenceSplit split{T * p, 2 * p, 2, {r, 2 * p - 1 - r}};  // CpSplit's chunks
  MoeRouteSums sums = moe_route_local(config_.moe, moe_training_, a.router_logits, N, T, split, &a.route, stats, bias);
  cp_->all_reduce_f64(sums.values.data(), sums.values.size(), comm::ReduceOp::kSum);
  moe_route_finish(config_.moe, moe_training_, sums, N, T, split, /*count_aux=*/r == 0, &a.route, stats);
}

void Gpt::moe_forward(int l, int u, const float* unit, BlockActivations& a, int B, int T, bool recomputing) {
  const int N = B * T, C = config_.dim, E = config_.moe.experts, k = config_.moe.top_k;
  const int S = config_.moe.shared_experts, El = layout_.local_experts(l);
  const float* x = gather_rows(a.ln2, gathered_);  // every row: routing sees whole sequences
  k::matmul_forward(a.router_logits, x, param(u, unit, layout_.layer(l, kRouterW)), nullptr, N, C, E,
                    k::Precision::kFp32);
  MoeRouteStats recomputed;  // a recomputation routes again; the step's statistics count once
  MoeRouteStats& stats = recomputing ? recomputed : moe_stats_[l];
  const float* bias = moe_training_.bias_speed > 0 ? moe_bias().data() + (size_t)l * E : nullptr;
  moe_route_rows(a, N, T, &stats, bias);
  const int M = a.route.offsets[E];
  for (int s = 0; s < M; s++) {
    const float* row = x + (size_t)(a.route.order[s] / k) * C;
    std::memcpy(moe_rows_ + (size_t)s * C, row, sizeof(float) * C);
  }
  // The experts' rows: this rank's own dispatch (ep = 1), or what every ep rank sent here.
  moe_count_received(a);
  const std::vector<int> offsets = moe_expert_offsets(a);
  const int R = offsets[El];
  const float* rows = moe_rows_;
  MoeDispatch dispatch;
  if (ep_) {
    dispatch = moe_to_experts_begin(a, moe_rows_, moe_dy_);
    stats.sent_rows += dispatch.sent, stats.received_rows += dispatch.received;
  }
  // The shared experts' output (weight 1) while the rows are on their way (DeepSeek-V3
  // overlaps its dispatch the same way); the combine adds the routed experts' to it.
  if (S > 0) {
    k::matmul_forward(a.shared_fch, x, gemm_weight(u, unit, layout_.layer(l, kSharedFcW)), nullptr, N, C, S * Fcsl_,
                      precision_);
    const k::GemmInput shared_hidden = activate(a.shared_fch, a.shared_act, N, S * Fsl_);
    k::matmul_forward(partial_, shared_hidden, gemm_weight(u, unit, layout_.layer(l, kSharedProjW)), nullptr, N,
                      S * Fsl_, C, precision_);
  } else {
    std::fill(partial_, partial_ + (size_t)N * C, 0.0f);
  }
  if (ep_) moe_to_experts_end(a, dispatch, a.expert_in), rows = a.expert_in;
  (recomputing ? flops_.recompute : flops_.model) += moe_flops(N, R);
  std::vector<k::GemmInput> fc, proj;
  std::vector<int> units(El);
  for (int j = 0; j < El; j++) {
    units[j] = layout_.expert_unit(l, j);
    const float* eu = store_->acquire_params(units[j]);
    fc.push_back(gemm_weight(units[j], eu, layout_.expert_fc(l, j)));
    proj.push_back(gemm_weight(units[j], eu, layout_.expert_proj(l, j)));
  }
  k::grouped_matmul_forward(a.fch, rows, fc.data(), offsets.data(), El, C, Fcel_, precision_);
  const k::GemmInput hidden = activate(a.fch, a.fch_gelu, R, Fel_);
  float* out = ep_ ? moe_dy_ : a.expert_out;  // expert-major, then back to the tokens' ranks
  k::grouped_matmul_forward(out, hidden, proj.data(), offsets.data(), El, Fel_, C, precision_);
  for (int j = 0; j < El; j++) store_->release_params(units[j]);
  if (ep_) moe_from_experts(a, moe_dy_, a.expert_out);
  // Combine: each kept choice's weighted row, onto the shared experts' output.
  for (int n = 0; n < N; n++) {
    float* o = partial_ + (size_t)n * C;
    for (int j = 0; j < k; j++) {
      const int slot = a.route.slot[n * k + j];
      if (slot < 0) continue;
      const float w = a.route.weight[n * k + j];
      const float* y = a.expert_out + (size_t)slot * C;
      for (int c = 0; c < C; c++) o[c] += w * y[c];
    }
  }
}

// Each choice's routing-weight gradient <dout, y> into moe_dweight_, summed over tp (y is
// partial there), and each dispatched row's output gradient w * dout into moe_dy_, in
// dispatch order.
void Gpt::moe_choice_grads(const BlockActivations& a, const float* dout, int N) {
  const int C = config_.dim, k = config_.moe.top_k, M = a.route.offsets[config_.moe.experts];
  const MoeRoute& r = a.route;
  for (int i = 0; i < N * k; i++) {
    float dot = 0;
    if (r.slot[i] >= 0) {
      const float* y = a.expert_out + (size_t)r.slot[i] * C;
      const float* d = dout + (size_t)(i / k) * C;
      for (int c = 0; c < C; c++) dot += d[c] * y[c];
    }
    moe_dweight_[i] = dot;
  }
  tp_all_reduce(moe_dweight_, (size_t)N * k);
  for (int s = 0; s < M; s++) {
    const int i = r.order[s];
    const float w = r.weight[i];
    const float* d = dout + (size_t)(i / k) * C;
    float* dy = moe_dy_ + (size_t)s * C;
    for (int c = 0; c < C; c++) dy[c] = w * d[c];
  }
}

// Layer l's local experts backward on their rows (`dy` their output gradients, `rows` their
// inputs, in dispatch order): down projections, activation, first projections, each
// expert's weight gradients; the rows' input gradients replace `dy`.
void Gpt::moe_experts_backward(int l, BlockActivations& a, const std::vector<int>& offsets, float* dy,
                               const float* rows) {
  const int C = config_.dim, El = layout_.local_experts(l), R = offsets[El];
  std::vector<k::GemmInput> fc, proj;
  std::vector<k::GradOutput> dfc, dproj;
  std::vector<int> units(El);
  for (int j = 0; j < El; j++) {
    units[j] = layout_.expert_unit(l, j);
    const float* eu = store_->acquire_params(units[j]);
    float* geu = store_->acquire_grads(units[j]);
    fc.push_back(gemm_weight(units[j], eu, layout_.expert_fc(l, j)));
    proj.push_back(gemm_weight(units[j], eu, layout_.expert_proj(l, j)));
    dfc.push_back(weight_grad(units[j], geu, layout_.expert_fc(l, j)));
    dproj.push_back(weight_grad(units[j], geu, layout_.expert_proj(l, j)));
  }
  k::grouped_matmul_backward(moe_dact_, dproj.data(), dy, hidden_input(a.fch_gelu), proj.data(), offsets.data(), El,
                             Fel_, C, precision_);
  activation_backward(moe_dfch_, a.fch, moe_dact_, R, Fel_);
  k::grouped_matmul_backward(dy, dfc.data(), moe_dfch_, rows, fc.data(), offsets.data(), El, C, Fcel_, precision_);
  for (int j = El - 1; j >= 0; j--) store_->release_params(units[j]), store_->release_grads(units[j]);
}

// The router's backward, in fp32: the same on every tp rank (whole weight gradients, summed
// dweight), so its input gradient joins the partial sum on one rank only. `x` the MLP's
// input rows.
void Gpt::moe_router_backward(int l, int u, const float* unit, float* gunit, const BlockActivations& a,
                              const float* x, int N, int T) {
  const int C = config_.dim, E = config_.moe.experts;
  const int T_whole = T * cp_size();
  const float aux_scale = loss_scale_ * (float)T_whole;  // each sequence's balance loss counts once
  std::vector<double> assignments;  // under cp: the whole sequences' (the forward's sums, again)
  if (cp_ && moe_training_.aux_loss > 0) {
    assignments = moe_group_assignments(config_.moe, moe_training_, a.route, N, T);
    cp_->all_reduce_f64(assignments.data(), assignments.size(), comm::ReduceOp::kSum);
  }
  moe_route_backward(config_.moe, moe_training_, a.router_logits, moe_dweight_, a.route, N, T, aux_scale, loss_scale_,
                     moe_dlogits_, cp_ ? assignments.data() : nullptr, T_whole);
  const ParamTensor& router = layout_.layer(l, kRouterW);
  k::gemm(true, false, E, C, N, 1.0f, moe_dlogits_, E, x, C, 1.0f, grad(u, gunit, router), C);
  if (tp_rank_ == 0) k::gemm(false, false, N, C, E, 1.0f, moe_dlogits_, E, param(u, unit, router), C, 1.0f, partial_, C);
}

// From d(residual3) in dresidual_ to the gradient of the MoE MLP's input (all rows, partial
// over tp) in partial_, adding every expert's, the shared experts' and the router's weight
// gradients.
void Gpt::moe_backward(int l, int u, const float* unit, float* gunit, BlockActivations& a, int B, int T) {
  const int N = B * T, C = config_.dim, k = config_.moe.top_k;
  const int S = config_.moe.shared_experts, M = a.route.offsets[config_.moe.experts], El = layout_.local_experts(l);
  const MoeRoute& r = a.route;
  const std::vector<int> offsets = moe_expert_offsets(a);
  flops_.model += 2 * moe_flops(N, offsets[El]);  // backward: twice the forward's
  const float* dout = gather_rows(dropout_grad(dresidual_, 2 + 2 * l), gathered_);
  moe_choice_grads(a, dout, N);
  // The output gradients leave for the experts' ranks (ep > 1) while the shared experts'
  // backward runs.
  MoeDispatch dispatch;
  if (ep_) dispatch = moe_to_experts_begin(a, moe_dy_, moe_rows_);
  if (S > 0) {  // the shared experts' down projection, while dout is at hand
    k::matmul_backward(moe_dact_, weight_grad(u, gunit, layout_.layer(l, kSharedProjW)), nullptr, dout,
                       hidden_input(a.shared_act), gemm_weight(u, unit, layout_.layer(l, kSharedProjW)), N, S * Fsl_,
                       C, precision_);
    activation_backward(moe_dfch_, a.shared_fch, moe_dact_, N, S * Fsl_);
  }
  // The input again, every row (not stored): dout's buffer is free now.
  const float* x = gather_rows(a.ln2, gathered_);
  if (S > 0) {
    k::matmul_backward(partial_, weight_grad(u, gunit, layout_.layer(l, kSharedFcW)), nullptr, moe_dfch_, x,
                       gemm_weight(u, unit, layout_.layer(l, kSharedFcW)), N, C, S * Fcsl_, precision_);
  } else {
    std::fill(partial_, partial_ + (size_t)N * C, 0.0f);
  }
  // The experts: their output gradients to their ranks (ep > 1), and their input gradients
  // back the same way, replacing the output gradients in moe_dy_, in dispatch order.
  float* dy = moe_dy_;
  const float* rows = moe_rows_;
  if (ep_) {
    moe_to_experts_end(a, dispatch, moe_rows_);
    dy = moe_rows_, rows = a.expert_in;
  } else {
    for (int s = 0; s < M; s++)
      std::memcpy(moe_rows_ + (size_t)s * C, x + (size_t)(r.order[s] / k) * C, sizeof(float) * C);
  }
  moe_experts_backward(l, a, offsets, dy, rows);
  if (ep_) moe_from_experts(a, dy, moe_dy_);
  for (int n = 0; n < N; n++) {  // each token's kept choices, in choice order
    float* dx = partial_ + (size_t)n * C;
    for (int j = 0; j < k; j++) {
      const int slot = r.slot[n * k + j];
      if (slot < 0) continue;
      const float* d = moe_dy_ + (size_t)slot * C;
      for (int c = 0; c < C; c++) dx[c] += d[c];
    }
  }
  moe_router_backward(l, u, unit, gunit, a, x, N, T);
}

}  // namespace meshtrain::model
