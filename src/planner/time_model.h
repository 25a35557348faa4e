// The planner's time model: step time, throughput, communication per axis and memory per
// GPU of one layout of a decoder-only transformer (GPT- or Llama-shaped) on a cluster, from
// first principles plus a few calibrated efficiencies (planner/cluster.h). Every
// assumption and its source is in docs/planning.md ("Time model");
// tests/unit/test_planner_time.cc holds it to published runs.
//
// Shape of the computation (per GPU, per micro-batch of b sequences of s tokens):
//   layer = the block's GEMMs at their tensor-parallel shapes (q k v, o, the MLP's two or
//           three matrices, attention per local head; over peak x efficiency(shape)) +
//           memory-bound kernels (bytes over HBM bandwidth) + the block's tp collectives
//           (exposed); recompute adds forward work to backward;
//   stage = its layers (a split per stage, even or not) + the embedding on the first stage,
//           the head and loss on the last -> pp::simulate (the engine's own schedule
//           generator) with each stage's own cost;
//   step  = pipeline + exposed data-parallel reduction + optimizer step.
//
// Rank order (Megatron's, and the engine's mesh; Layout::order, `--rank-order`): by default
// tp varies fastest, then dp, then pp. A group of stride k and size n sits in one node when
// k n <= GPUs per node; otherwise it crosses nodes (planner/placement.h; docs/planning.md
// for the bandwidth such a ring gets).
//
// predict() allocates a few vectors of p x v entries and inside pp::simulate; a layout
// search may call it thousands of times.
#pragma once
#include <string>
#include <vector>

#include "comm/mesh.h"
#include "core/status.h"
#include "model/config.h"
#include "model/param_layout.h"
#include "model/recompute.h"
#include "parallel/dp/compressed_reduce.h"
#include "parallel/dp/quantized_comm.h"
#include "parallel/layout.h"
#include "parallel/pp/schedule.h"
#include "planner/cluster.h"

namespace meshtrain::planner {

// A model as the time model sees it: the engine's architecture record (model::GptConfig)
// reduced to what costs time and memory. The defaults of the parts are GPT-2/3's (and
// Megatron's): multi-head attention, a 4h GELU MLP, LayerNorm, learned positions, biases,
// a tied head and dropout. Llama's are GQA, SwiGLU of its own width, RMSNorm, RoPE, no
// biases, an untied head and no dropout.
struct ModelShape {
  int layers = 0, hidden = 0, heads = 0, seq = 0, vocab = 0;
  int kv_heads = 0;        // key/value heads: 0 means heads (MHA); fewer is GQA, 1 MQA
  int ffn = 0;             // the MLP's hidden width: 0 means 4 hidden
  bool swiglu = false;     // gate and up projections (ffn wide each) then down; else fc1, GELU, fc2
  bool rms_norm = false;   // one weight per norm; else LayerNorm's weight and bias
  bool rope = false;       // rotary positions, no parameters; else a seq x hidden table
  bool bias = true;        // biases on every linear layer
  bool tied_head = true;   // the head is the embedding; else its own vocab x hidden
  bool dropout = true;     // dropout after attention, the projections and the embedding
  // Mixture of Experts (docs/moe.md): in every moe_every-th layer the MLP is a router over
  // `experts` MLPs of expert_ffn (0: ffn), top_k per token, plus shared experts. The time
  // model treats each layer as the average of its dense and MoE layers.
  int experts = 0, top_k = 2, moe_every = 1, shared_experts = 0, expert_ffn = 0;

