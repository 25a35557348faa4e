// The planner's time model: step time, throughput, communication per axis and memory per
// GPU of one layout of a GPT on a cluster, from first principles plus a few calibrated
// efficiencies (planner/cluster.h). Every assumption and its source is in docs/planning.md
// ("Time model"); tests/unit/test_planner_time.cc holds it to published runs.
//
// Shape of the computation (per GPU, per micro-batch of b sequences of s tokens):
//   layer = the six GEMMs of a Megatron block at their tensor-parallel shapes (over peak x
//           efficiency(shape)) + memory-bound kernels (bytes over HBM bandwidth) + the
//           block's tp collectives (exposed); recompute adds forward work to backward;
//   stage = L/(p v) layers per chunk (+ embedding on the first stage, head and loss on the
//           last) -> pp::simulate (the engine's own schedule generator) for the pipeline;
//   step  = pipeline + exposed data-parallel reduction + optimizer step.
//
// Rank order (Megatron's, and the engine's mesh): tp varies fastest, then dp, then pp. A
// group of stride k and size n sits in one node when k n <= GPUs per node; otherwise it
// crosses nodes (see docs/planning.md for the bandwidth such a ring gets).
//
// predict() allocates only inside pp::simulate; a layout search may call it thousands of
// times.
#pragma once
#include <string>

#include "core/status.h"
#include "model/config.h"
#include "parallel/pp/schedule.h"
#include "planner/cluster.h"

namespace meshtrain::planner {

// A GPT's shape: L layers, hidden h, a heads, sequence s, vocabulary V (tied embedding,
// learned positions, as GPT-2/3 and Megatron).
struct ModelShape {
  int layers = 0, hidden = 0, heads = 0, seq = 0, vocab = 0;
};

// The engine's GPT: its padded vocabulary (the head GEMM's width), and its maximum sequence
// length unless `seq` > 0.
ModelShape model_shape(const model::GptConfig& c, int seq = 0);

enum class Recompute { kNone, kSelective, kFull };
const char* recompute_name(Recompute r);  // "none", "selective", "full"
Status parse_recompute(const std::string& name, Recompute* out);

struct Layout {
  int tp = 1, pp = 1, dp = 1;
  int micro_batch = 1;   // b, sequences per micro-batch
  int global_batch = 1;  // B, sequences per step: B = b * m * dp
  int zero = 0;          // ZeRO stage 0-3 over the dp group
  bool sp = false;       // sequence parallelism (Korthikanti et al. 2022), needs tp
  Recompute recompute = Recompute::kNone;
  parallel::pp::ScheduleKind schedule = parallel::pp::ScheduleKind::k1F1B;
  int virtual_stages = 1;  // v, chunks per pipeline rank (interleaved only)
  Precision precision = Precision::kBf16;
  // Data-parallel reduction overlapped with the last backward (bucket by bucket, as
  // PyTorch DDP and the engine do); false: all of it after the backward (Megatron's 2021
  // "local" DDP).
  bool dp_overlap = true;
  double dp_bucket_bytes = 25e6;  // PyTorch DDP's default bucket, and the engine's
  // Pipeline sends split over the tp ranks and re-gathered over NVLink (Narayanan et al.
  // 2021 §4.1, "scatter/gather"); sequence parallelism shards the sends anyway.
  bool pp_scatter_gather = true;
  int gpus() const { return tp * pp * dp; }
};

// Activation bytes one transformer layer keeps for its backward, for one micro-batch of b
// sequences with 16-bit activations: Korthikanti et al. 2022, Table 2 (s b h (34 + 5as/h)
// without parallelism; t the tensor-parallel size). Full recompute keeps the layer input,
// 2sbh, sharded over t with sp.
double activation_bytes_per_layer(const ModelShape& m, int micro_batch, int tp, bool sp, Recompute r);

// Parameters (Narayanan et al. 2021): 12 L h^2 (1 + 13/(12h) + (V + s)/(12 L h)).
double parameter_count(const ModelShape& m);
// Model FLOPs per step, no recompute (Korthikanti et al. 2022):
// 72 B L s h^2 (1 + s/(6h) + V/(12 h L)).
double model_flops(const ModelShape& m, double global_batch);
// Narayanan et al. 2021's F, which counts one extra forward (full recompute):
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
  double tflops_per_gpu = 0;  // narayanan_flops() / (step_s GPUs) / 1e12
  double mfu = 0;             // model_flops / (step_s GPUs peak)
  double bubble = 0;          // idle fraction of the pipeline phase, all ranks
  CommTime tp, pp, dp;
  double pipeline_s = 0;   // forward/backward of all micro-batches, with the bubble
  double optimizer_s = 0;  // the optimizer step on this rank's shard
  // One layer, one micro-batch, one GPU: forward, and backward with its recompute.
  LayerCost layer_forward, layer_backward;
  MemoryBreakdown memory;
  double memory_available = 0;  // cluster memory per GPU less its reserved allowance
  bool fits() const { return memory.total() <= memory_available; }
};

// Rejects a layout that cannot run the model: sizes < 1, B not a multiple of b dp, L not a
// multiple of p v, heads or 4h not divisible by tp, sp without tp, interleaving rules of
// pp::simulate, an unknown ZeRO stage. Messages name the field.
Status validate(const ModelShape& m, const Layout& l);

Status predict(const ModelShape& m, const Layout& l, const Cluster& c, Prediction* out);

}  // namespace meshtrain::planner
