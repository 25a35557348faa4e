// The "local" cluster: this machine as the planner sees it, one "GPU" per engine rank, and
// a predictor that models the engine itself (not Megatron on GPUs) so that the planner's
// predictions can be checked against real runs here (tests/unit/test_planner_local.cc).
//
// What differs from the GPU time model (planner/time_model.h):
//   - kernels: the engine's own (src/kernels/cpu): oneDNN sgemm for every linear layer, a
//     fused blockwise attention (no s^2 tensor is stored; its small per-head GEMMs, softmax
//     and per-block overheads are calibrated here), fp32 activations, LayerNorm, GELU and
//     the cross-entropy as measured per element;
//   - memory: the engine's own accounting, not a formula: model states by
//     planner::model_state_bytes over the rank's real parallel::ShardLayout, activations by
//     model::activation_inventory times the sets the schedule keeps alive, and the
//     communication, gathered and workspace buffers replayed call by call the way
//     parallel::DataParallel, parallel::pp::PipelineExecutor and the kernels allocate them
//     (their pools included), giving the tracker's peak of the sum (metrics.jsonl's
//     mem.total);
//   - time: per-layer GEMM FLOPs over the measured peak times the efficiency curve,
//     elementwise work per element or over memory bandwidth, MPI collectives over shared
//     memory by alpha-beta with measured bandwidths, the pipeline by pp::simulate (the
//     engine's schedule generator); communication is CPU work here (the MPI shared-memory
//     transport copies and reduces on the ranks' cores), so it adds to the step rather than
//     hiding behind compute; ranks whose threads outnumber the cores time-share them.
// The memory replay is planner/local_memory.h. Calibration and validation: docs/planning.md,
// "Local runs (this machine)".
#pragma once
#include <vector>

#include "core/status.h"
#include "model/config.h"
#include "planner/cluster.h"
#include "planner/time_model.h"

namespace meshtrain::planner {

// Query rows per block of the fused attention kernel (kBlock of kernels/cpu/attention.cc):
// the time model counts its blocks, the memory replay its per-thread score buffers.
inline constexpr int kAttentionBlock = 64;

// This machine as a Cluster: cores = the hardware threads, one rank = one "GPU" of
// `threads_per_rank` OpenMP threads. Peaks are per rank at that thread count, in GFLOP/s;
// 0 takes the engine's measured peak (train::cached_gemm_peak_gflops: a 2048^3 GEMM,
// measured once per precision and thread count and cached). Every other figure was measured
// once on this machine (local.cc, docs/planning.md).
Cluster local_cluster(int threads_per_rank = 1, double peak_gflops_fp32 = 0, double peak_gflops_bf16 = 0);

// local_cluster() with the figures that drift with the machine's load measured now (about
// one second): the fp32 GEMM peak (train::measure_gemm_peak_gflops), the GEMM efficiency of
// the engine's layer shapes from cold caches, and memory bandwidth. A virtual machine's
// speed can drift by a quarter within an hour (other tenants); predictions meant to be
// compared with a run made now should use this.
Cluster measure_local_cluster(int threads_per_rank = 1);

// Run settings the Layout does not carry.
struct LocalRun {
  int threads = 1;                // OpenMP threads per rank (--threads)
  int seq = 0;                    // tokens per sequence (--seq-len); 0: the config's max_seq_len
  std::vector<int> stage_layers;  // --stage-layers; empty: the engine's own split
};

// One rank's peak bytes by the engine's tracker categories (core/memory.h), as
// metrics.jsonl reports them: each category's own peak, and the peak of their sum.
struct EngineMemory {
  double params = 0, grads = 0, optim = 0, activations = 0, workspace = 0, comm = 0, gathered = 0;
  double total = 0;
};

// Step time and memory of the engine running `config` in `layout` on the local cluster `c`
// (local_cluster()). out->memory is the most loaded rank's at its peak: params, grads,
// optim and activations as allocated, buffers = the workspace, communication and gathered
// bytes alive at that moment, so out->memory.total() is the tracker's mem.total. `ranks`
// (optional) gets every pipeline rank's memory, in pp order (tensor- and data-parallel peers
// of a stage hold the same). Supports the engine's fp32 runs (layout.precision = kFp32);
// 16-bit storage is not modelled yet (an error says so). Rejects layouts the engine rejects
// (ZeRO-2/3 with pp > 1, shapes tp does not divide, ...), naming the field.
Status predict_local(const model::GptConfig& config, const Layout& layout, const LocalRun& run, const Cluster& c,
                     Prediction* out, std::vector<EngineMemory>* ranks = nullptr);

}  // namespace meshtrain::planner
