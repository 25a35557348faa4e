#include "planner/time_model.h"

#include <algorithm>
#include <cmath>

#include "parallel/pp/stages.h"
#include "planner/memory.h"
#include "planner/placement.h"
#include "planner/step_groups.h"

namespace meshtrain::planner {

namespace pp = parallel::pp;

double ModelShape::block_matrix_weights() const {
  const double h = hidden, kv_width = kv() * head_dim(), fm = moe_fraction();
  const double moe_mlp = (top_k + shared_experts) * expert_weights() + (double)experts * h;
  return h * (h + 2 * kv_width) + h * h + (1 - fm) * dense_mlp_weights() + fm * moe_mlp;
}

ModelShape model_shape(const model::GptConfig& c, int seq) {
  ModelShape m;
  m.layers = c.layers, m.hidden = c.dim, m.heads = c.heads;
  m.seq = seq > 0 ? seq : c.max_seq_len;
  m.vocab = c.padded_vocab();
  m.kv_heads = c.kv_head_count(), m.ffn = c.ffn();
  m.swiglu = c.mlp == model::Mlp::kSwiGlu;
  m.rms_norm = c.norm == model::Norm::kRmsNorm;
  m.rope = c.positions == model::Positions::kRope;
  m.bias = c.bias, m.tied_head = c.tied_head;
  m.dropout = c.is_gpt2();
  if (c.is_moe())
    m.experts = c.moe.experts, m.top_k = c.moe.top_k, m.moe_every = c.moe.every,
    m.shared_experts = c.moe.shared_experts, m.expert_ffn = c.expert_ffn();
  return m;
}

const char* attention_name(Attention a) { return a == Attention::kFused ? "fused" : "unfused"; }

Status parse_attention(const std::string& name, Attention* out) {
  for (Attention a : {Attention::kFused, Attention::kUnfused})
    if (name == attention_name(a)) return *out = a, Status::ok();
  return Status::error("unknown attention kernel '" + name + "' (choose fused or unfused)");
}

namespace {

// Key/value heads one of t tensor-parallel ranks holds: its share, or one replicated head
// when there are fewer heads than ranks (Megatron's rule; validate() admits only these).
double kv_heads_local(const ModelShape& m, int t) { return m.kv() >= t ? (double)m.kv() / t : 1.0; }

// Elements of one norm's parameters.
double norm_params(const ModelShape& m) { return m.rms_norm ? m.hidden : 2.0 * m.hidden; }

// Parameters of one block on one of t tensor-parallel ranks: the column-parallel q k v and
// MLP-in matrices and their biases are split, as are o's and MLP-out's inputs; the
// row-parallel biases and the norms are whole on every rank.
// (An MoE model: the average layer, whose MoE share holds the router and shared experts
// here and its routed experts in expert_params.)
double block_params(const ModelShape& m, int t) {
  const double h = m.hidden, hd = m.head_dim(), f = m.ffn_width() / (double)t, mlp_in = m.swiglu ? 2 : 1;
  const double qkv_rows = (m.heads / (double)t + 2 * kv_heads_local(m, t)) * hd;
  const double fm = m.moe_fraction();
  const double mlp = (1 - fm) * (mlp_in + 1) * h * f + fm * (m.experts * h + m.shared_experts * m.expert_weights() / t);
  const double matrices = h * qkv_rows + h * (h / t) + mlp;
  const double biases = m.bias ? qkv_rows + (1 - fm) * mlp_in * f + (2 - fm) * h : 0;
  return matrices + biases + 2 * norm_params(m);
}

// The routed experts one GPU holds per (average) layer: E/ep of them, split over tp or whole.
double expert_params(const ModelShape& m, const Layout& l) {
  return m.moe_fraction() * (m.experts / (double)l.ep) * m.expert_weights() / (l.whole_experts() ? 1 : l.tp);
}

}  // namespace

double activation_bytes_per_layer(const ModelShape& m, int micro_batch, int tp, bool sp, Recompute r,
                                  Attention attention, bool elementwise_recompute) {
  const double s = m.seq, b = micro_batch, h = m.hidden, t = tp, hd = m.head_dim();
  const double sb = s * b, sbh = sb * h;
  if (r == Recompute::kFull) return sp ? 2 * sbh / t : 2 * sbh;
  // 16-bit tensors are 2 bytes per element, dropout masks 1 (Korthikanti et al. §4.1).
  // Whole on every tp rank (split over t with sp): the two norms' inputs, the q k v and
  // MLP-in linears' inputs (the norms' outputs), and the two residual dropout masks.
  // (Element-wise recompute keeps the norms' inputs only.)
  const double replicated = sbh * ((elementwise_recompute ? 4 : 8) + (m.dropout ? 2 : 0));
  // Split over t: q and k (for the scores), v, the attention output (o's input), and the
  // MLP's: GELU's input and fc2's input, or SwiGLU's gate and up outputs and down's input.
  const double q = h / t, kv = kv_heads_local(m, tp) * hd, f = m.ffn_width() / t;
  const double attention_tensors = 2 * sb * (q + kv) + 2 * sb * kv + 2 * sb * q;
  // An MoE layer's MLP instead: its experts' tensors on the b s top_k dispatched rows and
  // the shared experts' on every row, the fp32 router logits and the rows' expert outputs.
  // (Element-wise recompute drops the activation's output, 2 of per_row's bytes.)
  const double per_row = (m.swiglu ? 6 : 4) - (elementwise_recompute ? 2 : 0), fe = m.expert_width() / t, fm = m.moe_fraction();
  const double moe_mlp = per_row * sb * (m.top_k + m.shared_experts) * fe + 4 * sb * m.experts + 2 * sb * m.top_k * h;
  const double mlp = (1 - fm) * per_row * sb * f + fm * moe_mlp;
  // The s x s part: unfused attention keeps the softmax output (2 bytes) and, with dropout,
  // its mask (1) and output (2): 5as^2b with dropout (Table 2), 2as^2b without. Selective
  // recompute drops it. A fused kernel keeps only each row's softmax statistic (fp32).
  const double score_rows = b * (m.heads / t) * s;
  double scores = 0;
  if (attention == Attention::kFused)
    scores = 4 * score_rows;
  else if (r != Recompute::kSelective)
    scores = score_rows * s * (m.dropout ? 5 : 2);
  return (sp ? replicated / t : replicated) + attention_tensors + mlp + scores;
}

double parameter_count(const ModelShape& m) {
  const double h = m.hidden, V = m.vocab;
  const double embeddings = V * h * (m.tied_head ? 1 : 2) + (m.rope ? 0 : (double)m.seq * h);
  return m.layers * (block_params(m, 1) + expert_params(m, Layout{})) + embeddings + norm_params(m);
}

double model_flops(const ModelShape& m, double B) {
  const double L = m.layers, h = m.hidden, s = m.seq;
  return B * s * (6 * (L * m.block_matrix_weights() + m.vocab * h) + 12 * L * s * h);
}

double narayanan_flops(const ModelShape& m, double B) {
  const double L = m.layers, h = m.hidden, s = m.seq;
  return B * s * (8 * L * m.block_matrix_weights() + 16 * L * s * h + 6 * m.vocab * h);
}

parallel::LayoutModel layout_model(const ModelShape& m) {
  parallel::LayoutModel lm;
  lm.layers = m.layers, lm.heads = m.heads, lm.kv_heads = m.kv(), lm.ffn = m.ffn_width();
  lm.seq_len = m.seq;
  if (m.is_moe()) lm.experts = m.experts, lm.expert_ffn = m.expert_width();
  return lm;
}

Status validate(const ModelShape& m, const Layout& l, parallel::LayoutReader reader) {
  return validate(m, l, layout_model(m), reader);
}

Status validate(const ModelShape& m, const Layout& l, const parallel::LayoutModel& lm, parallel::LayoutReader reader) {
  auto positive = [](const char* name, double v) {
    return v >= 1 ? Status::ok()
                  : Status::error(std::string(name) + " must be >= 1, got " + std::to_string((long long)v));
  };
  RETURN_IF_ERROR(positive("layers", m.layers));
  RETURN_IF_ERROR(positive("hidden", m.hidden));
  RETURN_IF_ERROR(positive("heads", m.heads));
  RETURN_IF_ERROR(positive("seq", m.seq));
  RETURN_IF_ERROR(positive("vocab", m.vocab));
  auto str = [](long long v) { return std::to_string(v); };
  RETURN_IF_ERROR(positive("kv_heads", m.kv()));
  RETURN_IF_ERROR(positive("ffn", m.ffn_width()));
  if (m.hidden % m.heads != 0)
    return Status::error("heads (" + str(m.heads) + ") must divide hidden (" + str(m.hidden) + ")");
  if (m.heads % m.kv() != 0)
    return Status::error("kv_heads (" + str(m.kv()) + ") must divide heads (" + str(m.heads) + ")");
  if (m.is_moe() && (m.top_k < 1 || m.top_k > m.experts || m.moe_every < 1))
    return Status::error("the experts (" + str(m.experts) + ", top-" + str(m.top_k) +
                         ") must have 1 <= top_k <= experts and moe_every >= 1");
  if (!(l.moe_imbalance >= 1)) return Status::error("moe_imbalance must be >= 1 (the most loaded expert over the mean)");
  if (!(l.dp_bucket_bytes > 0)) return Status::error("dp_bucket_bytes must be > 0");
  // Context parallelism splits the keys of one softmax over ranks: only a fused kernel's
  // per-row statistics merge (as in Megatron-Core, whose cp runs on fused attention only).
  if (l.cp > 1 && l.attention != Attention::kFused)
    return Status::error("--cp " + str(l.cp) + " needs --attention fused: partial softmaxes merge by their "
                         "log-sum-exp, which only a fused kernel keeps");
  // Every rule joining the axes and the choices (the engine's own: parallel/layout.h), and a
  // given stage split, all listed.
  std::string why = parallel::check_layout(l, lm, reader).message();
  if (!l.stage_layers.empty() && l.pp > 1) {
    std::vector<int> checked;
    const Status split = pp::split_layers(m.layers, l.pp * l.virtual_stages, {}, l.stage_layers, &checked);
    if (!split.is_ok()) why += (why.empty() ? "" : "\n") + split.message();
  }
  return why.empty() ? Status::ok() : Status::error(why);
}

namespace {

// A ring's view of the network for one group of the step (docs/planning.md, "Links";
// planner/step_groups.h).
struct Ring {
  int n = 1;
  double bandwidth = 0;  // bytes/s each rank gets, after link efficiency
  double latency = 0;    // per ring step
  bool inter_node = false;
};

Ring ring_of(const PlacedGroup& group, const Cluster& c) {
  Ring r;
  r.n = group.size;
  const GroupPlacement& g = group.placement;
  if (!g.crosses_hosts) {
    r.bandwidth = c.intra.bandwidth * c.link_efficiency;
    r.latency = c.intra.latency;
    return r;
  }
  // Crossing nodes: each node's k members of the group drive its share of the NICs at once
  // (rail-optimised DGX networking: k NICs); NCCL runs several rings so a ring's
  // node-boundary hops share them while its in-node hops use NVLink. Per-rank bandwidth is
  // that share, capped by NVLink.
  r.bandwidth = std::min(c.intra.bandwidth, g.nic_share * c.inter.bandwidth) * c.link_efficiency;
  r.latency = c.inter.latency;
  r.inter_node = true;
  return r;
}

// Ring collectives of a tensor of `bytes` (the full tensor each rank ends with or starts
// from), alpha-beta (Thakur et al. 2005; NCCL's ring algorithms).
double all_reduce_s(double bytes, const Ring& r) {
  if (r.n <= 1 || bytes <= 0) return 0;
  return 2.0 * (r.n - 1) * r.latency + 2.0 * (r.n - 1) / r.n * bytes / r.bandwidth;
}
double all_gather_s(double bytes, const Ring& r) {  // = reduce-scatter
  if (r.n <= 1 || bytes <= 0) return 0;
  return (r.n - 1) * r.latency + (double)(r.n - 1) / r.n * bytes / r.bandwidth;
}
double p2p_s(double bytes, const Ring& r) { return bytes <= 0 ? 0 : r.latency + bytes / r.bandwidth; }

// The ring over a product of two axes' groups (dp x cp, where gradients reduce): both
// groups' members, at the slower group's bandwidth and latency.
Ring product_ring(const Ring& a, const Ring& b) {
  if (a.n <= 1) return b;
  if (b.n <= 1) return a;
  Ring r;
  r.n = a.n * b.n;
  r.bandwidth = std::min(a.bandwidth, b.bandwidth);
  r.latency = std::max(a.latency, b.latency);
  r.inter_node = a.inter_node || b.inter_node;
  return r;
}

// Reductions of `bytes` in buckets that become ready evenly during `window` seconds of
// backward, each taking `per_bucket` seconds one after the other: what sticks out past the
// window. Comm faster than production: only the last bucket; slower: the backlog.
double exposed_after_window(double total, double per_bucket, int buckets, double window) {
  if (total <= 0) return 0;
  return std::min(total, std::max(per_bucket, total - window * (buckets - 1) / buckets));
}

// The links context parallelism runs on: the cp group's, and under hybrid its all-to-all
// groups' (cp_a2a consecutive cp ranks) and the ring's across them.
struct CpRings {
  Ring cp, a2a, across;
};

// One layer's forward and backward, per micro-batch, per GPU.
struct LayerTime {
  double gemm_f = 0, mem_f = 0, comm_f = 0;  // forward: GEMMs, memory-bound kernels, tp comm
  double gemm_b = 0, mem_b = 0, comm_b = 0;  // backward, without recompute
  double recompute = 0, recompute_comm = 0;  // added to backward by the recompute policy
  double ep_f = 0, ep_b = 0;                 // the MoE all-to-all (dispatch + combine), exposed
  double cp_f = 0, cp_b = 0;                 // context parallelism's exposed comm
  double cp_hidden = 0;                      // ... and the ring's part behind attention (f + b)
  double elementwise_f = 0;  // the norms' and the activation's forward (element-wise recompute redoes them)
  // A zero-bubble schedule's W: the weight-gradient GEMMs (inside gemm_b), and the bytes the
  // engine copies for them between B and W (each linear layer's input and output gradient).
  double gemm_w = 0, comm_w = 0, w_copy_bytes = 0;  // comm_w: inside comm_b
  double forward() const { return gemm_f + mem_f + comm_f + ep_f + cp_f; }
  double backward() const { return gemm_b + mem_b + comm_b + ep_b + cp_b + recompute + recompute_comm; }
};

// An MoE layer's MLP forward GEMMs on one GPU: the router (b s x E x h), its E/ep experts
// each on its share of the b s top_k assignments times the imbalance (the slowest expert
// sets the pace), and the shared experts on every token. Whole experts compute 1/tp of the
// rows at the full width: the same FLOPs, in taller, wider GEMMs.
template <typename Gemm>
double moe_mlp_gemm(const ModelShape& m, const Layout& l, double bs, Gemm gemm) {
  const double h = m.hidden, fs = m.expert_width() / (double)l.tp, mlp_in = m.swiglu ? 2 : 1;
  const double fe = l.whole_experts() ? m.expert_width() : fs, share = l.whole_experts() ? l.tp : 1;
  const double local = m.experts / (double)l.ep;
  const double rows = std::max(1.0, bs * m.top_k * l.ep / m.experts * l.moe_imbalance / share);  // per expert
  const double experts = local * (gemm(rows, mlp_in * fe, h, 1) + gemm(rows, h, fe, 1));
  const double shared = m.shared_experts > 0
                            ? gemm(bs, m.shared_experts * mlp_in * fs, h, 1) + gemm(bs, h, m.shared_experts * fs, 1)
                            : 0;
  return gemm(bs, m.experts, h, 1) + experts + shared;
}

// One GPU's shapes for one layer's micro-batch (its tp shares), and the rates its kernels
// run at: what every part of layer_time reads.
// With cp a GPU holds s / cp of each sequence's rows (the load-balanced chunks) and its
// attention reads all `keys` of them: the causal half of its rows x keys.
struct LayerDims {
  double b, s, keys, h, t, e, peak, hbm, bs, hd, heads_local, kv_local, f, mlp_in;
  bool fused;
};

LayerDims layer_dims(const ModelShape& m, const Layout& l, const Cluster& c) {
  LayerDims x;
  x.b = l.micro_batch, x.s = (double)m.seq / l.cp, x.keys = m.seq, x.h = m.hidden, x.t = l.tp, x.e = element_bytes(l.precision);
  x.peak = c.peak_flops(l.precision), x.hbm = c.hbm_bandwidth * c.hbm_efficiency;
  x.bs = x.b * x.s, x.hd = m.head_dim(), x.heads_local = m.heads / x.t, x.kv_local = kv_heads_local(m, l.tp);
  x.f = m.ffn_width() / x.t, x.mlp_in = m.swiglu ? 2 : 1;
  x.fused = l.attention == Attention::kFused;
  return x;
}

// The block's GEMM times, forward: the linear layers (the MLP's dense or MoE) apart from
// attention's products, whose backward differs from twice the forward.
struct LayerGemms {
  double linears = 0, attention_f = 0, attention_b = 0;
};

LayerGemms layer_gemms(const ModelShape& m, const Layout& l, const Cluster& c, const LayerDims& x) {
  const double b = x.b, s = x.s, h = x.h, peak = x.peak, bs = x.bs, hd = x.hd, heads_local = x.heads_local;
  auto gemm = [&](double M, double N, double K, double batch) {
    return 2 * M * N * K * batch / (peak * c.gemm.at(M, N, K));
  };
  // The block's GEMMs at their tensor-parallel shapes (Shoeybi et al. 2019, Fig. 3):
  // column-parallel q k v (GQA's k and v narrower) and MLP-in (SwiGLU's gate and up side by
  // side), row-parallel o and MLP-out, attention per local head. Each backward GEMM (input
  // gradient, weight gradient) has the forward's dimensions permuted: twice the forward time.
  const double qkv = gemm(bs, (heads_local + 2 * x.kv_local) * hd, h, 1), proj = gemm(bs, h, heads_local * hd, 1);
  const double fc1 = gemm(bs, x.mlp_in * x.f, h, 1), fc2 = gemm(bs, h, x.f, 1);
  const double keys = x.keys;
  const double products = gemm(s, keys, hd, b * heads_local) + gemm(s, hd, keys, b * heads_local);
  LayerGemms g;
  // Unfused attention computes all s x s scores and runs its backward as four GEMMs; a fused
  // causal kernel skips the masked half of the blocks and recomputes the scores in its
  // backward: five products there (S, dV, dP, dQ, dK) to the forward's two (Dao 2023).
  g.attention_f = x.fused ? products / 2 : products;
  g.attention_b = x.fused ? 2.5 * g.attention_f : 2 * g.attention_f;
  const double fm = m.moe_fraction();
  const double moe_mlp = m.is_moe() ? moe_mlp_gemm(m, l, bs, gemm) : 0;
  const double mlp_gemm = (1 - fm) * (fc1 + fc2) + fm * moe_mlp;
  g.linears = qkv + proj + mlp_gemm;
  return g;
}

// Memory-bound kernels, bytes per element (docs/planning.md, "Memory-bound kernels"): the
// two norms and the two residual adds (bias-dropout-adds with dropout) run on the whole
// b s h (1/t of it with sp), the activation on the MLP width, rotary on q and k; unfused
// attention's scale-mask-softmax and dropout on b a s^2/t. Sets mem_f and mem_b; returns
// the unfused attention core's forward part (selective recompute redoes it).
double layer_memory(const ModelShape& m, const Layout& l, const LayerDims& x, LayerTime* lt) {
  const double b = x.b, s = x.s, h = x.h, t = x.t, e = x.e, hbm = x.hbm, bs = x.bs, hd = x.hd;
  const double heads_local = x.heads_local, kv_local = x.kv_local, f = x.f;
  const bool fused = x.fused;
  const double rep = l.sp ? bs * h / t : bs * h;  // elements of the replicated regions
  // An MoE layer's activation runs on its experts' rows instead: the b s top_k dispatched
  // rows (the most loaded rank's share) and every row for the shared experts.
  const double fm = m.moe_fraction(), fe = m.is_moe() ? m.expert_width() / t : 0;
  const double moe_rows = bs * (m.top_k * l.moe_imbalance + m.shared_experts);
  const double act_elems = (1 - fm) * bs * f + fm * moe_rows * fe, score_elems = b * heads_local * s * x.keys;
  const double rotary = m.rope ? bs * (heads_local + kv_local) * hd : 0;
  const double drop = m.dropout ? 1 : 0;
  const double norm_f = 2 * e, add_f = 3 * e + drop, act_f = (m.swiglu ? 3 : 2) * e, rope_f = 2 * e;
  const double norm_b = 3 * e, add_b = m.dropout ? 6 * e + 1 : 2 * e, act_b = (m.swiglu ? 5 : 4) * e, rope_b = 2 * e;
  const double softmax_f = 2 * e + drop * (2 * e + 1), softmax_b = 3 * e + drop * (2 * e + 1);
  // Plus the attention's layout copies of q, k, v and the context.
  const double copies = (2 * heads_local + 2 * kv_local) * hd * bs * 2 * e;
  const double attn_core_mem = fused ? 0 : score_elems * softmax_f / hbm;
  // The MoE rows' copies (each a read and a write): into dispatch order, and with ep into
  // and out of expert-major order around the all-to-alls; the forward's combine reads each
  // dispatched row and writes b s h; the backward also writes w dout per row and reads the
  // rows and dout again for the routing weights' gradients.
  const double moved = m.is_moe() ? bs * m.top_k * l.moe_imbalance * h : 0, copies_each_way = l.ep > 1 ? 3 : 1;
  const double moe_mem_f = fm * (moved * (2 * copies_each_way + 1) + bs * h) * e;
  const double moe_mem_b = fm * (moved * (2 * copies_each_way + 5) + bs * h) * e;
  lt->elementwise_f = (rep * 2 * norm_f + act_elems * act_f) / hbm;
  lt->mem_f = (rep * 2 * (norm_f + add_f) + act_elems * act_f + rotary * rope_f + copies + moe_mem_f) / hbm + attn_core_mem;
  lt->mem_b = (rep * 2 * (norm_b + add_b) + act_elems * act_b + rotary * rope_b + copies + moe_mem_b +
               (fused ? 0 : score_elems * softmax_b)) / hbm;
  return attn_core_mem;
}

// What the engine keeps for a W: each linear layer's output gradient (the projections'
// full rows, q k v's and MLP-in's tp slices; in bf16 at bf16 precision, as its weight
// GEMM reads it, else fp32), and in fp32 the inputs not in the micro-batch's set:
// recomputed ones (the norms' outputs under full recompute, attention's output under
// either). Under sp the W gathers the stored norm outputs' rows again (layer_tp_comm)
// rather than keeping them.
double w_copy_bytes(const Layout& l, const LayerDims& x) {
  const double h = x.h, hd = x.hd, heads_local = x.heads_local, f = x.f;
  const bool full = l.recompute == Recompute::kFull, selective = l.recompute == Recompute::kSelective;
  const double w_dout = 2 * h + (heads_local + 2 * x.kv_local) * hd + x.mlp_in * f;
  const bool rebuilt = full || l.elementwise_recompute;  // the norms' and activation's outputs
  const double w_inputs = (rebuilt ? 2 * h : 0) + (full || selective ? heads_local * hd : 0) + (rebuilt ? f : 0);
  const double dout_bytes = l.precision == Precision::kBf16 ? 2 : 4;
  return x.bs * (dout_bytes * w_dout + 4 * w_inputs);
}

// Expert parallelism: each MoE layer dispatches its b s top_k rows (the most loaded
// rank's share) to the experts' ranks and combines them back, in the forward and again
// in the backward. Each tp rank carries 1/t of them over ep, where (ep-1)/ep leave the
// rank on the ep group's link; the tp group then gathers the received rows for its
// expert slices, and sums their partial outputs before the way back (docs/moe.md).
// Whole experts compute on the rows each tp rank received: no tp part. Per direction.
double layer_ep_s(const ModelShape& m, const Layout& l, const LayerDims& x, const Ring& tp_ring, const Ring& ep_ring) {
  if (!(m.is_moe() && l.ep > 1)) return 0;
  const double t = x.t;
  const double rows_bytes = x.bs * m.top_k * l.moe_imbalance * x.h * x.e;
  const double one = (ep_ring.n - 1) * ep_ring.latency +
                     (double)(ep_ring.n - 1) / ep_ring.n * rows_bytes / t / ep_ring.bandwidth;
  const double tp_part = t > 1 && !l.whole_experts() ? 2 * all_gather_s(rows_bytes, tp_ring) : 0;
  return m.moe_fraction() * (2 * one + tp_part);
}

// Megatron's tensor parallelism: two all-reduces of b s h forward and two backward; with
// sp an all-gather and a reduce-scatter in their place, the same bytes (Korthikanti et al.
// 2022 §4.2.2). Not overlapped with compute.
// With sp the column-parallel layers keep only their sequence shard of the input, so the
// backward all-gathers it once more for each weight gradient (QKV, fc1; Korthikanti et al.
// 2022 §4.2.2 overlap it with the input-gradient GEMM; counted exposed here, as the other
// tp collectives). Sets comm_f, comm_b and comm_w.
void layer_tp_comm(const Layout& l, const LayerDims& x, const Ring& tp_ring, LayerTime* lt) {
  const bool full = l.recompute == Recompute::kFull;
  const double act = x.bs * x.h * x.e;
  const double one = l.sp ? 2 * all_gather_s(act, tp_ring) : all_reduce_s(act, tp_ring);
  lt->comm_f = 2 * one;
  lt->comm_b = 2 * one + (l.sp ? 2 * all_gather_s(act, tp_ring) : 0);
  // A zero-bubble W under sp gathers the QKV and fc1 inputs once more (model/gpt.h,
  // linear_backward), unless full recompute left them as scratch it keeps.
  if (l.sp && !full && pp::splits_backward(l.schedule)) lt->comm_w = 2 * all_gather_s(act, tp_ring);
  lt->comm_b += lt->comm_w;
}

// Context parallelism, per layer and micro-batch (docs/long_context.md, "Cost"):
//  - ring: cp - 1 steps each pass a rank's k and v rows (its tp share of the key/value
//    heads) to the next rank while it attends to the block in hand, 1/cp of the attention
//    work; only what a step's send takes beyond that work is exposed. The backward passes k
//    and v again with the fp32 dK/dV sums, which take one more step to get home (exposed).
//  - a2a (Ulysses): all-to-alls of q, k and v before attention and of its output after
//    it, the same in the backward, none overlapped.
//  - all-gather (Llama 3's): the whole sequence's k and v gathered before attention, and in
//    the backward gathered again and their gradients reduce-scattered, none overlapped.
//  - hybrid: a2a's all-to-alls inside each group of cp_a2a consecutive cp ranks (exposed),
//    then the ring across the cp / cp_a2a groups on the group's rows of the rank's heads.
void layer_cp_comm(const Layout& l, const LayerDims& x, const LayerGemms& g, const CpRings& rings, LayerTime* lt) {
  if (l.cp <= 1) return;
  const bool hybrid = l.cp_comm == model::CpComm::kHybrid;
  const double a = hybrid ? l.cp_a2a : 1, rows = x.b * x.s;
  auto ring = [&](double n, double rows, double kv_heads, const Ring& link) {  // the ring of n ranks
    const double kv_bytes = rows * 2 * kv_heads * x.hd * x.e, dkv_bytes = rows * 2 * kv_heads * x.hd * 4;
    const double send_f = p2p_s(kv_bytes, link), work_f = g.attention_f / n;
    const double send_b = p2p_s(kv_bytes + dkv_bytes, link), work_b = g.attention_b / n;
    lt->cp_f += (n - 1) * std::max(0.0, send_f - work_f);
    lt->cp_b += (n - 1) * std::max(0.0, send_b - work_b) + p2p_s(dkv_bytes, link);
    lt->cp_hidden += (n - 1) * (std::min(send_f, work_f) + std::min(send_b, work_b));
  };
  auto ulysses = [&](double n, const Ring& link) {  // the all-to-alls over n ranks
    const double q_bytes = rows * x.heads_local * x.hd * x.e, kv_bytes = rows * 2 * x.kv_local * x.hd * x.e;
    auto all_to_all_s = [&](double bytes) { return (n - 1) * link.latency + (n - 1) / n * bytes / link.bandwidth; };
    const double s = all_to_all_s(q_bytes + kv_bytes) + all_to_all_s(q_bytes);
    lt->cp_f += s, lt->cp_b += s;
  };
  switch (l.cp_comm) {
    case model::CpComm::kRing:
      return ring(l.cp, rows, x.kv_local, rings.cp);
    case model::CpComm::kAllGather: {
      const double kv_bytes = rows * 2 * x.kv_local * x.hd * x.e;
      lt->cp_f = all_gather_s(l.cp * kv_bytes, rings.cp);
      lt->cp_b = 2 * all_gather_s(l.cp * kv_bytes, rings.cp);
      return;
    }
    case model::CpComm::kA2a:
      return ulysses(l.cp, rings.cp);
    case model::CpComm::kHybrid:
      ulysses(a, rings.a2a);
      return ring(l.cp / a, a * rows, std::max(1.0, x.kv_local / a), rings.across);
  }
}

LayerTime layer_time(const ModelShape& m, const Layout& l, const Cluster& c, const Ring& tp_ring,
                     const Ring& ep_ring, const CpRings& cp_rings) {
  const LayerDims x = layer_dims(m, l, c);
  const LayerGemms g = layer_gemms(m, l, c, x);
  LayerTime lt;
  const double attn_core_mem = layer_memory(m, l, x, &lt);
  lt.gemm_f = g.linears + g.attention_f;
  lt.gemm_b = 2 * g.linears + g.attention_b;
  lt.gemm_w = g.linears;
  lt.w_copy_bytes = w_copy_bytes(l, x);
  lt.ep_f = lt.ep_b = layer_ep_s(m, l, x, tp_ring, ep_ring);
  layer_tp_comm(l, x, tp_ring, &lt);
  layer_cp_comm(l, x, g, cp_rings, &lt);
  switch (l.recompute) {
    case Recompute::kNone:
      break;
    case Recompute::kSelective:  // a fused kernel already recomputes its scores: nothing more
      lt.recompute = x.fused ? 0 : g.attention_f + attn_core_mem;
      break;
    case Recompute::kFull:
      lt.recompute = lt.gemm_f + lt.mem_f;
      lt.recompute_comm = lt.comm_f + lt.cp_f;
      break;
  }
  if (l.elementwise_recompute && l.recompute != Recompute::kFull) lt.recompute += lt.elementwise_f;
  return lt;
}

// Parameters one GPU holds for each pipeline stage (tp-sharded matrices, replicated norms and
// row-parallel biases): its layers, the first stage's token embedding (and position table),
// the last stage's final norm and head (its own, or with pp > 1 the tied embedding's copy).
// (MoE: per_layer_experts, the routed experts of a layer, apart: they are sharded over edp.)
struct StageParams {
  double per_layer = 0, embedding = 0, head = 0, per_layer_experts = 0;
  double of(int stage, int stages, int layers) const {
    return layers * per_layer + (stage == 0 ? embedding : 0) + (stage == stages - 1 ? head : 0);
  }
};

StageParams stage_params(const ModelShape& m, const Layout& l) {
  const double h = m.hidden, t = l.tp, V = m.vocab;
  StageParams p;
  p.per_layer = block_params(m, l.tp);
  p.per_layer_experts = expert_params(m, l);
  p.embedding = V * h / t + (m.rope ? 0 : (double)m.seq * h);
  const bool head_matrix = !m.tied_head || l.pp > 1;  // else the embedding serves as the head
  p.head = (head_matrix ? V * h / t : 0) + norm_params(m);
  return p;
}

// The 2-D weight matrices (rows x columns, tp-local) a GPU of the first pipeline rank holds:
// each layer's attention q/k/v and output projection and its MLP's, the embedding (and
// the position table), and with one stage an untied head. What PowerSGD compresses.
struct Matrix {
  double rows, cols, count;
};
std::vector<Matrix> first_stage_matrices(const ModelShape& m, const Layout& l, double layers, bool last_too) {
  const double h = m.hidden, t = l.tp, hd = m.head_dim(), f = m.ffn_width() / t;
  std::vector<Matrix> out = {{h, (m.heads + 2.0 * m.kv()) * hd / t, layers},
                             {h / t, h, layers},
                             {h, f, (m.swiglu ? 2.0 : 1.0) * layers},
                             {f, h, layers},
                             {m.vocab / t, h, 1}};
  if (!m.rope) out.push_back({(double)m.seq, h, 1});
  if (last_too && !m.tied_head) out.push_back({m.vocab / t, h, 1});
  return out;
}

// The compressed phase of `train --compress` on the data-parallel ring (as the engine runs
// it, after the last backward: exposed), `params` the GPU's gradient elements:
//   PowerSGD: all-reduces of every P (rows x r) and Q (cols x r) in fp32 and of the
//     elements it does not compress (rank r saves nothing on a matrix with r (n + m) >=
//     n m) in the gradient's dtype; per matrix three GEMMs of n x m x r and five fp32
//     passes over it (the error feedback).
//   1-bit Adam: an all-to-all and an all-gather of sign bits with an fp32 scale per
//     `scale_block` elements (charged as a reduce-scatter's and an all-gather's volume),
//     and about ten fp32 passes over the gradient (error feedback, compression, the
//     momentum, four decompressions).
// `*comm` gets the wire time, the return value adds the compute.
double compressed_reduction_s(const ModelShape& m, const Layout& l, const Cluster& c, const Ring& dp_ring,
                              double params, double layers, bool last_too, double e, double* comm) {
  const parallel::Compression& cz = l.compression;
  const double hbm = c.hbm_bandwidth * c.hbm_efficiency, peak = c.peak_flops(l.precision);
  auto gemm = [&](double M, double N, double K) { return 2 * M * N * K / (peak * c.gemm.at(M, N, K)); };
  if (cz.kind == parallel::Compression::Kind::kPowerSgd) {
    double P = 0, Q = 0, exact = params, work = 0;
    for (const Matrix& x : first_stage_matrices(m, l, layers, last_too)) {
      const double r = std::min({(double)cz.rank, x.rows, x.cols});
      if (r * (x.rows + x.cols) >= x.rows * x.cols) continue;
      P += x.count * x.rows * r, Q += x.count * x.cols * r, exact -= x.count * x.rows * x.cols;
      work += x.count * (gemm(x.rows, r, x.cols) + gemm(x.cols, r, x.rows) + gemm(x.rows, x.cols, r) +
                         20 * x.rows * x.cols / hbm);
    }
    *comm = all_reduce_s(4 * P, dp_ring) + all_reduce_s(4 * Q, dp_ring) + all_reduce_s(e * std::max(0.0, exact), dp_ring);
    return work;
  }
  const double wire = params / 8 + 4 * params / (double)cz.scale_block;
  *comm = 2 * all_gather_s(wire, dp_ring);
  return 40 * params / hbm;
}

// What every part of predict()'s step reads: the model, layout and cluster, their sizes,
// the rings of each axis's groups (placed as the rank order places them), one layer's
// times and the stages' parameters. Built once, so that the parts below agree on them.
struct Step {
  const ModelShape& m;
  const Layout& l;
  const Cluster& c;
  int t, p, d, v, S, mb;  // d: the gradient group, dp x cp (ZeRO shards over it too)
  double b, s, h, V, e, peak, hbm, bsh;  // s: one GPU's rows of a sequence, seq / cp
  double rep;     // elements of a replicated b s h region on one GPU (1/t of it with sp)
  double logits;  // one micro-batch's logits on one GPU
  Ring tp_ring, dp_ring, pp_ring, ep_ring, edp_ring, cp_ring;  // dp_ring: the gradient group's
  Ring tied_ring;  // the first and last stages' pair
  LayerTime lt;
  // Under a pipeline the engine reduces ZeRO-2/3 gradients once per step and gathers
  // ZeRO-3 parameters at their first use in the step, keeping them to its end
  // (parallel::DpStep: reduce_once_per_step, and keep_gathered, which --zero3-gather auto
  // gives whenever a pipeline reduces once; the planners' layouts keep auto).
  bool once_per_step;
  bool split;  // a zero-bubble schedule: backward split into B and W
  StageParams sparams;
  // ZeRO++ (parallel/dp/quantized_comm.h): a quantized gather (qwZ) or reduce-scatter (qgZ)
  // moves a byte and 4/block bytes of scale per value instead of the dtype's, and costs
  // passes over memory: a gather quantizes the GPU's shard and decodes every value, a
  // reduce-scatter quantizes and decodes (d-1)/d of them.
  double gather_e, scatter_e, gather_work, scatter_work;
  int last_rank;  // the head's pipeline rank: p - 1, or 0 in a V

