#include "planner/time_model.h"

#include <algorithm>
#include <cmath>

#include "planner/memory.h"

namespace meshtrain::planner {

namespace pp = parallel::pp;

ModelShape model_shape(const model::GptConfig& c, int seq) {
  return {c.layers, c.dim, c.heads, seq > 0 ? seq : c.max_seq_len, c.padded_vocab()};
}

const char* recompute_name(Recompute r) {
  switch (r) {
    case Recompute::kNone:
      return "none";
    case Recompute::kSelective:
      return "selective";
    case Recompute::kFull:
      return "full";
  }
  return "?";
}

Status parse_recompute(const std::string& name, Recompute* out) {
  for (Recompute r : {Recompute::kNone, Recompute::kSelective, Recompute::kFull})
    if (name == recompute_name(r)) return *out = r, Status::ok();
  return Status::error("unknown recompute mode '" + name + "' (choose none, selective or full)");
}

double activation_bytes_per_layer(const ModelShape& m, int micro_batch, int tp, bool sp, Recompute r) {
  const double s = m.seq, b = micro_batch, h = m.hidden, a = m.heads, t = tp;
  const double sbh = s * b * h;
  switch (r) {
    case Recompute::kFull:
      return sp ? 2 * sbh / t : 2 * sbh;
    case Recompute::kSelective:
      return sp ? 34 * sbh / t : sbh * (10 + 24 / t);
    case Recompute::kNone:
      return sp ? sbh / t * (34 + 5 * a * s / h) : sbh * (10 + 24 / t + 5 * a * s / (h * t));
  }
  return 0;
}

double parameter_count(const ModelShape& m) {
  const double L = m.layers, h = m.hidden;
  return 12 * L * h * h * (1 + 13 / (12 * h) + (m.vocab + (double)m.seq) / (12 * L * h));
}

double model_flops(const ModelShape& m, double B) {
  const double L = m.layers, h = m.hidden, s = m.seq;
  return 72 * B * L * s * h * h * (1 + s / (6 * h) + m.vocab / (12 * h * L));
}

double narayanan_flops(const ModelShape& m, double B) {
  const double L = m.layers, h = m.hidden, s = m.seq;
  return 96 * B * s * L * h * h * (1 + s / (6 * h) + m.vocab / (16 * L * h));
}

Status validate(const ModelShape& m, const Layout& l) {
  auto positive = [](const char* name, double v) {
    return v >= 1 ? Status::ok()
                  : Status::error(std::string(name) + " must be >= 1, got " + std::to_string((long long)v));
  };
  RETURN_IF_ERROR(positive("layers", m.layers));
  RETURN_IF_ERROR(positive("hidden", m.hidden));
  RETURN_IF_ERROR(positive("heads", m.heads));
  RETURN_IF_ERROR(positive("seq", m.seq));
  RETURN_IF_ERROR(positive("vocab", m.vocab));
  RETURN_IF_ERROR(positive("tp", l.tp));
  RETURN_IF_ERROR(positive("pp", l.pp));
  RETURN_IF_ERROR(positive("dp", l.dp));
  RETURN_IF_ERROR(positive("micro_batch", l.micro_batch));
  RETURN_IF_ERROR(positive("global_batch", l.global_batch));
  RETURN_IF_ERROR(positive("virtual_stages", l.virtual_stages));
  auto str = [](long long v) { return std::to_string(v); };
  if (m.hidden % m.heads != 0)
    return Status::error("heads (" + str(m.heads) + ") must divide hidden (" + str(m.hidden) + ")");
  if (m.heads % l.tp != 0) return Status::error("tp (" + str(l.tp) + ") must divide heads (" + str(m.heads) + ")");
  if (l.global_batch % ((long long)l.micro_batch * l.dp) != 0)
    return Status::error("global_batch (" + str(l.global_batch) + ") must be a multiple of micro_batch x dp (" +
                         str((long long)l.micro_batch * l.dp) + ")");
  if (m.layers % ((long long)l.pp * l.virtual_stages) != 0)
    return Status::error("layers (" + str(m.layers) + ") must be a multiple of pp x virtual_stages (" +
                         str((long long)l.pp * l.virtual_stages) + ")");
  if (l.zero < 0 || l.zero > 3) return Status::error("zero must be 0, 1, 2 or 3, got " + str(l.zero));
  if (l.sp && l.tp == 1) return Status::error("sp (sequence parallelism) needs tp > 1");
  if (!(l.dp_bucket_bytes > 0)) return Status::error("dp_bucket_bytes must be > 0");
  const int micro_batches = l.global_batch / (l.micro_batch * l.dp);
  if (l.schedule != pp::ScheduleKind::kInterleaved && l.virtual_stages != 1)
    return Status::error("virtual_stages > 1 needs the interleaved schedule");
  if (l.schedule == pp::ScheduleKind::kInterleaved) {
    if (l.virtual_stages < 2) return Status::error("the interleaved schedule needs virtual_stages >= 2");
    if (micro_batches % l.pp != 0)
      return Status::error("the interleaved schedule needs the micro-batch count (" + str(micro_batches) +
                           ") to be a multiple of pp (" + str(l.pp) + ")");
  }
  return Status::ok();
}

namespace {

// A ring's view of the network for one group (docs/planning.md, "Links"): ranks ordered tp,
// dp, pp from fastest; a group of stride `stride` and `size` members.
struct Ring {
  int n = 1;
  double bandwidth = 0;  // bytes/s each rank gets, after link efficiency
  double latency = 0;    // per ring step
  bool inter_node = false;
};

Ring ring_for(int stride, int size, const Cluster& c) {
  Ring r;
  r.n = size;
  const int node = c.gpus_per_node;
  if ((long long)stride * size <= node) {
    r.bandwidth = c.intra.bandwidth * c.link_efficiency;
    r.latency = c.intra.latency;
    return r;
  }
  // Crossing nodes: each node's k members of the group drive k NICs at once (one per GPU,
  // rail-optimised DGX networking); NCCL runs several rings so a ring's node-boundary hops
  // share all k NICs while its in-node hops use NVLink. Per-rank bandwidth is k NICs' worth,
  // capped by NVLink.
  const int k = std::clamp(node / std::max(stride, 1), 1, size);
  r.bandwidth = std::min(c.intra.bandwidth, k * c.inter.bandwidth) * c.link_efficiency;
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

// Reductions of `bytes` in buckets that become ready evenly during `window` seconds of
// backward, each taking `per_bucket` seconds one after the other: what sticks out past the
// window. Comm faster than production: only the last bucket; slower: the backlog.
double exposed_after_window(double total, double per_bucket, int buckets, double window) {
  if (total <= 0) return 0;
  return std::min(total, std::max(per_bucket, total - window * (buckets - 1) / buckets));
}

// One layer's forward and backward, per micro-batch, per GPU.
struct LayerTime {
  double gemm_f = 0, mem_f = 0, comm_f = 0;  // forward: GEMMs, memory-bound kernels, tp comm
  double gemm_b = 0, mem_b = 0, comm_b = 0;  // backward, without recompute
  double recompute = 0, recompute_comm = 0;  // added to backward by the recompute policy
  double forward() const { return gemm_f + mem_f + comm_f; }
  double backward() const { return gemm_b + mem_b + comm_b + recompute + recompute_comm; }
};

LayerTime layer_time(const ModelShape& m, const Layout& l, const Cluster& c, const Ring& tp_ring) {
  const double b = l.micro_batch, s = m.seq, h = m.hidden, a = m.heads, t = l.tp, e = element_bytes(l.precision);
  const double peak = c.peak_flops(l.precision), hbm = c.hbm_bandwidth * c.hbm_efficiency;
  const double bs = b * s, hd = h / a, heads_local = a / t;
  auto gemm = [&](double M, double N, double K, double batch) {
    return 2 * M * N * K * batch / (peak * c.gemm.at(M, N, K));
  };
  // The six GEMMs of a Megatron block at their tensor-parallel shapes (Shoeybi et al. 2019,
  // Fig. 3): column-parallel QKV and fc1, row-parallel projection and fc2, attention per
  // local head. Each backward GEMM (input gradient, weight gradient) has the forward's
  // dimensions permuted: twice the forward time.
  const double qkv = gemm(bs, 3 * h / t, h, 1), proj = gemm(bs, h, h / t, 1);
  const double fc1 = gemm(bs, 4 * h / t, h, 1), fc2 = gemm(bs, h, 4 * h / t, 1);
  const double scores = gemm(s, s, hd, b * heads_local), context = gemm(s, hd, s, b * heads_local);
  // Memory-bound kernels, bytes per element (docs/planning.md, "Memory-bound kernels"):
  // the layer's two LayerNorms and two bias-dropout-adds run on the whole b s h (1/t of it
  // with sp), bias-GeLU on 4bsh/t, scale-mask-softmax and attention dropout on b a s^2/t.
  const double rep = l.sp ? bs * h / t : bs * h;  // elements of the replicated regions
  const double mlp = 4 * bs * h / t, score_elems = b * heads_local * s * s;
  // Plus the attention's layout copies of q, k, v and the context (b s h/t each).
  const double ln_f = 2 * e, bda_f = 3 * e + 1, gelu_f = 2 * e, softmax_f = 2 * e, drop_f = 2 * e + 1;
  const double ln_b = 3 * e, bda_b = 6 * e + 1, gelu_b = 4 * e, softmax_b = 3 * e, drop_b = 2 * e + 1;
  const double copies = 4 * bs * h / t * 2 * e;
  const double attn_core_mem = score_elems * (softmax_f + drop_f) / hbm;
  LayerTime lt;
  lt.gemm_f = qkv + proj + fc1 + fc2 + scores + context;
  lt.mem_f = (rep * 2 * (ln_f + bda_f) + mlp * gelu_f + copies) / hbm + attn_core_mem;
  lt.gemm_b = 2 * lt.gemm_f;
  lt.mem_b = (rep * 2 * (ln_b + bda_b) + mlp * gelu_b + copies + score_elems * (softmax_b + drop_b)) / hbm;
  // Megatron's tensor parallelism: two all-reduces of b s h forward and two backward; with
  // sp an all-gather and a reduce-scatter in their place, the same bytes (Korthikanti et al.
  // 2022 §4.2.2). Not overlapped with compute.
  // With sp the column-parallel layers keep only their sequence shard of the input, so the
  // backward all-gathers it once more for each weight gradient (QKV, fc1; Korthikanti et al.
  // 2022 §4.2.2 overlap it with the input-gradient GEMM; counted exposed here, as the other
  // tp collectives).
  const double act = bs * h * e;
  const double one = l.sp ? 2 * all_gather_s(act, tp_ring) : all_reduce_s(act, tp_ring);
  lt.comm_f = 2 * one;
  lt.comm_b = 2 * one + (l.sp ? 2 * all_gather_s(act, tp_ring) : 0);
  switch (l.recompute) {
    case Recompute::kNone:
      break;
    case Recompute::kSelective:
      lt.recompute = scores + context + attn_core_mem;
      break;
    case Recompute::kFull:
      lt.recompute = lt.gemm_f + lt.mem_f;
      lt.recompute_comm = lt.comm_f;
      break;
  }
  return lt;
}

// Parameters one GPU holds for its pipeline stage (tp-sharded matrices, replicated
// LayerNorms and row-parallel biases): first stage with the token and position embedding,
// last stage with the tied head's copy and the final LayerNorm.
struct StageParams {
  double first = 0, last = 0, per_layer = 0;
};

StageParams stage_params(const ModelShape& m, const Layout& l) {
  const double h = m.hidden, t = l.tp;
  StageParams p;
  p.per_layer = 12 * h * h / t + 7 * h / t + 6 * h;
  const double layers = p.per_layer * m.layers / l.pp;
  const double embedding = (double)m.vocab * h / t + (double)m.seq * h;
  const double head = (l.pp > 1 ? (double)m.vocab * h / t : 0) + 2 * h;
  p.first = layers + embedding + (l.pp == 1 ? head : 0);
  p.last = l.pp == 1 ? p.first : layers + head;
  return p;
}

}  // namespace

Status predict(const ModelShape& m, const Layout& l, const Cluster& c, Prediction* out) {
  RETURN_IF_ERROR(validate(m, l));
  RETURN_IF_ERROR(validate(c));
  *out = Prediction();
  Prediction& r = *out;
  const int t = l.tp, p = l.pp, d = l.dp, v = l.virtual_stages;
  const int mb = l.global_batch / (l.micro_batch * d);
  r.micro_batches = mb;
  const double b = l.micro_batch, s = m.seq, h = m.hidden, V = m.vocab, e = element_bytes(l.precision);
  const double peak = c.peak_flops(l.precision), hbm = c.hbm_bandwidth * c.hbm_efficiency;
  const double bsh = b * s * h;

  const Ring tp_ring = ring_for(1, t, c), dp_ring = ring_for(t, d, c), pp_ring = ring_for(t * d, p, c);
  const LayerTime lt = layer_time(m, l, c, tp_ring);
  r.layer_forward = {lt.gemm_f, lt.mem_f, lt.comm_f, 0};
  r.layer_backward = {lt.gemm_b, lt.mem_b, lt.comm_b, lt.recompute + lt.recompute_comm};
  const int layers_per_chunk = m.layers / (p * v);

  // Pipeline sends: one activation forward, one gradient backward per chunk and micro-batch,
  // b s h elements, 1/t of it per GPU with scatter/gather or sp (then re-gathered in-node).
  double send = 0;
  if (p > 1) {
    const bool split = (l.pp_scatter_gather || l.sp) && t > 1;
    send = p2p_s(bsh * e / (split ? t : 1), pp_ring) + (split && !l.sp ? all_gather_s(bsh * e, tp_ring) : 0);
  }

  // ZeRO-3: each chunk's parameters are all-gathered before its forward and again before its
  // backward (its gradients are reduce-scattered with the other stages' below); prefetch
  // hides a gather behind the previous layer's compute, except the first layer's.
  const StageParams sparams = stage_params(m, l);
  double tf = layers_per_chunk * lt.forward() + send;
  double tb = layers_per_chunk * lt.backward() + send;
  double z3_gather = 0, z3_exposed = 0;  // per chunk, forward + backward
  if (l.zero == 3 && d > 1) {
    // Gathers layer by layer: the stage's parameters (embedding included) over its chunks,
    // one collective per layer.
    const double layer_gather = all_gather_s(sparams.per_layer * e, dp_ring);
    const double chunk_gather =
        all_gather_s(sparams.first * e / v, dp_ring) + (layers_per_chunk - 1) * (d - 1) * dp_ring.latency;
    const double exposed_f = std::max(layer_gather, chunk_gather - layers_per_chunk * lt.forward());
    const double exposed_b = std::max(layer_gather, chunk_gather - layers_per_chunk * lt.backward());
    tf += exposed_f;
    tb += exposed_b;
    z3_gather = 2 * chunk_gather;
    z3_exposed = exposed_f + exposed_b;
  }

  // First stage: embedding lookup + position add + dropout, its tp reduction (all-reduce, or
  // reduce-scatter with sp) forward; the scatter-add of its gradient backward.
  const double rep = l.sp ? bsh / t : bsh;
  const double emb_f =
      rep * (5 * e + 1) / hbm + (l.sp ? all_gather_s(bsh * e, tp_ring) : all_reduce_s(bsh * e, tp_ring));
  const double emb_b = rep * (5 * e + 1) / hbm + (l.sp ? all_gather_s(bsh * e, tp_ring) : 0);
  // Last stage: final LayerNorm, the vocabulary-parallel head GEMM and cross-entropy (fp32
  // logits: cast, max, exp, sum, ~(e + 20) bytes per logit forward, (4 + e) backward), and
  // the head's input gradient all-reduce (with sp: all-gather forward, reduce-scatter back).
  const double logits = b * s * V / t;
  const double head_gemm = 2 * b * s * (V / t) * h / (peak * c.gemm.at(b * s, V / t, h));
  const double head_f =
      rep * 2 * e / hbm + head_gemm + logits * (e + 20) / hbm + (l.sp ? all_gather_s(bsh * e, tp_ring) : 0);
  const double head_b = rep * 3 * e / hbm + 2 * head_gemm + logits * (4 + e) / hbm +
                        (l.sp ? all_gather_s(bsh * e, tp_ring) : all_reduce_s(bsh * e, tp_ring));
  // The tp collectives among these (for the per-axis account): sp ? 2 all-gather-sized : 1 all-reduce.
  const double edge_tp = l.sp ? 2 * all_gather_s(bsh * e, tp_ring) : all_reduce_s(bsh * e, tp_ring);

  // The pipeline, by the engine's schedule simulator on equal per-chunk costs; the first and
  // last stages' extra work lies on the steady-state critical path of every micro-batch.
  pp::SimResult sim;
  RETURN_IF_ERROR(pp::simulate(l.schedule, p, mb, v, tf, tb, &sim));
  const double extra_first = emb_f + emb_b, extra_last = head_f + head_b;
  const double extra = p == 1 ? extra_first + extra_last : std::max(extra_first, extra_last);
  r.pipeline_s = sim.makespan + mb * extra;
  double busy = mb * (extra_first + extra_last);
  for (double x : sim.busy) busy += x;
  r.bubble = std::max(0.0, 1 - busy / (p * r.pipeline_s));

  // Data parallelism on the first stage's GPU (it finishes the pipeline last).
  const double grad_bytes = sparams.first * e;
  const int buckets = std::max(1, (int)std::ceil(grad_bytes / l.dp_bucket_bytes));
  const double bucket = grad_bytes / buckets;
  const double last_backward = v * tb + (p == 1 ? emb_b + head_b : emb_b);  // last micro-batch
  double dp_total = 0, dp_exposed = 0;
  if (d > 1) {
    if (l.zero <= 1) {
      // Stage 0: all-reduce after the last micro-batch; stage 1: reduce-scatter of the same
      // gradients then an all-gather of the updated parameters after the step (ZeRO §7: the
      // same 2 Psi volume).
      const double per = l.zero == 0 ? all_reduce_s(bucket, dp_ring) : all_gather_s(bucket, dp_ring);
      dp_total = buckets * per;
      dp_exposed = l.dp_overlap ? exposed_after_window(dp_total, per, buckets, last_backward) : dp_total;
    } else {
      // Stages 2-3 keep sharded gradients: a reduce-scatter after every micro-batch's
      // backward (the engine's order), hidden behind the backward of the next ones.
      const double per = all_gather_s(bucket, dp_ring);
      const double one_mb = buckets * per;
      dp_total = mb * one_mb;
      const double window = mb * last_backward;
      dp_exposed = l.dp_overlap ? exposed_after_window(dp_total, per, buckets * mb, window) : dp_total;
      // ZeRO-3's gathers, whose exposed part is already inside tf and tb.
      dp_total += mb * v * z3_gather;
      dp_exposed += mb * v * z3_exposed;
    }
    if (l.zero == 1 || l.zero == 2) {  // updated parameters all-gathered after the step
      const double ag = all_gather_s(grad_bytes, dp_ring);
      dp_total += ag;
      dp_exposed += ag;
    }
  }
  // One link carries all of it: what does not fit in the pipeline's time cannot be hidden
  // behind it (ZeRO-3's gathers and the reduce-scatters share the data-parallel link).
  dp_exposed = std::max(dp_exposed, dp_total - r.pipeline_s);
  r.dp = {dp_total - std::min(dp_total, dp_exposed), std::min(dp_total, dp_exposed)};
  // dp_exposed beyond the ZeRO-3 part that already sits inside the pipeline time.
  const double dp_tail = r.dp.exposed - mb * v * z3_exposed;

  // Tensor and pipeline communication, all exposed, summed on the first stage's GPU.
  const double tp_layer = lt.comm_f + lt.comm_b + lt.recompute_comm;
  r.tp.exposed = mb * ((double)m.layers / p * tp_layer + edge_tp * (p == 1 ? 2 : 1));
  // The tied embedding's two copies (first and last stage, (p - 1) t d ranks apart) sum
  // their gradients after the backward (Shoeybi et al. 2019; the engine's set_pipeline).
  const double tied = p > 1 ? all_reduce_s(V * h / t * e, ring_for((p - 1) * t * d, 2, c)) : 0;
  r.pp.exposed = 2 * mb * v * send + tied;

  // Optimizer step on this GPU's shard, as passes over memory (Megatron's mixed-precision
  // optimizer): read the gradients for the overflow check, for the norm and in Adam; read
  // and write the fp32 master weights and both moments; read the fp32 master again to write
  // the 16-bit weights; zero the gradient buffer.
  const StateDtypes dt = l.precision == Precision::kFp32 ? kFp32State : kMixedState;
  const StateBytes first_state = model_state_bytes(sparams.first, dt, l.zero, d);
  const double owned = first_state.optim / dt.optim;
  const double master = l.precision == Precision::kFp32 ? 0 : 4;  // fp32 copy read for the cast
  r.optimizer_s = (2 * first_state.optim + owned * (3 * dt.grad + master + dt.param) + first_state.grads) / hbm;

  r.step_s = r.pipeline_s + dp_tail + tied + r.optimizer_s;
  r.tokens_per_s = l.global_batch * s / r.step_s;
  r.model_flops = model_flops(m, l.global_batch);
  r.tflops_per_gpu = narayanan_flops(m, l.global_batch) / (r.step_s * l.gpus()) / 1e12;
  r.mfu = r.model_flops / (r.step_s * l.gpus() * peak);

  // Memory of the most loaded GPU.
  const StateBytes state = model_state_bytes(std::max(sparams.first, sparams.last), dt, l.zero, d);
  r.memory.params = state.params;
  r.memory.grads = state.grads;
  r.memory.optim = state.optim;
  const double per_layer = activation_bytes_per_layer(m, l.micro_batch, t, l.sp, l.recompute) * e / 2;
  double act = 0;
  for (int rank : {0, p - 1}) {
    // peak_in_flight counts (micro-batch, chunk) sets of L/(p v) layers each.
    const double sets = sim.peak_in_flight[rank];
    double a = sets * layers_per_chunk * per_layer;
    if (rank == 0) a += sets / v * rep;            // embedding dropout mask, 1 byte per element
    if (rank == p - 1) a += rep * e + logits * 4;  // final LayerNorm input, fp32 logits of one micro-batch
    act = std::max(act, a);
  }
  // Full recompute rebuilds one layer's activations at a time during backward.
  if (l.recompute == Recompute::kFull)
    act += activation_bytes_per_layer(m, l.micro_batch, t, l.sp, Recompute::kNone) * e / 2;
  r.memory.activations = act;
  // Communication staging: one dp bucket in flight (stages 1-2 reduce-scatter into a
  // separate buffer), ZeRO-3's gathered current and prefetched layers, and the tp
  // collectives' output buffer of b s h.
  double buffers = t > 1 ? bsh * e : 0;
  if (d > 1 && (l.zero == 1 || l.zero == 2)) buffers += std::min(grad_bytes, l.dp_bucket_bytes);
  if (d > 1 && l.zero == 3) buffers += 2 * sparams.per_layer * e;
  r.memory.buffers = buffers;
  r.memory_available = c.memory_bytes - c.reserved_bytes;
  return Status::ok();
}

}  // namespace meshtrain::planner
