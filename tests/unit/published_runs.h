// The published runs the planner is held to (../shared/reference/published-numbers.md):
// Narayanan et al. 2021 (arXiv 2104.04473) Table 1 and Korthikanti et al. 2022 (arXiv
// 2205.05198) Tables 3 and 5, with the layouts they ran. Shared by the time-model and the
// layout-search tests.
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
  return l;
}

}  // namespace meshtrain::planner