  Step(const ModelShape& m_, const Layout& l_, const Cluster& c_) : m(m_), l(l_), c(c_) {
    t = l.tp, p = l.pp, d = l.dp * l.cp, v = l.virtual_stages, S = p * v;
    mb = l.global_batch / (l.micro_batch * l.dp);
    b = l.micro_batch, s = (double)m.seq / l.cp, h = m.hidden, V = m.vocab, e = element_bytes(l.precision);
    peak = c.peak_flops(l.precision), hbm = c.hbm_bandwidth * c.hbm_efficiency;
    bsh = b * s * h;
    rep = l.sp ? bsh / t : bsh;
    logits = b * s * V / t;
    const StepGroups groups = step_groups(l, c);
    tp_ring = ring_of(groups.tp, c), dp_ring = ring_of(groups.dp, c), pp_ring = ring_of(groups.pp, c);
    cp_ring = ring_of(groups.cp, c);
    const CpRings cp_rings{cp_ring, ring_of(groups.cp_a2a, c), ring_of(groups.cp_across, c)};
    ep_ring = ring_of(groups.ep, c), edp_ring = ring_of(groups.edp, c), tied_ring = ring_of(groups.tied, c);
    lt = layer_time(m, l, c, tp_ring, ep_ring, cp_rings);
    if (l.cp > 1) dp_ring = product_ring(dp_ring, cp_ring), edp_ring = product_ring(edp_ring, cp_ring);
    once_per_step = d > 1 && l.zero >= 2 && parallel::dp_step(l).reduce_once_per_step;
    split = pp::splits_backward(l.schedule);
    sparams = stage_params(m, l);
    const double int8_e = 1.0 + 4.0 / (double)l.quantized.block;
    gather_e = l.quantized.weights ? int8_e : e, scatter_e = l.quantized.grads ? int8_e : e;
    gather_work = l.quantized.weights ? ((e + 1) / d + (1 + e)) / hbm : 0;
    scatter_work = l.quantized.grads ? 2.0 * (d - 1) / d * (e + 1) / hbm : 0;
    last_rank = pp::rank_of_stage(l.schedule, p, v, S - 1);
  }

