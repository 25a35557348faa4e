#include "planner/local.h"

#include <unistd.h>

#include <omp.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <thread>

#include "compress/onebit.h"
#include "core/check.h"
#include "core/memory.h"
#include "kernels/ops.h"
#include "model/gpt.h"
#include "model/param_layout.h"
#include "parallel/pp/schedule.h"
#include "parallel/pp/stages.h"
#include "parallel/shard_layout.h"
#include "planner/local_memory.h"
#include "planner/memory.h"
#include "planner/cluster_file.h"
#include "planner/step_groups.h"
#include "machine/peak.h"

namespace meshtrain::planner {

namespace pp = parallel::pp;

namespace {

// The calibration (seconds per element of the engine's CPU kernels, the shared-memory
// transport's bus bandwidths, the GEMM curve, ...) is data: configs/clusters/presets/local.toml,
// built in, where each figure's measurement is described; Cluster::cpu holds it.

// ---- Time -----------------------------------------------------------------------------------

// A group's view of the network: its size, and whether it crosses hosts (then each
// collective goes over the inter-host link at the group's share of it, planner/placement.h).
struct AxisLink {
  int n = 1;
  bool inter = false;
  double share = 1;  // NICs' worth of the inter-host link this group gets
};

struct Costs {
  double peak = 0;  // FLOP/s of one rank
  GemmEfficiency gemm;
  double bandwidth = 0;  // bytes/s of one rank
  double per_element = 1;  // scale of the per-element costs: cal->memory_bandwidth / bandwidth
  const CpuCalibration* cal = nullptr;
  double latency = 0;
  double link = 1;  // link efficiency: the fraction of the benchmarks' bandwidth
  // The inter-host link (measured bus bandwidths, per NIC) and whether its time counts:
  // waiting on the wire is not CPU work, so the time-sharing account (wire = false) leaves
  // it out and the step adds it back (predict_local).
  Link inter;
  bool wire = true;
  double ce_forward = 0, ce_backward = 0;  // seconds per logit