  int kv() const { return kv_heads > 0 ? kv_heads : heads; }
  bool is_moe() const { return experts > 0; }
  // The share of layers that are MoE layers, an expert's weights, the dense MLP's.
  double moe_fraction() const {
    return is_moe() ? (double)((layers + moe_every - 1) / moe_every) / layers : 0.0;
  }
  int expert_width() const { return expert_ffn > 0 ? expert_ffn : ffn_width(); }
  double expert_weights() const { return (swiglu ? 3.0 : 2.0) * hidden * expert_width(); }
  double dense_mlp_weights() const { return (swiglu ? 3.0 : 2.0) * hidden * ffn_width(); }
  int ffn_width() const { return ffn > 0 ? ffn : 4 * hidden; }
  double head_dim() const { return (double)hidden / heads; }
  // Weights of one block's matrices a token uses: q, k, v, o and the MLP's two or three
  // (an MoE layer: its router, top_k and shared experts), averaged over the layers.
  double block_matrix_weights() const;
};

// The engine's model: its padded vocabulary (the head GEMM's width), and its maximum
// sequence length unless `seq` > 0. GPT-2-shaped models train with dropout, others without.
ModelShape model_shape(const model::GptConfig& c, int seq = 0);

// How attention runs: one fused kernel that never writes the b x a x s x s scores
// (FlashAttention, Dao et al. 2022; what current stacks and the engine's own blocked kernel
// do), or Megatron 2021-22's unfused kernels (the published A100 runs of Narayanan et al. and
// Korthikanti et al.), which keep the softmax output and dropout mask for the backward.
enum class Attention { kFused, kUnfused };
const char* attention_name(Attention a);  // "fused", "unfused"
Status parse_attention(const std::string& name, Attention* out);

// The engine's enum (model/recompute.h), also the planner's.
using model::Recompute;
using model::parse_recompute;
using model::recompute_name;

struct Layout : parallel::Layout {
  // The axes, the batch and the choices are the engine's (parallel/layout.h, whose
  // validate() holds every rule joining them); what follows only the cost models read.
  Layout() { precision = Precision::kBf16; }  // the GPU planner's default
  // The most loaded expert's tokens over the mean (1: balanced): the experts' GEMMs wait
  // for it, and a rank's all-to-all carries its share.
  double moe_imbalance = 1.0;
  // Data-parallel reduction overlapped with the last backward (bucket by bucket, as
  // PyTorch DDP and the engine do); false: all of it after the backward (Megatron's 2021
  // "local" DDP).
  bool dp_overlap = true;
  double dp_bucket_bytes = 25e6;  // PyTorch DDP's default bucket, and the engine's
  // Pipeline sends split over the tp ranks and re-gathered over NVLink (Narayanan et al.
  // 2021 §4.1, "scatter/gather"); sequence parallelism shards the sends anyway.
  bool pp_scatter_gather = true;
  Attention attention = Attention::kFused;
  // The backward recomputes the element-wise results it needs instead of keeping them: the
  // two norms' outputs (the q k v and MLP-in linears' inputs) from their kept inputs, and
  // the MLP activation's output (MLP-out's input) from its kept input (SwiGLU's gate and
  // up). Passes over memory buy 4 + 2 f/h of a layer's s b h/t bytes back; with recompute
  // none it is what lets Llama 3 405B's published TP8 PP16 interleaved layouts fit in 80 GB
  // (docs/planning.md, "Long context"). Megatron-Core's recompute modules "layernorm" and
  // the activation; Liger's fused SwiGLU.
  bool elementwise_recompute = false;
};

// Activation bytes one transformer layer keeps for its backward, for one micro-batch of b
// sequences with 16-bit activations. For a GPT block with unfused attention this is
// Korthikanti et al. 2022, Table 2: s b h (34 + 5as/h) without parallelism (t the
// tensor-parallel size); the same inventory, tensor by tensor, covers the other parts
// (docs/planning.md, "Memory per GPU"): GQA's narrower k and v, SwiGLU's gate and up, no
// dropout masks, and a fused attention's per-row softmax statistics instead of the
// s x s scores. Full recompute keeps the layer input, 2sbh, sharded over t with sp.
double activation_bytes_per_layer(const ModelShape& m, int micro_batch, int tp, bool sp, Recompute r,
                                  Attention attention, bool elementwise_recompute = false);

// Parameters: every block's matrices, biases and norms, the embedding (and positions), an
// untied head, the final norm. For a GPT this is Narayanan et al. 2021's
// 12 L h^2 (1 + 13/(12h) + (V + s)/(12 L h)) plus the final LayerNorm's 2h.
double parameter_count(const ModelShape& m);
// Model FLOPs per step, no recompute: 6 per weight per token for the blocks' matrices and the
// head, and 12 s h per token per layer for attention's two products (Korthikanti et al.
// 2022; for a GPT, 72 B L s h^2 (1 + s/(6h) + V/(12 h L))).
double model_flops(const ModelShape& m, double global_batch);
// Narayanan et al. 2021's F, which counts one extra forward (full recompute): for a GPT
// 96 B s L h^2 (1 + s/(6h) + V/(16 L h)). Their Table 1's TFLOP/s per GPU divide this.
double narayanan_flops(const ModelShape& m, double global_batch);

// Communication of one axis over one step (seconds of the critical rank).
struct CommTime {
  double hidden = 0;   // overlapped with compute
  double exposed = 0;  // on the critical path
  double total() const { return hidden + exposed; }
};

// Seconds of one layer's pass for one micro-batch on one GPU, by kind of work.
struct LayerCost {
  double gemm = 0;       // the block's GEMMs over peak x efficiency(shape)
  double memory = 0;     // memory-bound kernels over HBM bandwidth
  double tp_comm = 0;    // tensor-parallel collectives (exposed)
  double recompute = 0;  // backward only: the forward work (and its tp comm) redone
  double total() const { return gemm + memory + tp_comm + recompute; }
};

// Per-GPU bytes, the most loaded GPU.
struct MemoryBreakdown {
  double params = 0, grads = 0, optim = 0;  // planner/memory.h, ZeRO stage over dp
  double activations = 0;                   // Table 2 x layers x micro-batches in flight
  double buffers = 0;                       // communication staging (docs/planning.md)
  double total() const { return params + grads + optim + activations + buffers; }
};

struct Prediction {
  int micro_batches = 0;  // m = B / (b dp)
  double step_s = 0;
  double tokens_per_s = 0;
  double model_flops = 0;     // per step, model_flops()
  double tflops_per_gpu = 0;  // narayanan_flops() / (step_s GPUs) / 1e12 (a recomputed forward counted)
  double model_tflops_per_gpu = 0;  // model_flops / (step_s GPUs) / 1e12: what MFU divides by peak
  double mfu = 0;             // model_flops / (step_s GPUs peak)
  double bubble = 0;          // idle fraction of the pipeline phase, all ranks
  CommTime tp, pp, dp, ep;  // ep: the MoE all-to-all (exposed)
  CommTime cp;              // context parallelism: the ring's sends behind attention, a2a's exposed
  double pipeline_s = 0;   // forward/backward of all micro-batches, with the bubble
  double optimizer_s = 0;  // the optimizer step on this rank's shard
  // One layer, one micro-batch, one GPU: forward, and backward with its recompute.
  LayerCost layer_forward, layer_backward;
  MemoryBreakdown memory;    // the GPU whose total is largest
  int memory_rank = 0;       // its pipeline rank
  std::vector<int> stage_layers;  // layers per pipeline stage, as given or as split
  double memory_available = 0;  // cluster memory per GPU less its reserved allowance
  bool fits() const { return memory.total() <= memory_available; }
};

// Rejects a model shape that is not one (sizes < 1, heads not dividing hidden, ...), a cost
// model's own setting out of range, and every layout rule the layout breaks
// (parallel::validate, for `reader`: the GPU planner by default, the local planner in
// planner/local.h), each on a line.
parallel::LayoutModel layout_model(const ModelShape& m);
Status validate(const ModelShape& m, const Layout& l,
                parallel::LayoutReader reader = parallel::LayoutReader::kGpuPlanner);
// The same, the rules asked of `lm` (the engine's model, parallel::layout_model(config), whose
// padded vocabulary the shape does not carry: the local planner's).
Status validate(const ModelShape& m, const Layout& l, const parallel::LayoutModel& lm, parallel::LayoutReader reader);

Status predict(const ModelShape& m, const Layout& l, const Cluster& c, Prediction* out);

}  // namespace meshtrain::planner