  // Sums over the stages pipeline rank `rank` runs (its chunks).
  template <typename F>
  double over_rank(int rank, F&& value) const {
    double sum = 0;
    for (int st = 0; st < S; st++)
      if (pp::rank_of_stage(l.schedule, p, v, st) == rank) sum += value(st);
    return sum;
  }
};

// The first and last stages' own work per micro-batch, beside their layers.
struct EdgeTimes {
  double emb_f = 0, emb_b = 0;             // first stage
  double head_gemm = 0, head_f = 0, head_b = 0;  // last stage
  double edge_tp = 0;                      // their tp collectives, for the per-axis account
};

EdgeTimes edge_times(const Step& x) {
  const ModelShape& m = x.m;
  const Layout& l = x.l;
  const double b = x.b, s = x.s, h = x.h, V = x.V, e = x.e, hbm = x.hbm, bsh = x.bsh, rep = x.rep;
  const int t = x.t;
  const Ring& tp_ring = x.tp_ring;
  EdgeTimes g;
  // First stage: embedding lookup (+ position add and dropout), its tp reduction
  // (all-reduce, or reduce-scatter with sp) forward; the scatter-add of its gradient backward.
  const double embed_bytes = (2 + (m.rope ? 0 : 1) + (m.dropout ? 2 : 0)) * e + (m.dropout ? 1 : 0);
  g.emb_f = rep * embed_bytes / hbm + (l.sp ? all_gather_s(bsh * e, tp_ring) : all_reduce_s(bsh * e, tp_ring));
  g.emb_b = rep * embed_bytes / hbm + (l.sp ? all_gather_s(bsh * e, tp_ring) : 0);
  // Last stage: final norm, the vocabulary-parallel head GEMM and cross-entropy (fp32
  // logits: cast, max, exp, sum, ~(e + 20) bytes per logit forward, (4 + e) backward), and
  // the head's input gradient all-reduce (with sp: all-gather forward, reduce-scatter back).
  const double logits = x.logits;
  g.head_gemm = 2 * b * s * (V / t) * h / (x.peak * x.c.gemm.at(b * s, V / t, h));
  g.head_f = rep * 2 * e / hbm + g.head_gemm + logits * (e + 20) / hbm + (l.sp ? all_gather_s(bsh * e, tp_ring) : 0);
  g.head_b = rep * 3 * e / hbm + 2 * g.head_gemm + logits * (4 + e) / hbm +
             (l.sp ? all_gather_s(bsh * e, tp_ring) : all_reduce_s(bsh * e, tp_ring));
  // The tp collectives among these (for the per-axis account): sp ? 2 all-gather-sized : 1 all-reduce.
  g.edge_tp = l.sp ? 2 * all_gather_s(bsh * e, tp_ring) : all_reduce_s(bsh * e, tp_ring);
  return g;
}

// Pipeline sends: one activation forward, one gradient backward per chunk and micro-batch,
// b s h elements, 1/t of it per GPU with scatter/gather or sp (then re-gathered in-node).
double pipeline_send_s(const Step& x) {
  if (x.p <= 1) return 0;
  const int t = x.t;
  const double bsh = x.bsh, e = x.e;
  const bool split = (x.l.pp_scatter_gather || x.l.sp) && t > 1;
  return p2p_s(bsh * e / (split ? t : 1), x.pp_ring) + (split && !x.l.sp ? all_gather_s(bsh * e, x.tp_ring) : 0);
}

// Each stage's forward, backward (B) and zero-bubble W per micro-batch, what the schedule
// simulator runs on, and its ZeRO-3 gathers (forward + backward).
struct StageTimes {
  std::vector<double> tf, tb, tw, z3_gather, z3_exposed;
};

// ZeRO-3: each stage's parameters are all-gathered before its forward and again before its
// backward (its gradients are reduce-scattered with the other stages' in dense_dp); prefetch
// hides a gather behind the previous layer's compute, except the first layer's. Under a
// pipeline (Step::once_per_step) the gather is paid once per step, not per micro-batch, so
// its exposed part stays outside the pipeline's per-micro-batch costs.
StageTimes stage_times(const Step& x, const EdgeTimes& g, double send, const std::vector<int>& layers) {
  const int S = x.S, d = x.d;
  const LayerTime& lt = x.lt;
  const StageParams& sparams = x.sparams;
  const Ring& dp_ring = x.dp_ring;
  StageTimes o;
  o.tf.resize(S), o.tb.resize(S), o.tw.assign(S, 0.0), o.z3_gather.assign(S, 0), o.z3_exposed.assign(S, 0);
  // A zero-bubble schedule's W: the weight-gradient GEMMs, half of the linear layers'
  // backward GEMMs (the other half is B's input gradients) and the head's one of two.
  const double layer_w = x.split ? lt.gemm_w + lt.comm_w : 0.0, head_w = x.split ? g.head_gemm : 0.0;
  for (int st = 0; st < S; st++) {
    const int n = layers[st];
    o.tf[st] = n * lt.forward() + send + (st == 0 ? g.emb_f : 0) + (st == S - 1 ? g.head_f : 0);
    o.tw[st] = n * layer_w + (st == S - 1 ? head_w : 0);
    o.tb[st] = n * lt.backward() + send + (st == 0 ? g.emb_b : 0) + (st == S - 1 ? g.head_b : 0) - o.tw[st];
    if (x.l.zero == 3 && d > 1) {
      // Gathers layer by layer: one collective per layer, the stage's edges with its first
      // (qwZ: int8 blocks, and each GPU quantizes its shard and decodes the whole).
      const double layer_gather =
          all_gather_s(sparams.per_layer * x.gather_e, dp_ring) + sparams.per_layer * x.gather_work;
      const double stage_gather = all_gather_s(sparams.of(st, S, n) * x.gather_e, dp_ring) +
                                  sparams.of(st, S, n) * x.gather_work + (n - 1) * (d - 1) * dp_ring.latency;
      const double exposed_f = std::max(layer_gather, stage_gather - n * lt.forward());
      const double exposed_b = std::max(layer_gather, stage_gather - n * lt.backward());
      if (x.once_per_step) {
        o.z3_gather[st] = stage_gather, o.z3_exposed[st] = exposed_f;
      } else {
        o.tf[st] += exposed_f, o.tb[st] += exposed_b;
        o.z3_gather[st] = 2 * stage_gather, o.z3_exposed[st] = exposed_f + exposed_b;
      }
    }
  }
  return o;
}

// The first pipeline rank's share of the step (its GPU finishes the pipeline last): what
// data parallelism reduces and gathers, and the backward it may hide behind.
struct FirstRank {
  double params = 0, experts = 0, layers = 0;
  double last_backward = 0;  // its last micro-batch's backward (B and W)
  double z3_gather = 0, z3_exposed = 0;
};

FirstRank first_rank(const Step& x, const StageTimes& st, const std::vector<int>& layers) {
  FirstRank f;
  f.params = x.over_rank(0, [&](int s) { return x.sparams.of(s, x.S, layers[s]); });
  f.experts = x.over_rank(0, [&](int s) { return layers[s] * x.sparams.per_layer_experts; });
  f.last_backward = x.over_rank(0, [&](int s) { return st.tb[s] + st.tw[s]; });
  f.z3_gather = x.over_rank(0, [&](int s) { return st.z3_gather[s]; });
  f.z3_exposed = x.over_rank(0, [&](int s) { return st.z3_exposed[s]; });
  f.layers = x.over_rank(0, [&](int s) { return (double)layers[s]; });
  return f;
}

// Data-parallel communication on the first rank's GPU, and the compressor's (or ZeRO++'s
// quantization) compute.
struct DpTimes {
  double total = 0, exposed = 0, compressor_s = 0;
  int buckets = 1;  // the dense gradients' buckets
};

// The dense gradients: compressed, all-reduced (ZeRO-0) or reduce-scattered (ZeRO 1-3),
// bucket by bucket behind the backward, and the updated parameters gathered back.
DpTimes dense_dp(const Step& x, const FirstRank& f) {
  const Layout& l = x.l;
  const int d = x.d, mb = x.mb;
  const double e = x.e;
  const Ring& dp_ring = x.dp_ring;
  DpTimes o;
  const double grad_bytes = f.params * e;
  const int buckets = o.buckets = std::max(1, (int)std::ceil(grad_bytes / l.dp_bucket_bytes));
  const double bucket = grad_bytes / buckets;
  // Reduce-scatters (ZeRO 1-3) of `bytes` of gradients, quantized under qgZ (whose
  // quantization is charged below, as compute after the backward).
  auto scatter_s = [&](double bytes) { return all_gather_s(bytes / e * x.scatter_e, dp_ring); };
  if (d > 1 && l.compression.kind != parallel::Compression::Kind::kNone) {
    // The compressed phase, after the last backward; ZeRO-1 then gathers the updated
    // parameters as usual.
    o.compressor_s = compressed_reduction_s(x.m, l, x.c, dp_ring, f.params, f.layers, x.p == 1, e, &o.total);
    o.exposed = o.total;
    if (l.zero == 1) o.total += all_gather_s(grad_bytes, dp_ring), o.exposed = o.total;
  } else if (d > 1) {
    if (l.zero <= 1 || x.once_per_step) {
      // Stage 0: all-reduce after the last micro-batch; stage 1 (and 2-3 under a pipeline):
      // reduce-scatter of the same gradients, then (stages 1-2) an all-gather of the updated
      // parameters after the step (ZeRO §7: the same 2 Psi volume).
      const double per = l.zero == 0 ? all_reduce_s(bucket, dp_ring) : scatter_s(bucket);
      o.total = buckets * per;
      o.exposed = l.dp_overlap ? exposed_after_window(o.total, per, buckets, f.last_backward) : o.total;
      // ZeRO-3 under a pipeline: each stage's gather once per step, its exposed part outside.
      o.total += f.z3_gather;
      o.exposed += f.z3_exposed;
    } else {
      // Stages 2-3 keep sharded gradients: a reduce-scatter after every micro-batch's
      // backward (the engine's order), hidden behind the backward of the next ones.
      const double per = scatter_s(bucket);
      const double one_mb = buckets * per;
      o.total = mb * one_mb;
      const double window = mb * f.last_backward;
      o.exposed = l.dp_overlap ? exposed_after_window(o.total, per, buckets * mb, window) : o.total;
      // ZeRO-3's gathers, whose exposed part is already inside tf and tb.
      o.total += mb * f.z3_gather;
      o.exposed += mb * f.z3_exposed;
    }
    if (l.zero == 1 || l.zero == 2) {  // updated parameters all-gathered after the step
      const double ag = all_gather_s(grad_bytes, dp_ring);
      o.total += ag;
      o.exposed += ag;
    }
    if (l.zero >= 1) o.compressor_s = (l.zero == 1 || x.once_per_step ? 1 : mb) * f.params * x.scatter_work;
  }
  return o;
}

// The routed experts' gradients reduce over their expert-data-parallel group, in the same
// window as the dense ones (and stages 1-2 all-gather them back).
void add_expert_dp(const Step& x, const FirstRank& f, DpTimes* dp) {
  const Layout& l = x.l;
  const int d = x.d, buckets = dp->buckets;
  const Ring& edp_ring = x.edp_ring;
  if (f.experts > 0 && d / l.ep > 1) {
    const double bytes = f.experts * x.e;
    double total = l.zero == 0 ? all_reduce_s(bytes, edp_ring) : all_gather_s(bytes, edp_ring);
    double exposed = l.dp_overlap ? exposed_after_window(total, total / buckets, buckets, f.last_backward) : total;
    if (l.zero == 1 || l.zero == 2) total += all_gather_s(bytes, edp_ring), exposed += all_gather_s(bytes, edp_ring);
    dp->total += total, dp->exposed += exposed;
  }
}

// Whole experts: each tp rank's gradient is its rows' part, summed over tp (blocking, as
// each bucket or unit is reduced: after every micro-batch where ZeRO 2-3 reduce per
// micro-batch) before the edp reduction. Exposed: the tp link has no compute to hide behind.
double expert_tp_sum_s(const Step& x, const FirstRank& f) {
  const Layout& l = x.l;
  return l.whole_experts() && f.experts > 0
             ? (l.zero >= 2 && x.d > 1 && !x.once_per_step ? x.mb : 1) * all_reduce_s(f.experts * x.e, x.tp_ring)
             : 0;
}

StateDtypes state_dtypes(const Layout& l) { return l.precision == Precision::kFp32 ? kFp32State : kMixedState; }

// The model state of a GPU holding `params` dense parameters (sharded over dp) and
// `experts` routed-expert parameters (sharded over edp).
StateBytes gpu_state(const Layout& l, const StateDtypes& dt, double params, double experts) {
  StateBytes state = model_state_bytes(params, dt, l.zero, l.dp * l.cp);
  const StateBytes expert_state = model_state_bytes(experts, dt, l.zero, l.dp * l.cp / l.ep);
  state.params += expert_state.params, state.grads += expert_state.grads;
  state.optim += expert_state.optim;
  return state;
}

// Optimizer step on the first rank's GPU's shard, as passes over memory (Megatron's
// mixed-precision optimizer): read the gradients for the overflow check, for the norm and
// in Adam; read and write the fp32 master weights and both moments; read the fp32 master
// again to write the 16-bit weights; zero the gradient buffer.
double optimizer_s(const Step& x, const FirstRank& f) {
  const Layout& l = x.l;
  const StateDtypes dt = state_dtypes(l);
  const StateBytes first_state = gpu_state(l, dt, f.params, f.experts);
  const double owned = first_state.optim / dt.optim;
  const double master = l.precision == Precision::kFp32 ? 0 : 4;  // fp32 copy read for the cast
  // Under a pipeline ZeRO-2/3 also zero the step's whole fp32 gradient accumulators.
  const double whole_grads = x.once_per_step ? 4 * f.params : 0;
  return (2 * first_state.optim + owned * (3 * dt.grad + master + dt.param) + first_state.grads + whole_grads) / x.hbm;
}

double cp_buffer_bytes(const Step& x);

// The memory of pipeline rank `rank`'s GPUs: its model state, its activations at the
// schedule's peak (`per_layer` a layer's for one micro-batch, `rebuilt` full recompute's
// one rebuilt layer), and the communication staging: one dp bucket in flight (stages 1-2
// reduce-scatter into a separate buffer), ZeRO-3's gathered current and prefetched layers,
// and the tp collectives' output buffer of b s h. Under a pipeline ZeRO-2/3 hold the rank's
// whole fp32 gradients through the step, and ZeRO-3 its whole gathered parameters.
MemoryBreakdown rank_memory(const Step& x, const std::vector<int>& layers, const pp::SimResult& sim, int rank,
                            double per_layer, double rebuilt) {
  const ModelShape& m = x.m;
  const Layout& l = x.l;
  const int t = x.t, d = x.d, v = x.v, S = x.S;
  const double e = x.e, rep = x.rep;
  const double params = x.over_rank(rank, [&](int st) { return x.sparams.of(st, S, layers[st]); });
  const double experts = x.over_rank(rank, [&](int st) { return layers[st] * x.sparams.per_layer_experts; });
  StateBytes state = gpu_state(l, state_dtypes(l), params, experts);
  // PipeDream-2BW keeps the weights before the last update beside the current ones: a
  // second copy of the rank's parameters in their compute dtype (ZeRO 0-2 hold them whole).
  if (pp::never_flushes(l.schedule)) state.params *= 2;
  // zb-v's rank 0 runs the embedding and a tied head in two chunks: the head's gradient
  // adds up in an fp32 buffer of its own until the step's last embedding backward (so the
  // sums do not follow the list's timings, model/gpt.h).
  if (l.schedule == pp::ScheduleKind::kZbV && rank == 0 && m.tied_head) state.grads += 4.0 * m.vocab / t * m.hidden;
  // The compressor's state (d > 1): PowerSGD's fp32 error feedback; 1-bit Adam's worker
  // error, its frozen 1/d and the exchange buffer (fp32 each), and the server's error of
  // the rank's chunk.
  if (d > 1 && l.compression.kind == parallel::Compression::Kind::kPowerSgd) state.optim += 4 * params;
  if (d > 1 && l.compression.kind == parallel::Compression::Kind::kOneBitAdam) state.optim += 12 * params + 4 * params / d;
  // peak_in_flight counts (micro-batch, chunk) sets; a set holds one of the rank's chunks
  // (its layers over v on average).
  const double sets = sim.peak_in_flight[rank];
  const double rank_layers = x.over_rank(rank, [&](int st) { return (double)layers[st]; });
  double act = sets * rank_layers / v * per_layer + rebuilt;
  if (rank == 0 && m.dropout) act += sets / v * rep;  // embedding dropout mask, 1 byte per element
  if (rank == x.last_rank) act += rep * e + x.logits * 4;  // final norm input, fp32 logits of one micro-batch
  // Between a B and its W the engine keeps copies of each linear layer's input and output
  // gradient (fp32, tp-local): 4h + (qkv + h + fc + ffn) / t elements per token and layer.
  if (x.split) act += sim.peak_pending_weights[rank] * rank_layers / v * x.lt.w_copy_bytes;
  double buffers = (t > 1 ? x.bsh * e : 0) + cp_buffer_bytes(x);
  if (d > 1 && x.once_per_step) {
    buffers += 4 * params + (l.zero == 3 ? params * e : 0);
  } else {
    if (d > 1 && (l.zero == 1 || l.zero == 2)) buffers += std::min(params * e, l.dp_bucket_bytes);
    if (d > 1 && l.zero == 3) buffers += 2 * x.sparams.per_layer * e;
  }
  return {state.params, state.grads, state.optim, act, buffers};
}

// Context parallelism's staging: the ring's block in hand and the one arriving (k and v,
// in the backward with their fp32 dK/dV sums, and the step's share added into the sum that
// arrives); Ulysses' q, k, v and output in head-major order; hybrid's Ulysses staging of its
// group's rows and its ring's blocks of them.
double cp_buffer_bytes(const Step& x) {
  if (x.l.cp <= 1) return 0;
  const double rows = x.b * x.s, kv_heads = kv_heads_local(x.m, x.t), kv = rows * 2 * kv_heads * x.m.head_dim();
  const double q = 2 * rows * x.m.hidden / x.t;  // q and the output: the same per rank in any trade
  switch (x.l.cp_comm) {
    case model::CpComm::kRing: return 2 * kv * x.e + 3 * kv * 4;
    case model::CpComm::kAllGather: return x.l.cp * kv * (x.e + 4);  // every rank's k, v and dK, dV
    case model::CpComm::kA2a: return (q + kv) * x.e;
    case model::CpComm::kHybrid: {
      const double a = x.l.cp_a2a, group_kv = a * rows * 2 * std::max(1.0, kv_heads / a) * x.m.head_dim();
      return (q + group_kv) * x.e + 2 * group_kv * x.e + 3 * group_kv * 4;
    }
  }
  return 0;
}

// Memory of the most loaded GPU, pipeline rank by pipeline rank.
void peak_memory(const Step& x, const std::vector<int>& layers, const pp::SimResult& sim, Prediction* r) {
  const ModelShape& m = x.m;
  const Layout& l = x.l;
  const int t = x.t;
  const double e = x.e;
  // A GPU's activations are those of its s / cp rows of each sequence.
  ModelShape rows = m;
  rows.seq = m.seq / l.cp;
  const double per_layer =
      activation_bytes_per_layer(rows, l.micro_batch, t, l.sp, l.recompute, l.attention, l.elementwise_recompute) * e / 2;
  // Full recompute rebuilds one layer's activations at a time during backward.
  const double rebuilt =
      l.recompute == Recompute::kFull
          ? activation_bytes_per_layer(rows, l.micro_batch, t, l.sp, Recompute::kNone, l.attention) * e / 2
          : 0;
  for (int rank = 0; rank < x.p; rank++) {
    const MemoryBreakdown mem = rank_memory(x, layers, sim, rank, per_layer, rebuilt);
    if (rank == 0 || mem.total() > r->memory.total()) r->memory = mem, r->memory_rank = rank;
  }
}

}  // namespace

Status predict(const ModelShape& m, const Layout& l, const Cluster& c, Prediction* out) {
  RETURN_IF_ERROR(validate(m, l));
  RETURN_IF_ERROR(validate(c));
  RETURN_IF_ERROR(check_fits_nodes(l, c));
  *out = Prediction();
  Prediction& r = *out;
  const Step x(m, l, c);
  const int t = x.t, p = x.p, v = x.v, S = x.S, mb = x.mb;
  const double h = x.h, V = x.V, e = x.e;
  r.micro_batches = mb;
  const LayerTime& lt = x.lt;
  r.layer_forward = {lt.gemm_f, lt.mem_f, lt.comm_f, 0};
  r.layer_backward = {lt.gemm_b, lt.mem_b, lt.comm_b, lt.recompute + lt.recompute_comm};
  const EdgeTimes g = edge_times(x);

  // Layers per stage: as given, or balanced on these costs.
  std::vector<int>& layers = r.stage_layers;
  RETURN_IF_ERROR(pp::split_layers(m.layers, S, {lt.forward() + lt.backward(), g.emb_f + g.emb_b, g.head_f + g.head_b},
                                   l.stage_layers, &layers));
  const double send = pipeline_send_s(x);
  const StageTimes st = stage_times(x, g, send, layers);

  // The pipeline, by the engine's schedule simulator on each stage's cost.
  pp::SimResult sim;
  RETURN_IF_ERROR(pp::simulate(l.schedule, p, mb, v, st.tf, st.tb, st.tw, &sim));
  r.pipeline_s = sim.makespan;
  double busy = 0;
  for (double b : sim.busy) busy += b;
  r.bubble = std::max(0.0, 1 - busy / (p * r.pipeline_s));

  // Data parallelism on the first stage's GPU (it finishes the pipeline last).
  const FirstRank f = first_rank(x, st, layers);
  DpTimes dp = dense_dp(x, f);
  add_expert_dp(x, f, &dp);
  const double expert_tp_sum = expert_tp_sum_s(x, f);
  // One link carries all of it: what does not fit in the pipeline's time cannot be hidden
  // behind it (ZeRO-3's gathers and the reduce-scatters share the data-parallel link).
  const double dp_exposed = std::max(dp.exposed, dp.total - r.pipeline_s);
  r.dp = {dp.total - std::min(dp.total, dp_exposed), std::min(dp.total, dp_exposed)};
  // dp_exposed beyond the ZeRO-3 part that already sits inside the pipeline time.
  const double dp_tail = r.dp.exposed - (x.once_per_step ? 0 : mb * f.z3_exposed);

  // Tensor and pipeline communication, all exposed, summed on the first stage's GPU.
  const double tp_layer = lt.comm_f + lt.comm_b + (lt.recompute_comm > 0 ? lt.comm_f : 0);
  r.tp.exposed = mb * (f.layers * tp_layer + g.edge_tp * (p == 1 ? 2 : 1)) + expert_tp_sum;
  r.ep.exposed = mb * f.layers * (lt.ep_f + lt.ep_b);
  const bool full = l.recompute == Recompute::kFull;  // (its recompute redoes the forward's comm)
  r.cp = {mb * f.layers * lt.cp_hidden, mb * f.layers * (lt.cp_f + lt.cp_b + (full ? lt.cp_f : 0))};
  // A tied embedding's two copies (first and last stage, (p - 1) t d ranks apart) sum
  // their gradients after the backward (Shoeybi et al. 2019; the engine's set_pipeline).
  // In a V both stages are on rank 0: one copy.
  const double tied = p > 1 && m.tied_head && x.last_rank != 0
                          ? all_reduce_s(V * h / t * e, x.tied_ring)
                          : 0;
  r.pp.exposed = 2 * mb * v * send + tied;
  r.optimizer_s = optimizer_s(x, f);

  r.step_s = r.pipeline_s + dp_tail + tied + expert_tp_sum + r.optimizer_s + dp.compressor_s;
  r.tokens_per_s = l.global_batch * (double)m.seq / r.step_s;
  r.model_flops = model_flops(m, l.global_batch);
  r.tflops_per_gpu = narayanan_flops(m, l.global_batch) / (r.step_s * l.world()) / 1e12;
  r.model_tflops_per_gpu = r.model_flops / (r.step_s * l.world()) / 1e12;
  r.mfu = r.model_flops / (r.step_s * l.world() * x.peak);
  peak_memory(x, layers, sim, &r);
  r.memory_available = c.memory_bytes - c.reserved_bytes;
  return Status::ok();
}

}  // namespace meshtrain::planner