  double gemm_s(double M, double N, double K) const {
    return M <= 0 || N <= 0 || K <= 0 ? 0 : 2 * M * N * K / (peak * gemm.at(M, N, K));
  }
  double bytes_s(double bytes) const { return bytes / bandwidth; }
  // Collectives over a group, `bytes` the whole tensor (as time_model.cc counts them), of
  // cached (activations) or cold (gradient and parameter buffers) data. Inside a host: the
  // shared-memory transport's measured bus bandwidths; across hosts: the link's, at the
  // tensor's size where the cluster file gives rates by size (as bench_comm's sizes count).
  const CpuCalibration::BusBandwidth& bus(bool cold) const { return cold ? cal->cold : cal->cached; }
  // Across hosts the latency is charged once per collective, not per ring step: on this
  // machine's hosts (more ranks than cores) a small collective waits for its peers to be
  // scheduled, about 100 us for 2 or 4 ranks alike (bench/hosts_comm.sh, every slot busy),
  // where the wire itself takes 31 us.
  double over_wire(const AxisLink& g, double bus_bytes, double bus_bw) const {
    return wire ? inter.latency + bus_bytes / (bus_bw * g.share) : 0;
  }
  double all_reduce_s(double bytes, const AxisLink& g, bool cold = false) const {
    const int n = g.n;
    if (n <= 1) return 0;
    if (g.inter) return over_wire(g, 2.0 * (n - 1) / n * bytes, inter.rate(Link::Collective::kAllReduce, bytes));
    return 2.0 * (n - 1) * latency + 2.0 * (n - 1) / n * bytes / (bus(cold).all_reduce * link);
  }
  double reduce_scatter_s(double bytes, const AxisLink& g, bool cold = false) const {
    const int n = g.n;
    if (n <= 1) return 0;
    if (g.inter) return over_wire(g, (double)(n - 1) / n * bytes, inter.rate(Link::Collective::kReduceScatter, bytes));
    return (n - 1) * latency + (double)(n - 1) / n * bytes / (bus(cold).reduce_scatter * link);
  }
  double all_gather_s(double bytes, const AxisLink& g, bool cold = false) const {
    const int n = g.n;
    if (n <= 1) return 0;
    if (g.inter) return over_wire(g, (double)(n - 1) / n * bytes, inter.rate(Link::Collective::kAllGather, bytes));
    return (n - 1) * latency + (double)(n - 1) / n * bytes / (bus(cold).all_gather * link);
  }
  // An all-to-all moves what a reduce-scatter does, (n-1)/n of the bytes, but adds nothing:
  // a copy, at the all-gather's rate.
  double all_to_all_s(double bytes, const AxisLink& g) const {
    const int n = g.n;
    if (n <= 1) return 0;
    if (g.inter) return over_wire(g, (double)(n - 1) / n * bytes, inter.rate(Link::Collective::kAllGather, bytes));
    return (n - 1) * latency + (double)(n - 1) / n * bytes / (bus(false).all_gather * link);
  }
  // Point-to-point inside a host at the all-gather's rate (two ranks' all-gather of 2x the
  // bytes is one exchange of `bytes` each way, as the tied embedding's swap is). Across
  // hosts at a pair's rate: the cluster file's all-reduce figure, which is one rank per
  // host (a pair's all-reduce of 2x the bytes sends `bytes` each way), shared with the
  // other pairs crossing at once (AxisLink::share). Until 2026-12-05 this took the
  // all-gather figure, measured with all 4 ranks in one group, which already counts two
  // ranks per host on the link, and then shared it again: pp2 dp2 with pp across the link
  // was predicted at 1.24-1.36x its runs (bench/README.md).
  double p2p_s(double bytes, const AxisLink& g, bool cold = false) const {
    if (g.inter) return over_wire(g, bytes, inter.rate(Link::Collective::kAllReduce, 2 * bytes));
    return latency + bytes / (bus(cold).all_gather * link);
  }
};

// The compressed phase of `train --compress` (parallel/dp/compressed_reduce.h and
// onebit_adam.h): what a step sends over dp, at the link's rates, plus the compressor's
// compute on the rank's cores.
//   PowerSGD: three all-reduces (every P, every Q, the exact elements); per matrix the three
//     GEMMs (P = MQ, Q = MᵀP, PQᵀ) and five passes over it (M += error, error and M from PQᵀ).
//   1-bit Adam: an all-to-all and an all-gather of N 1-bit chunks (charged as a
//     reduce-scatter's and an all-gather's volume, which is what each rank sends), the
//     compression of N + 1 chunks and four decompressions of N, the momentum's passes, and
//     the norm's scalar all-reduce.
double compressed_reduction_s(const model::ParamLayout& layout, const Layout& l, const AxisLink& dp, const Costs& k) {
  const parallel::Compression& cz = l.compression;
  if (cz.kind == parallel::Compression::Kind::kPowerSgd) {
    double p = 0, q = 0, exact = (double)layout.total(), work = 0;
    for (const model::ParamTensor& t : layout.tensors()) {
      if (t.shape.size() != 2) continue;
      const double n = (double)t.shape[0], m = (double)t.shape[1], r = std::min<double>({(double)cz.rank, n, m});
      if (cz.rank * (n + m) >= n * m) continue;
      p += n * r, q += m * r, exact -= n * m;
      work += k.gemm_s(n, r, m) + k.gemm_s(m, r, n) + k.gemm_s(n, m, r) + k.bytes_s(20 * n * m);
    }
    return k.all_reduce_s(4 * p, dp, true) + k.all_reduce_s(4 * q, dp, true) + k.all_reduce_s(4 * exact, dp, true) + work;
  }
  const int N = dp.n;
  size_t chunk = 0;
  for (const model::ParamUnit& u : layout.units()) chunk += (u.numel + N - 1) / N;
  const double bytes = (double)N * (double)compress::onebit_chunk_bytes(chunk, cz.scale_block);
  const double elements = (double)N * (double)chunk;
  const double work = ((elements + chunk) * k.cal->onebit_compress_s + 4 * elements * k.cal->onebit_decompress_s) * k.per_element +
                      k.bytes_s(24 * elements);
  return k.reduce_scatter_s(bytes, dp, true) + k.all_gather_s(bytes, dp, true) + work + k.all_reduce_s(8, dp);
}

// One tp rank's shapes for a B x T micro-batch (with cp its T/cp rows of each sequence, T
// the sequence).
struct Dims {
  double B, T, N, Nl, C, Cl, Fl, NHl, hs, vn;
  double NKVl = 0;  // key/value heads on the rank
  AxisLink tp, cp;
  model::CpComm cp_comm = model::CpComm::kRing;
  int cp_a2a = 1;                    // hybrid: its all-to-all groups' size
  AxisLink cp_a2a_link, cp_across;  // hybrid: those groups, and the ring across them
  bool sp;
};

double attention_score_elements(int T) {  // S of one (sequence, head)
  double s = 0;
  for (int i0 = 0; i0 < T; i0 += kAttentionBlock) {
    const int rows = std::min(kAttentionBlock, T - i0);
    s += (double)rows * (i0 + rows);
  }
  return s;
}

// S under cp: this rank's rows (CpSplit's two chunks) against the keys each sees, in the
// kernel's 64-row blocks. The ring's blocks of T/cp keys cut the same spans.
double cp_score_elements(int T, int cp) {
  const int c = T / (2 * cp);
  double s = 0;
  for (int chunk : {0, 2 * cp - 1})  // rank 0's
    for (int i0 = 0; i0 < c; i0 += kAttentionBlock) {
      const int rows = std::min(kAttentionBlock, c - i0);
      s += (double)rows * (chunk * c + i0 + rows);
    }
  return s;
}

struct LocalLayerTime {
  double gemm_f = 0, mem_f = 0, comm_f = 0, attn_f = 0;
  double gemm_b = 0, mem_b = 0, comm_b = 0, attn_b = 0;
  double cp_f = 0, cp_b = 0;  // context parallelism's exchanges (counted with the CPU's work)
  double recompute = 0, recompute_comm = 0;
  double forward() const { return gemm_f + mem_f + comm_f + attn_f + cp_f; }
  double backward() const { return gemm_b + mem_b + comm_b + attn_b + cp_b + recompute + recompute_comm; }
};

// Context parallelism per layer and micro-batch (model/context_parallel.h; the bytes of
// docs/long_context.md): the ring's k, v block sent cp-1 times each way and its dk, dv sums
// cp times, with a merge of each block's partial output; Ulysses' all-to-alls of q, k, v and
// the output (cp-1 of cp shares leave the rank), again in the backward with the output's
// gradient; all-gather's gather of k, v each way and the reduce-scatter of their gradients;
// hybrid's all-to-alls inside its groups, then the ring across them on the group's rows.
// On this machine every exchange is a copy on the same cores: none is hidden.
void local_cp_time(const Dims& d, int cp, const Costs& k, LocalLayerTime* lt) {
  if (cp <= 1) return;
  const double N = d.N, kv = N * 2 * d.NKVl * d.hs * 4;
  // The ring of n ranks over `rows` rows of `cl` query and `kv_heads` key/value columns.
  auto ring = [&](int n, double rows, double cl, double kv_heads, const AxisLink& link) {
    const double block = rows * 2 * kv_heads * d.hs * 4;
    lt->cp_f += (n - 1) * (k.p2p_s(block, link) + k.bytes_s(rows * cl * 4 * 3));
    lt->cp_b += (2 * n - 1) * k.p2p_s(block, link);
  };
  auto ulysses = [&](const AxisLink& link) {  // (the rank's own q, k, v and output, traded)
    const double qkv = N * (d.Cl * 4 + kv / N), out = N * d.Cl * 4;
    lt->cp_f += k.all_to_all_s(qkv, link) + k.all_to_all_s(out, link);
    lt->cp_b += k.all_to_all_s(qkv + out, link) + k.all_to_all_s(out, link) + k.all_to_all_s(qkv, link);
  };
  switch (d.cp_comm) {
    case model::CpComm::kRing:
      return ring(cp, N, d.Cl, d.NKVl, d.cp);
    case model::CpComm::kAllGather:
      lt->cp_f = k.all_gather_s(cp * kv, d.cp);
      lt->cp_b = k.all_gather_s(cp * kv, d.cp) + k.reduce_scatter_s(cp * kv, d.cp);
      return;
    case model::CpComm::kA2a:
      return ulysses(d.cp);
    case model::CpComm::kHybrid: {
      const int a = d.cp_a2a;
      ulysses(d.cp_a2a_link);
      return ring(cp / a, N * a, d.Cl / a, d.NKVl >= a ? d.NKVl / a : 1, d.cp_across);
    }
  }
}

LocalLayerTime local_layer_time(const Dims& d, int cp, model::Recompute r, const Costs& k) {
  LocalLayerTime lt;
  const double N = d.N, Nl = d.Nl, C = d.C, Cl = d.Cl, Fl = d.Fl;
  // The four linear layers (in, out) of this rank's slice: QKV, projection, fc, fc proj.
  const double linears[4][2] = {{C, 3 * Cl}, {Cl, C}, {C, Fl}, {Fl, C}};
  for (const auto& [in, out] : linears) {
    lt.gemm_f += k.gemm_s(N, out, in);                    // out = inp W^T
    lt.gemm_b += k.gemm_s(N, in, out) + k.gemm_s(out, in, N);  // dinp, dweight
  }
  // Attention: the fused kernel per (sequence, local head); with cp a rank's rows against
  // the keys they see (Ulysses: the whole sequences of NHl/cp heads).
  // (hybrid: its group's rows, a ring rank's of cp / cp_a2a, with NHl / cp_a2a heads.)
  const bool whole = cp == 1 || d.cp_comm == model::CpComm::kA2a;
  const int a = d.cp_comm == model::CpComm::kHybrid ? d.cp_a2a : 1;
  const double S = whole ? attention_score_elements((int)(d.T * cp)) : cp_score_elements((int)(d.T * cp), cp / a);
  const double heads = whole ? d.B * d.NHl / cp : d.B * d.NHl / a;
  const double eff = k.peak * k.gemm.at(kAttentionBlock, std::min<double>(d.T, kAttentionBlock), d.hs);
  const double blocks = std::ceil(d.T / kAttentionBlock);
  lt.attn_f = heads * (S * k.cal->attention_forward_element_s * k.per_element + 4 * S * d.hs / eff);
  lt.attn_b = heads * (S * k.cal->attention_backward_element_s * k.per_element + blocks * k.cal->attention_backward_block_s +
                       10 * S * d.hs / eff);
  // Elementwise: 2 LayerNorms (8 B per element forward, 16 backward), the QKV and fc bias
  // seeding (4 B), the 2 branch bias adds (8 B) and residual adds (12 B), GELU; backward
  // the bias gradients (4 B over each linear's output).
  lt.mem_f = k.bytes_s(2 * Nl * C * 8 + N * (3 * Cl + Fl) * 4 + 2 * Nl * C * 8 + 2 * Nl * C * 12) +
             N * Fl * k.cal->gelu_forward_s * k.per_element;
  lt.mem_b = k.bytes_s(2 * Nl * C * 16 + N * (3 * Cl + C + Fl + C) * 4) + N * Fl * k.cal->gelu_backward_s * k.per_element;
  // Tensor parallelism (model/gpt.cc): two reductions of the row-parallel outputs forward
  // and of the column-parallel input gradients backward (all-reduce, or reduce-scatter with
  // sp); with sp, all-gathers before both column-parallel linears forward and four
  // backward, and the LayerNorm weight gradients all-reduced.
  const double act = N * C * 4;
  const double reduce = d.sp ? k.reduce_scatter_s(act, d.tp) : k.all_reduce_s(act, d.tp);
  lt.comm_f = 2 * reduce + (d.sp ? 2 * k.all_gather_s(act, d.tp) : 0);
  lt.comm_b = 2 * reduce + (d.sp ? 4 * k.all_gather_s(act, d.tp) + 2 * k.all_reduce_s(2 * C * 4, d.tp) : 0);
  switch (r) {
    case model::Recompute::kNone:
      break;
    case model::Recompute::kSelective:
      lt.recompute = lt.attn_f;
      break;
    case model::Recompute::kFull:
      lt.recompute = lt.gemm_f + lt.mem_f + lt.attn_f;
      lt.recompute_comm = lt.comm_f;
      break;
  }
  local_cp_time(d, cp, k, &lt);
  if (r != model::Recompute::kNone) lt.recompute += lt.cp_f;  // attention runs again, and its exchange
  return lt;
}

// What one step's time depends on besides the costs: the shapes, the stages and where each
// axis's groups sit.
struct StepContext {
  const model::GptConfig* config = nullptr;
  const Layout* layout = nullptr;
  const std::vector<model::ModelPart>* parts = nullptr;
  model::Recompute recompute = model::Recompute::kNone;
  int m = 1;  // micro-batches
  Dims dims;
  AxisLink dp, pp, world;  // tp is dims.tp
};

// One group of the step (planner/step_groups.h) as this machine's transport sees it.
AxisLink link_of(const PlacedGroup& g) { return {g.size, g.placement.crosses_hosts, g.placement.nic_share}; }

StepContext step_context(const model::GptConfig& config, const Layout& l, const Cluster& c, int T,
                         const std::vector<model::ModelPart>& parts, model::Recompute recompute) {
  StepContext x;
  x.config = &config, x.layout = &l, x.parts = &parts, x.recompute = recompute;
  const int t = l.tp, B = l.micro_batch;
  x.m = l.global_batch / (B * l.dp);
  Dims& dims = x.dims;
  const StepGroups groups = step_groups(l, c);
  dims.tp = link_of(groups.tp);
  x.dp = link_of(groups.dp);
  dims.cp = link_of(groups.cp);
  dims.cp_comm = l.cp_comm;
  if (l.cp > 1 && l.cp_comm == model::CpComm::kHybrid) {
    dims.cp_a2a = l.cp_a2a;
    dims.cp_a2a_link = link_of(groups.cp_a2a), dims.cp_across = link_of(groups.cp_across);
  }
  // Gradients reduce over dp x cp: both groups' ranks, crossing hosts if either does.
  if (l.cp > 1) x.dp = {l.dp * l.cp, x.dp.inter || dims.cp.inter, std::min(x.dp.share, dims.cp.share)};
  x.pp = link_of(groups.pp);
  x.world = link_of(groups.world);
  dims.B = B, dims.T = (double)T / l.cp, dims.N = (double)B * T / l.cp, dims.sp = l.sp && t > 1;
  dims.NKVl = config.kv_heads_per_rank(t);
  dims.Nl = dims.sp ? dims.N / t : dims.N;
  dims.C = config.dim, dims.Cl = (double)config.dim / t, dims.Fl = 4.0 * config.dim / t;
  dims.NHl = (double)config.heads / t, dims.hs = (double)config.dim / config.heads;
  dims.vn = std::min(config.vocab, config.padded_vocab() / t);  // tp rank 0's real columns
  return x;
}

// Every pipeline rank's time in one step (tp rank 0, dp rank 0), by one set of costs.
struct StepTimes {
  LocalLayerTime layer;
  std::vector<double> busy, tail;  // per pipeline rank: its micro-batches' work; the step around them
  double tf = 0, tb = 0;           // the slowest chunk's forward and backward
  double extra_first = 0, extra_last = 0;  // embedding and head, per micro-batch
  double dp_total = 0, tp_total = 0, pp_total = 0, cp_total = 0, opt_s = 0;
};

// The embedding's and head's work per micro-batch (first and last stage) with the tp
// collectives around them, and the pipeline sends: what a rank's chunks add to their layers.
struct LocalEdges {
  double reduce_rows = 0, gather_rows = 0;  // one tp reduction (gather, with sp) of N x C rows
  double emb_f = 0, emb_b = 0, head_f = 0, head_b = 0;
  double send_f = 0, send_b = 0;
};

LocalEdges local_edges(const StepContext& x, const Costs& k) {
  const Dims& dims = x.dims;
  const int p = x.layout->pp;
  LocalEdges g;
  const double N = dims.N, Nl = dims.Nl, C = dims.C, act = N * C * 4;
  g.reduce_rows = dims.sp ? k.reduce_scatter_s(act, dims.tp) : k.all_reduce_s(act, dims.tp);
  g.gather_rows = dims.sp ? k.all_gather_s(act, dims.tp) : 0;
  // Embedding (first stage): lookup and position add, its tp reduction; backward the
  // scatter-add of its gradient.
  g.emb_f = k.bytes_s(N * C * 12) + g.reduce_rows;
  g.emb_b = k.bytes_s(N * C * 12) + g.gather_rows;
  // Head (last stage): final LayerNorm, the tied head GEMM over this rank's vocabulary
  // columns, the vocabulary-parallel cross-entropy (three all-reduces of N values);
  // backward its two GEMMs, the input gradient's reduction, the LayerNorm backward.
  g.head_f = k.bytes_s(Nl * C * 8) + g.gather_rows + k.gemm_s(N, dims.vn, C) + N * dims.vn * k.ce_forward +
             3 * k.all_reduce_s(N * 4, dims.tp);
  g.head_b = N * dims.vn * k.ce_backward + k.gemm_s(N, C, dims.vn) + k.gemm_s(dims.vn, C, N) + g.reduce_rows +
             k.bytes_s(Nl * C * 4 + Nl * C * 16) + (dims.sp ? k.all_reduce_s(2 * C * 4, dims.tp) : 0);
  // Pipeline sends: the boundary tensor (Nl x C), gradients copied before they go.
  g.send_f = p > 1 ? k.p2p_s(Nl * C * 4, x.pp) : 0;
  g.send_b = p > 1 ? k.p2p_s(Nl * C * 4, x.pp) + k.bytes_s(Nl * C * 8) : 0;
  return g;
}

// One pipeline rank's micro-batches: its chunks' work, and its tp and pp communication for
// the per-axis account. Raises st->tf and st->tb to its slowest chunk's.
struct RankWork {
  double busy = 0, tp_s = 0, pp_s = 0, cp_s = 0;
};

RankWork rank_work(const StepContext& x, const Costs& k, const LocalEdges& g, const model::ModelPart& part,
                   StepTimes* st) {
  const model::GptConfig& config = *x.config;
  const LocalLayerTime& lt = st->layer;
  const int m = x.m;
  RankWork w;
  double layers = 0, f = 0, b = 0, extra = 0;
  const auto chunks = part.chunks.empty() ? std::vector<model::ModelPart::Chunk>{{0, config.layers}} : part.chunks;
  for (const auto& ch : chunks) {
    const double n = ch.end - ch.begin;
    layers += n;
    const double cf = n * lt.forward() + (ch.end < config.layers ? g.send_f : 0);
    const double cb = n * lt.backward() + (ch.begin > 0 ? g.send_b : 0);
    f += cf, b += cb;
    st->tf = std::max(st->tf, cf), st->tb = std::max(st->tb, cb);
    if (ch.begin == 0) extra += g.emb_f + g.emb_b;
    if (ch.end == config.layers) extra += g.head_f + g.head_b;
  }
  w.busy = m * (f + b + extra);
  const double tp_layer = lt.comm_f + lt.comm_b + lt.recompute_comm;
  w.tp_s = m * layers * tp_layer;
  // (Recomputation runs attention's exchange again.)
  w.cp_s = m * layers * (lt.cp_f + lt.cp_b + (x.recompute != model::Recompute::kNone ? lt.cp_f : 0));
  for (const auto& ch : chunks) {
    if (ch.begin == 0) w.tp_s += m * (g.reduce_rows + g.gather_rows);
    if (ch.end == config.layers)
      w.tp_s += m * (2 * g.gather_rows + 3 * k.all_reduce_s(x.dims.N * 4, x.dims.tp) + g.reduce_rows);
  }
  for (const auto& ch : chunks)
    w.pp_s += m * ((ch.end < config.layers ? g.send_f : 0) + (ch.begin > 0 ? g.send_b : 0));
  return w;
}

// A rank's parameter elements: all of them, the shards it owns, and its units padded for
// their dp shards.
struct RankElements {
  double total = 0, owned = 0, padded = 0;
};

RankElements rank_elements(const model::ParamLayout& layout, const parallel::ShardLayout& shards) {
  RankElements n;
  n.total = (double)layout.total();
  for (int u = 0; u < layout.num_units(); u++) {
    n.owned += (double)(shards.own_end(u) - shards.own_begin(u));
    n.padded += (double)shards.units()[u].padded;
  }
  return n;
}

// Data parallelism and ZeRO on one rank: inside a host the collectives and the copies
// around them are CPU work on the same cores as compute (Open MPI's shared-memory
// transport copies and reduces on them), so every byte counts.
double rank_dp_s(const StepContext& x, const Costs& k, const model::ParamLayout& layout, const RankElements& n) {
  const Layout& l = *x.layout;
  const int d = l.dp * l.cp, m = x.m;  // the gradient group
  const double total = n.total, owned = n.owned, padded = n.padded;
  double dp_s = 0;
  const bool compressed = l.compression.kind != parallel::Compression::Kind::kNone;
  // ZeRO++ (parallel/dp/quantized_comm.h): a quantized gather or reduce-scatter moves the
  // padded unit's int8 blocks, a byte and 4 / block bytes of scale per value, and costs the
  // rank its quantization and decoding (a gather: its shard quantized, every shard decoded;
  // a reduce-scatter: N-1 chunks quantized and N-1 decoded).
  const parallel::QuantizedComm& qz = l.quantized;
  const double int8_bytes = padded * (1.0 + 4.0 / (double)qz.block);
  const double gather_bytes = qz.weights ? int8_bytes : 4 * padded;
  const double scatter_bytes = qz.grads ? int8_bytes : 4 * padded;
  const double gather_work = qz.weights ? (padded / d * k.cal->int8_quantize_s + padded * k.cal->int8_dequantize_s) * k.per_element : 0;
  const double scatter_work =
      qz.grads ? (double)(d - 1) / d * padded * (k.cal->int8_quantize_s + k.cal->int8_dequantize_s) * k.per_element : 0;
  const parallel::DpStep step = parallel::dp_step(l);
  if (d > 1 && compressed) {
    dp_s = compressed_reduction_s(layout, l, x.dp, k);
    if (l.zero == 1) dp_s += k.all_gather_s(4 * padded, x.dp, true) + k.bytes_s(12 * padded);
  } else if (d > 1) {
    switch (l.zero) {
      case 0:
        dp_s = k.all_reduce_s(4 * total, x.dp, true);
        break;
      case 1:  // reduce-scatter of zero-padded copies after the last micro-batch
        dp_s = k.bytes_s(4 * padded + 8 * total + 8 * owned) + k.reduce_scatter_s(scatter_bytes, x.dp, true) +
               scatter_work;
        break;
      default: {  // 2, 3: every micro-batch (once per step under pp) reduce-scatters the staging
        const double reduce =
            k.bytes_s(4 * padded + 12 * owned) + k.reduce_scatter_s(scatter_bytes, x.dp, true) + scatter_work;
        // ZeRO-3's parameters gathered at every use, or once per step and kept (parallel::DpStep).
        const double gather = l.zero == 3 ? k.all_gather_s(gather_bytes, x.dp, true) + gather_work : 0;
        const double per_use = step.gathers_per_use_step * gather, kept = step.keep_gathered ? gather : 0;
        const int reductions = step.reduces_per_micro_batch ? m : 1;
        // The usual pairs (reduce and gather per micro-batch, or both once per step) as one
        // window repeated; --zero3-gather's other choices apart.
        dp_s = step.keep_gathered == !step.reduces_per_micro_batch ? reductions * (reduce + per_use + kept)
                                                                   : reductions * reduce + m * per_use + kept;
      }
    }
    if (l.zero == 1 || l.zero == 2) dp_s += k.all_gather_s(4 * padded, x.dp, true) + k.bytes_s(12 * padded);
  }
  return dp_s;
}

// The step around pipeline rank r's micro-batches: zeroing the gradients, dp and ZeRO, the
// tied embedding's swap (added to *pp_s) and the optimizer; grad-norm reductions are latency.
void rank_tail(const StepContext& x, const Costs& k, int r, double tp_s, double* pp_s, StepTimes* st) {
  const model::GptConfig& config = *x.config;
  const Layout& l = *x.layout;
  const int t = l.tp, p = l.pp, d = l.dp * l.cp;  // ZeRO shards over dp x cp
  const model::ParamLayout layout(config, t, 0, (*x.parts)[r]);
  const parallel::ShardLayout shards(layout, d, 0);
  const RankElements n = rank_elements(layout, shards);
  const double total = n.total, owned = n.owned, padded = n.padded;
  // Under a pipeline ZeRO-2/3 reduce (and ZeRO-3 gathers) once per step, from whole
  // staging buffers that are zeroed as they are taken.
  const bool once_per_step = l.zero >= 2 && parallel::dp_step(l).reduce_once_per_step;
  const double zero_grads = k.bytes_s(4 * (l.zero >= 2 ? (double)shards.local_total() : total)) +
                            (once_per_step ? k.bytes_s(4 * padded) : 0);
  const double dp_s = rank_dp_s(x, k, layout, n);
  // The tied embedding's gradients swapped between the first and last stage.
  double tied = 0;
  if (p > 1 && (r == 0 || r == p - 1) && !layout.has_untied_head()) {
    const int E = layout.embedding_unit();
    const double numel =
        l.zero == 0 ? (double)layout.units()[E].numel : (double)(shards.own_end(E) - shards.own_begin(E));
    tied = k.p2p_s(4 * numel, x.pp, true) + k.bytes_s(12 * numel);
    *pp_s += tied;
  }
  // Optimizer: the global norm (fixed-order fp64 sum) and its reductions over the world,
  // clipping (8 B), AdamW (28 B).
  const double n_opt = l.zero == 0 ? total : owned;
  // 2bw: the weights copied into the previous version before the update (8 B).
  const double versions = pp::never_flushes(l.schedule) ? k.bytes_s(8 * total) : 0;
  const double opt = n_opt * k.cal->sum_of_squares_s * k.per_element + k.bytes_s(n_opt * 36) + versions +
                     3 * k.all_reduce_s(8, x.world.inter ? x.world : AxisLink{2});
  st->tail[r] = zero_grads + dp_s + tied + opt;
  if (r == 0) st->dp_total = dp_s, st->tp_total = tp_s, st->opt_s = opt;
}

StepTimes step_times(const StepContext& x, const Costs& k) {
  const int p = x.layout->pp;
  StepTimes st;
  st.busy.assign(p, 0), st.tail.assign(p, 0);
  st.layer = local_layer_time(x.dims, x.layout->cp, x.recompute, k);
  const LocalEdges g = local_edges(x, k);
  st.extra_first = g.emb_f + g.emb_b, st.extra_last = g.head_f + g.head_b;
  for (int r = 0; r < p; r++) {
    const RankWork w = rank_work(x, k, g, (*x.parts)[r], &st);
    st.busy[r] = w.busy;
    double pp_s = w.pp_s;
    rank_tail(x, k, r, w.tp_s, &pp_s, &st);
    st.pp_total = std::max(st.pp_total, pp_s);
    if (r == 0) st.cp_total = w.cp_s;
  }
  return st;
}

}  // namespace

Cluster local_cluster(int threads_per_rank, double peak_gflops_fp32, double peak_gflops_bf16) {
  const int threads = std::max(1, threads_per_rank);
  using kernels::Precision;
  if (peak_gflops_fp32 <= 0) peak_gflops_fp32 = machine::cached_gemm_peak_gflops(threads, false, Precision::kFp32);
  if (peak_gflops_bf16 <= 0) peak_gflops_bf16 = machine::cached_gemm_peak_gflops(threads, false, Precision::kBf16);
  // What the machine has (measured or asked of the OS), then the calibration's figures.
  Cluster c;
  c.name = "local";
  c.peak_flops_32 = peak_gflops_fp32 * 1e9;
  c.peak_flops_16 = peak_gflops_bf16 * 1e9;
  const double pages = (double)::sysconf(_SC_PHYS_PAGES), page = (double)::sysconf(_SC_PAGE_SIZE);
  c.memory_bytes = pages > 0 && page > 0 ? pages * page : 16e9;
  c.cores = (int)std::max(1u, std::thread::hardware_concurrency());
  std::string text;
  Status read = builtin_cluster_text("local", &text);
  if (read.is_ok()) read = apply_cluster_toml(text, "configs/clusters/presets/local.toml (built in)", &c);
  CHECK_MSG(read.is_ok(), read.message().c_str());  // built-in data, held by test_planner_local
  c.reserved_bytes = std::min(c.reserved_bytes, c.memory_bytes / 2);
  c.hbm_bandwidth = c.cpu.memory_bandwidth * std::min(threads, c.cores);
  read = validate(c);
  CHECK_MSG(read.is_ok(), read.message().c_str());
  return c;
}

Cluster measure_local_cluster(int threads_per_rank) {
  const int threads = std::max(1, threads_per_rank);
  const double peak = machine::measure_gemm_peak_gflops(threads, kernels::Precision::kFp32);
  Cluster c = local_cluster(threads, peak, 0);
  omp_set_num_threads(threads);
  using Clock = std::chrono::steady_clock;
  auto median_s = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  // The engine's linear layers for 256 tokens of width 256: QKV, projection, fc and fc
  // projection shapes, forward (NT), input gradient (NN) and weight gradient (TN), each call
  // on operands 4 MB apart from the last so that it starts from cold caches.
  const size_t stride = (size_t)1 << 20, sets = 14;
  std::vector<float> a(stride * sets), b(stride * sets), out(stride * sets);
  const int shapes[4][3] = {{256, 768, 256}, {256, 256, 256}, {256, 1024, 256}, {256, 256, 1024}};
  double flops = 0, seconds = 0;
  size_t next = 0;
  for (const auto& s : shapes)
    for (int kind = 0; kind < 3; kind++) {
      const bool ta = kind == 2, tb = kind == 0;
      std::vector<double> times;
      for (int rep = 0; rep < 8; rep++) {
        const size_t o = (next++ % sets) * stride;
        const auto t0 = Clock::now();
        kernels::gemm(ta, tb, s[0], s[1], s[2], 1.0f, a.data() + o, ta ? s[0] : s[2], b.data() + o,
                      tb ? s[2] : s[1], 1.0f, out.data() + o, s[1]);
        if (rep > 0) times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
      }
      flops += 2.0 * s[0] * s[1] * s[2];
      seconds += median_s(times);
    }
  const double fraction = flops / seconds / c.peak_flops_32;
  c.gemm.max_fraction = std::min(1.0, fraction * (256 + c.gemm.half_dim) / 256);
  // Memory bandwidth: copies of 32 MB.
  std::vector<double> times;
  const size_t n = (size_t)8 << 20;
  for (int rep = 0; rep < 6; rep++) {
    const auto t0 = Clock::now();
    std::copy(a.data(), a.data() + n, out.data());
    if (rep > 0) times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  c.hbm_bandwidth = 8.0 * n / median_s(times) * std::min(threads, c.cores);
  // The cross-entropy over a GPT-2 vocabulary: 64 rows of 50304 logits (12.9 MB, the
  // reused a and out buffers), forward and backward. Its cost per logit varies 3-4x between
  // machines (2.0 and 1.0 ns on the AMX Xeon of the built-in constants, 0.46 and 0.34 ns on an
  // AMD EPYC), more than memory bandwidth explains.
  const int rows = 64, vocab = 50304;
  std::vector<float> lse(rows), target_logit(rows);
  std::vector<int> targets(rows);
  for (int r = 0; r < rows; r++) targets[r] = (r * 7919) % vocab;
  std::vector<double> forward, backward;
  for (int rep = 0; rep < 4; rep++) {
    const auto t0 = Clock::now();
    kernels::crossentropy_forward(lse.data(), target_logit.data(), a.data(), targets.data(), rows, vocab, vocab, 0);
    const auto t1 = Clock::now();
    kernels::crossentropy_backward(out.data(), a.data(), lse.data(), targets.data(), 1.0f / rows, rows, vocab, vocab, 0);
    const auto t2 = Clock::now();
    if (rep == 0) continue;
    forward.push_back(std::chrono::duration<double>(t1 - t0).count());
    backward.push_back(std::chrono::duration<double>(t2 - t1).count());
  }
  c.cross_entropy_forward_s = median_s(forward) / ((double)rows * vocab);
  c.cross_entropy_backward_s = median_s(backward) / ((double)rows * vocab);
  return c;
}

namespace {

// What the local predictor models: a valid model and layout, fp32, no zero-bubble
// schedule, no context or expert parallelism. `T` the sequence length.
Status check_local(const model::GptConfig& config, const Layout& l, const LocalRun& run, const Cluster& c, int T) {
  if (T > config.max_seq_len) return Status::error("seq (" + std::to_string(T) + ") exceeds the model's max_seq_len");
  const ModelShape shape = model_shape(config, T);
  RETURN_IF_ERROR(validate(shape, l, parallel::layout_model(config), parallel::LayoutReader::kLocalPlanner));
  RETURN_IF_ERROR(validate(c));
  RETURN_IF_ERROR(check_fits_nodes(l, c));
  if (l.precision != Precision::kFp32)
    return Status::error(std::string("precision ") + precision_name(l.precision) +
                         ": the local predictor models fp32 runs only (16-bit storage is not modelled yet)");
  // (The compressors' restrictions: validate().)
  if (run.threads < 1) return Status::error("threads must be >= 1");
  if (pp::splits_backward(l.schedule))
    return Status::error(std::string("schedule ") + pp::schedule_name(l.schedule) +
                         ": the local predictor does not model zero-bubble schedules yet (the GPU planner does)");
  // Element-wise recompute is a technique of the GPU stacks the GPU planner prices; this
  // engine keeps the norms' and activation's outputs.
  if (l.elementwise_recompute)
    return Status::error("element-wise recompute: the engine keeps the norms' and activation's outputs (the GPU "
                         "planner prices it)");
  // The replay lays out dense-partitioned ranks: an ep layout is skipped, not mispredicted.
  if (l.ep > 1)
    return Status::error("ep " + std::to_string(l.ep) + ": the local predictor does not model expert parallelism yet");
  if (l.whole_experts())
    return Status::error("expert_tp 1: the local predictor does not model whole experts on tp ranks yet");
  if (l.sp && ((int64_t)l.micro_batch * T) % l.tp != 0)
    return Status::error("sp needs micro_batch x seq divisible by tp");
  return Status::ok();
}

// Memory, pipeline rank by pipeline rank (tp rank 0, dp rank 0), by replaying the engine's
// allocations: each rank's peaks and the breakdown at its peak. Fills `parts`, each rank's
// share of the model.
struct LocalMemory {
  std::vector<EngineMemory> peaks;
  std::vector<MemoryBreakdown> breakdown;
};

Status local_memory(const model::GptConfig& config, const Layout& l, const LocalRun& run, int T,
                    std::vector<model::ModelPart>* parts, LocalMemory* out) {
  const int t = l.tp, p = l.pp, d = l.dp, v = l.virtual_stages, B = l.micro_batch;
  const int m = l.global_batch / (B * d);
  std::vector<int> stage_layers;
  if (p > 1) RETURN_IF_ERROR(pp::split_layers(config, B, T, p * v, run.stage_layers, &stage_layers));
  const model::Recompute recompute = l.recompute;
  // With cp a rank's sets hold its T/cp rows of each sequence; ZeRO shards over dp x cp.
  const model::ActivationInventory inv = model::activation_inventory(config, B, T / l.cp, t, l.sp);
  out->peaks.assign(p, EngineMemory{});
  out->breakdown.assign(p, MemoryBreakdown{});
  parts->assign(p, model::ModelPart{});
  for (int r = 0; r < p; r++) {
    if (p > 1) (*parts)[r] = pp::rank_part(stage_layers, p, r);
    const model::ParamLayout layout(config, t, 0, (*parts)[r]);
    const parallel::ShardLayout shards(layout, d * l.cp, 0);
    const RankMemory rm =
        replay_rank_memory(config, layout, shards, (*parts)[r], inv, recompute, l, m, T, run.threads, r);
    out->peaks[r] = rm.peaks;
    out->breakdown[r] = rm.at_peak;
  }
  return Status::ok();
}

// The costs of one rank on cluster `c` (measured or built in, local_cluster).
Costs local_costs(const Layout& l, const Cluster& c) {
  Costs k;
  k.peak = c.peak_flops(l.precision);
  k.gemm = c.gemm;
  k.bandwidth = c.hbm_bandwidth * c.hbm_efficiency;
  // Per-element costs were measured on one thread at cpu.memory_bandwidth: they scale with the
  // threads and with the machine's measured speed (measure_local_cluster) through it.
  k.cal = &c.cpu;
  k.per_element = c.cpu.memory_bandwidth / k.bandwidth;
  k.latency = c.intra.latency;
  k.link = c.link_efficiency;
  k.inter = c.inter;
  k.ce_forward = c.cross_entropy_forward_s > 0 ? c.cross_entropy_forward_s : c.cpu.cross_entropy_forward_s * k.per_element;
  k.ce_backward = c.cross_entropy_backward_s > 0 ? c.cross_entropy_backward_s : c.cpu.cross_entropy_backward_s * k.per_element;
  return k;
}

// The step's time from every rank's: the pipeline at full speed, by the engine's schedule
// generator on the slowest chunk's costs (the first and last stages' extra work lies on the
// critical path of every micro-batch, as in predict()), stretched where the ranks
// time-share the cores. `full` has every cost, `cpu_times` the CPU work alone.
Status local_step(const model::GptConfig& config, const Layout& l, const LocalRun& run, const Cluster& c, int T,
                  const StepTimes& full, const StepTimes& cpu_times, double peak, Prediction* out) {
  Prediction& pr = *out;
  const int t = l.tp, p = l.pp, d = l.dp, v = l.virtual_stages, m = pr.micro_batches;
  pp::SimResult sim;
  RETURN_IF_ERROR(pp::simulate(l.schedule, p, m, v, full.tf, full.tb, &sim));
  const double extra = p == 1 ? full.extra_first + full.extra_last : std::max(full.extra_first, full.extra_last);
  const double pipeline = sim.makespan + m * extra;
  const double critical = pipeline + *std::max_element(full.tail.begin(), full.tail.end());
  // Time-sharing: the t x d ranks of every stage run at once; when all ranks' threads
  // outnumber the cores, the step is at least all ranks' CPU work over the cores, plus the
  // time every rank waits on the inter-host wire.
  double cpu = 0, wire = 0;
  for (int r = 0; r < p; r++) {
    cpu += (double)t * d * l.cp * (cpu_times.busy[r] + cpu_times.tail[r]);
    wire = std::max(wire, full.busy[r] + full.tail[r] - cpu_times.busy[r] - cpu_times.tail[r]);
  }
  const int cores = c.cores > 0 ? c.cores : l.world() * run.threads;
  const double shared = cpu * run.threads / cores + wire;
  pr.step_s = std::max(critical, shared);
  const double slow = pr.step_s / critical;  // time-sharing stretch of every part

  double busy_sum = 0;
  for (double b : full.busy) busy_sum += b;
  pr.pipeline_s = pipeline * slow;
  pr.bubble = std::max(0.0, 1 - busy_sum / (p * pipeline));
  pr.optimizer_s = full.opt_s * slow;
  pr.tp = {0, full.tp_total * slow};
  pr.pp = {0, full.pp_total * slow};
  pr.cp = {0, full.cp_total * slow};
  pr.dp = {0, full.dp_total * slow};
  const ModelShape shape = model_shape(config, T);
  pr.tokens_per_s = (double)l.global_batch * T / pr.step_s;
  pr.model_flops = model_flops(shape, l.global_batch);
  pr.tflops_per_gpu = narayanan_flops(shape, l.global_batch) / (pr.step_s * l.world()) / 1e12;
  pr.model_tflops_per_gpu = pr.model_flops / (pr.step_s * l.world()) / 1e12;
  pr.mfu = pr.model_flops / (pr.step_s * l.world() * peak);
  return Status::ok();
}

}  // namespace

Status predict_local(const model::GptConfig& config, const Layout& l, const LocalRun& run, const Cluster& c,
                     Prediction* out, std::vector<EngineMemory>* ranks) {
  RETURN_IF_ERROR(model::validate(config));
  const int T = run.seq > 0 ? run.seq : config.max_seq_len;
  RETURN_IF_ERROR(check_local(config, l, run, c, T));
  const int p = l.pp;
  std::vector<model::ModelPart> parts;
  LocalMemory mem;
  RETURN_IF_ERROR(local_memory(config, l, run, T, &parts, &mem));

  // ---- Time ----
  *out = Prediction();
  Prediction& pr = *out;
  pr.micro_batches = l.global_batch / (l.micro_batch * l.dp);
  const Costs k = local_costs(l, c);
  const StepContext ctx = step_context(config, l, c, T, parts, l.recompute);
  // The step with every cost, and the CPU work alone (the inter-host wire left out): ranks
  // time-share the cores while they compute, and all wait on the wire together (every
  // collective that crosses hosts holds its group, and the step waits for its slowest).
  const StepTimes full = step_times(ctx, k);
  Costs cpu_only = k;
  cpu_only.wire = false;
  const StepTimes cpu_times = step_times(ctx, cpu_only);
  const LocalLayerTime& lt = full.layer;
  pr.layer_forward = {lt.gemm_f + lt.attn_f, lt.mem_f, lt.comm_f, 0};
  pr.layer_backward = {lt.gemm_b + lt.attn_b, lt.mem_b, lt.comm_b, lt.recompute + lt.recompute_comm};
  RETURN_IF_ERROR(local_step(config, l, run, c, T, full, cpu_times, k.peak, &pr));

  int worst = 0;
  for (int r = 1; r < p; r++)
    if (mem.peaks[r].total > mem.peaks[worst].total) worst = r;
  pr.memory = mem.breakdown[worst];
  pr.memory_available = c.memory_bytes - c.reserved_bytes;
  if (ranks) *ranks = mem.peaks;
  return Status::ok();
}

}  // namespace meshtrain::planner
