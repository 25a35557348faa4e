// The published runs the planner is held to: on A100 (../shared/reference/published-numbers.md)
// Narayanan et al. 2021 (arXiv 2104.04473) Table 1 and Korthikanti et al. 2022 (arXiv
// 2205.05198) Tables 3 and 5; on H100 NVIDIA's and Meta's BF16 runs (below), with the
// layouts they ran. Shared by the time-model and the layout-search tests.
#pragma once
#include <vector>

#include "planner/time_model.h"

namespace meshtrain::planner {

using parallel::pp::ScheduleKind;

// Narayanan et al. 2021, Table 1 (V = 51200, s = 2048). Their layouts come from the table
// (t, p, GPUs, batch); what the table does not print is taken from the authors' script that
// reproduces it (NVIDIA/Megatron-LM examples/sc21/run_table_1.sh): micro-batch size, layers
// per virtual stage (interleaved schedule where it sets one, 1F1B otherwise), full
// activation recompute in every row, and the DDP used: PyTorch DDP (overlapped reduction)
// for the tp-only rows, Megatron's "local" DDP (reduction after the backward) for the rest.
struct NarayananRow {
  const char* name;
  int heads, hidden, layers, t, p, gpus, batch, micro_batch, v;
  bool overlapped_dp;
  double tflops;  // published, per GPU
};
inline const std::vector<NarayananRow>& narayanan_rows() {
  static const std::vector<NarayananRow> rows = {
      {"1.7B", 24, 2304, 24, 1, 1, 32, 512, 16, 1, true, 137},
      {"3.6B", 32, 3072, 30, 2, 1, 64, 512, 16, 1, true, 138},
      {"7.5B", 32, 4096, 36, 4, 1, 128, 512, 16, 1, true, 142},
      {"18.4B", 48, 6144, 40, 8, 1, 256, 1024, 8, 1, true, 135},
      {"39.1B", 64, 8192, 48, 8, 2, 512, 1536, 4, 1, false, 138},
      {"76.1B", 80, 10240, 60, 8, 4, 1024, 1792, 2, 3, false, 140},      // 5 layers per virtual stage
      {"145.6B", 96, 12288, 80, 8, 8, 1536, 2304, 2, 2, false, 148},     // 5
      {"310.1B", 128, 16384, 96, 8, 16, 1920, 2160, 1, 2, false, 155},   // 3
      {"529.6B", 128, 20480, 105, 8, 35, 2520, 2520, 1, 3, false, 163},  // 1
      {"1008.0B", 160, 25600, 128, 8, 64, 3072, 3072, 1, 1, false, 163},
  };
  return rows;
}

// The papers' runs split the layers evenly over the stages and ran Megatron's unfused
// attention kernels.
inline void as_published(int layers, Layout* l) {
  l->attention = Attention::kUnfused;
  const int stages = l->pp * l->virtual_stages;
  if (l->pp > 1) l->stage_layers.assign(stages, layers / stages);  // (one stage: no split to give)
}

inline Layout narayanan_layout(const NarayananRow& r) {
  Layout l;
  l.tp = r.t, l.pp = r.p, l.dp = r.gpus / (r.t * r.p);
  l.micro_batch = r.micro_batch, l.global_batch = r.batch;
  l.recompute = Recompute::kFull;
  l.schedule = r.v > 1 ? ScheduleKind::kInterleaved : ScheduleKind::k1F1B;
  l.virtual_stages = r.v;
  l.precision = Precision::kFp16;
  l.dp_overlap = r.overlapped_dp;
  l.pp_scatter_gather = true;  // "with the scatter/gather optimization enabled" (§5.1)
  as_published(r.layers, &l);
  return l;
}

// Korthikanti et al. 2022, Tables 3 and 5 (s = 2048, V = 51200, no data parallelism):
// iteration seconds with full recompute (no sp) and with sp + selective recompute. 175B and
// 530B use the interleaved schedule with 3 chunks per rank (Table 3's note).
struct KorthikantiRow {
  const char* name;
  int heads, hidden, layers, t, p, batch, micro_batch, v;
  double full_s, selective_sp_s;
};
inline const std::vector<KorthikantiRow>& korthikanti_rows() {
  static const std::vector<KorthikantiRow> rows = {
      {"22B", 64, 6144, 48, 8, 1, 4, 4, 1, 1.42, 1.10},
      {"175B", 96, 12288, 96, 8, 8, 64, 1, 3, 18.13, 13.75},
      {"530B", 128, 20480, 105, 8, 35, 280, 1, 3, 49.05, 37.83},
      {"1T", 160, 25600, 128, 8, 64, 512, 1, 1, 94.42, 71.49},
  };
  return rows;
}

inline Layout korthikanti_layout(const KorthikantiRow& r, bool selective_sp) {
  Layout l;
  l.tp = r.t, l.pp = r.p, l.dp = 1;
  l.micro_batch = r.micro_batch, l.global_batch = r.batch;
  l.sp = selective_sp;
  l.recompute = selective_sp ? Recompute::kSelective : Recompute::kFull;
  l.schedule = r.v > 1 ? ScheduleKind::kInterleaved : ScheduleKind::k1F1B;
  l.virtual_stages = r.v;
  l.precision = Precision::kBf16;
  as_published(r.layers, &l);
  return l;
}

// Published BF16 runs on DGX-class H100 80GB nodes (8 GPUs, NVLink 4, 8 x 400 Gb/s), which
// calibrate and validate the h100-80g preset (docs/planning.md, "H100"):
//  - NVIDIA DGX Cloud Benchmarking (github.com/NVIDIA/dgxc-benchmarking; NeMo on DGX H100
//    "EOS"): GPT-3 175B (tag v25.04.02, nemo_megatron/README_175b.md: TP4 PP8 VP6 per its
//    shipped config, MBS1 GBS256, s 2048: 63099 tokens/s on 128 GPUs), Nemotron-4 15B
//    (v25.04.02, nemotron/README.md: TP2 DP8 MBS2 GBS64, s 4096: 98550 tokens/s on 16) and
//    Nemotron-4 340B (v25.05.05, nemotron/README.md: TP8 PP8 VP12 DP4 MBS1 GBS64, s 4096:
//    56913 tokens/s on 256). Its Llama 3.1 runs use context parallelism (NeMo 24.09, tag
//    v24.11.1's llama3.1/README_70b.md and README_405b.md, s 8192, MBS 1, cp with NeMo's
//    default p2p ring): 70B at TP4 PP4 CP2 VP5 on 64 GPUs, GBS 128: 71235 tokens/s; 405B at
//    TP8 PP9 CP2 VP7 on 576 GPUs, GBS 252: 120022, and on 2304, GBS 1008: 468646.
//  - Llama 3 405B (Dubey et al. 2024, arXiv 2407.21783, Table 4): TP8 PP16 with DP 64 and 128
//    at s 8192 and 16M tokens per batch, 430 and 400 model TFLOP/s per GPU; TP8 CP16 PP16 DP8
//    at s 131072 (16M tokens: 128 sequences), 380. The paper gives neither the micro-batch
//    nor the chunks per rank: micro-batch 1 and two chunks (its interleaved schedule; with
//    one the 16,384-GPU runs' 16 micro-batches would leave half the pipeline idle) are
//    assumptions, as is ZeRO-1 for its FSDP. It drops one layer from the first and the last
//    stage (§3.3.2): 3, thirty of 4, 3 over 32 stages. It trains without activation
//    checkpointing and frees what later work does not read (§3.3.2): the planner's
//    element-wise recompute (Layout::elementwise_recompute), without which these layouts
//    need 82 GB (docs/planning.md, "Long context"). Its context parallelism all-gathers
//    K and V (§3.3.2): --cp-comm all-gather.
// Every run: sequence parallelism with tp, the distributed optimizer (ZeRO-1), fused
// attention, no recompute. Nemotron-4 (Parmar et al. 2024; Nemotron-4 340B report): GQA with
// 8 KV heads, RoPE, a 4h squared-ReLU MLP (two matrices, counted as GELU's), no biases, an
// untied 256k head, no dropout.
struct H100Run {
  const char* name;
  ModelShape model;
  Layout layout;
  double tokens_per_s;    // published, all GPUs together (0: the TFLOP/s figure is published)
  double tflops_per_gpu;  // published model TFLOP/s per GPU (model_flops over the step)
  bool meta = false;      // Llama 3's own runs: held to 10% and to fit in 80 GB
};

inline ModelShape nemotron4(int layers, int hidden, int heads) {
  ModelShape m{layers, hidden, heads, 4096, 256000};
  m.kv_heads = 8, m.rope = true, m.bias = false, m.tied_head = false, m.dropout = false;
  return m;
}

inline Layout h100_layout(int tp, int pp, int dp, int micro_batch, int global_batch, int v) {
  Layout l;
  l.tp = tp, l.pp = pp, l.dp = dp, l.micro_batch = micro_batch, l.global_batch = global_batch;
  l.virtual_stages = v, l.schedule = v > 1 ? ScheduleKind::kInterleaved : ScheduleKind::k1F1B;
  l.sp = tp > 1, l.zero = 1, l.precision = Precision::kBf16, l.attention = Attention::kFused;
  return l;
}

inline const std::vector<H100Run>& h100_runs() {
  static const std::vector<H100Run> runs = [] {
    ModelShape gpt3{96, 12288, 96, 2048, 51200};
    ModelShape llama3_405b{126, 16384, 128, 8192, 128256};
    llama3_405b.kv_heads = 8, llama3_405b.ffn = 53248, llama3_405b.swiglu = true, llama3_405b.rms_norm = true;
    llama3_405b.rope = true, llama3_405b.bias = false, llama3_405b.tied_head = false, llama3_405b.dropout = false;
    std::vector<int> meta_split(32, 4);
    meta_split.front() = meta_split.back() = 3;
    Layout gpt3_layout = h100_layout(4, 8, 4, 1, 256, 6);
    gpt3_layout.stage_layers.assign(48, 2);
    Layout meta_8k = h100_layout(8, 16, 64, 1, 2048, 2), meta_16k = h100_layout(8, 16, 128, 1, 2048, 2);
    Layout meta_128k = h100_layout(8, 16, 8, 1, 128, 2);
    meta_128k.cp = 16, meta_128k.cp_comm = model::CpComm::kAllGather;
    for (Layout* l : {&meta_8k, &meta_16k, &meta_128k}) l->stage_layers = meta_split, l->elementwise_recompute = true;
    ModelShape llama3_405b_128k = llama3_405b;
    llama3_405b_128k.seq = 131072;
    ModelShape llama3_70b{80, 8192, 64, 8192, 128256};
    llama3_70b.kv_heads = 8, llama3_70b.ffn = 28672, llama3_70b.swiglu = true, llama3_70b.rms_norm = true;
    llama3_70b.rope = true, llama3_70b.bias = false, llama3_70b.tied_head = false, llama3_70b.dropout = false;
    auto nemo_cp = [](int tp, int pp, int dp, int gbs, int v, int layers) {
      Layout l = h100_layout(tp, pp, dp, 1, gbs, v);
      l.cp = 2;
      l.stage_layers.assign(pp * v, layers / (pp * v));
      return l;
    };
    return std::vector<H100Run>{
        {"gpt3-175b, 128 GPUs (DGXC)", gpt3, gpt3_layout, 63099, 0},
        {"nemotron4-15b, 16 GPUs (DGXC)", nemotron4(32, 6144, 48), h100_layout(2, 1, 8, 2, 64, 1), 98550, 0},
        {"nemotron4-340b, 256 GPUs (DGXC)", nemotron4(96, 18432, 96), h100_layout(8, 8, 4, 1, 64, 12), 56913, 0},
        {"llama3.1-70b, 64 GPUs, cp 2 (DGXC)", llama3_70b, nemo_cp(4, 4, 2, 128, 5, 80), 71235, 0},
        {"llama3.1-405b, 576 GPUs, cp 2 (DGXC)", llama3_405b, nemo_cp(8, 9, 4, 252, 7, 126), 120022, 0},
        {"llama3.1-405b, 2304 GPUs, cp 2 (DGXC)", llama3_405b, nemo_cp(8, 9, 16, 1008, 7, 126), 468646, 0},
        {"llama3-405b, 8192 GPUs (Meta)", llama3_405b, meta_8k, 0, 430, true},
        {"llama3-405b, 16384 GPUs (Meta)", llama3_405b, meta_16k, 0, 400, true},
        {"llama3-405b, 16384 GPUs, cp 16 at 131072 (Meta)", llama3_405b_128k, meta_128k, 0, 380, true},
    };
  }();
  return runs;
}

// Published BF16 MoE runs on DGX H100 (the h100-80g preset): NVIDIA DGX Cloud Benchmarking
// (github.com/NVIDIA/dgxc-benchmarking, tag v24.11.1, grok1/README_314b.md with the layouts
// of grok1/configure.sh and grok1/grok1_314b.yaml; NeMo 24.09, Megatron-Core). Grok-1's
// blocks (hidden 6144, 48 heads of 128 with full multi-head attention, 8 GeGLU experts of
// 32768, top-2, RMSNorm, RoPE, no biases, an untied head; the Llama 3 tokenizer, 128256
// rows, as a proxy vocabulary) cut to 2 or 4 layers at s 4096, GBS 1024, MBS 1, tp 4 with
// sp and tp-comm overlap, no recompute, synthetic data. The capacity factor is 1.0 with the
// expert inputs padded to capacity, so every expert computes its mean share: imbalance 1.
// Their runs at 8 nodes and up use context parallelism, which the planner does not model,
// and are not used.
struct MoeRun {
  const char* name;
  ModelShape model;
  Layout layout;
  double tokens_per_s;  // published, all GPUs together
};

inline ModelShape grok1(int layers) {
  ModelShape m{layers, 6144, 48, 4096, 128256};
  m.ffn = 32768, m.swiglu = true, m.rms_norm = true, m.rope = true, m.bias = false;
  m.tied_head = false, m.dropout = false, m.experts = 8, m.top_k = 2;
  return m;
}

inline const std::vector<MoeRun>& moe_runs() {
  static const std::vector<MoeRun> runs = [] {
    auto layout = [](int dp, int ep) {
      Layout l = h100_layout(4, 1, dp, 1, 1024, 1);
      l.ep = ep;
      return l;
    };
    // Step seconds 24.03, 21.52 and 10.64: 4096 x 1024 tokens over each.
    return std::vector<MoeRun>{
        {"grok1 2 layers, 8 GPUs, ep 2 (DGXC)", grok1(2), layout(2, 2), 174544},
        {"grok1 4 layers, 16 GPUs, ep 4 (DGXC)", grok1(4), layout(4, 4), 194903},
        {"grok1 4 layers, 32 GPUs, ep 8 (DGXC)", grok1(4), layout(8, 8), 394202},
    };
  }();
  return runs;
}

}  // namespace meshtrain::planner
