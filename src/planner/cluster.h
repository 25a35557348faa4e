// A cluster as the planner sees it: per-GPU compute, memory and links, and how much of the
// peak a GEMM of a given shape achieves. Presets for DGX-style nodes of A100, H100 and H200,
// and the calibration of the local predictor, are data: the cluster files under
// configs/clusters/presets/, built into the binary (cmake/builtin_clusters.cmake) and read
// by the same parser as a user's cluster file (planner/cluster_file.h reads a file,
// set_cluster_field() below interprets each key, so all share one list of fields).
//
// Every figure of a preset is cited in its file and in docs/planning.md. Efficiency
// parameters are not datasheet figures: they were calibrated once per GPU against published
// runs (docs/planning.md, "Time model").
#pragma once
#include <string>
#include <vector>

#include "core/status.h"
#include "kernels/ops.h"

namespace meshtrain::planner {

// The engine's enum (kernels/ops.h), also the planner's.
using kernels::Precision;
using kernels::parse_precision;
using kernels::precision_name;
// Bytes of one element of activations, gradients and messages in this precision.
inline double element_bytes(Precision p) { return p == Precision::kFp32 ? 4 : 2; }

// A link's measured bus bandwidths (bytes/s) at one message size (bytes): a point of the
// rate curve of a link whose rate depends on the size (a TCP link that small messages cross
// at the wire's rate and large ones at half of it, bench/hosts_comm.sh). 0: not measured
// (the all-reduce's rate at this size).
struct LinkRate {
  double bytes = 0;
  double all_reduce = 0, reduce_scatter = 0, all_gather = 0;
};

// A link as one GPU sees it: bandwidth in bytes/s in one direction, latency (the alpha of an
// alpha-beta model) in seconds per message step.
struct Link {
  double bandwidth = 0;
  double latency = 0;
  // Measured bus bandwidths of reduce-scatter and all-gather where they differ from
  // `bandwidth` (an all-reduce's; 0: the same). The local predictor uses them for the
  // inter-host link, whose TCP transport runs the three collectives at different rates
  // (bench/hosts_comm.sh); the GPU model's ring collectives run all three at `bandwidth`.
  double reduce_scatter_bandwidth = 0, all_gather_bandwidth = 0;
  double reduce_scatter() const { return reduce_scatter_bandwidth > 0 ? reduce_scatter_bandwidth : bandwidth; }
  double all_gather() const { return all_gather_bandwidth > 0 ? all_gather_bandwidth : bandwidth; }
  // Rates by message size, sizes ascending (empty: the fixed rates above at every size).
  // Between two points a rate is interpolated in log(size); outside them it is the nearest
  // point's. Used by the local predictor for the inter-host link.
  std::vector<LinkRate> by_size = {};
  enum class Collective { kAllReduce, kReduceScatter, kAllGather };
  double rate(Collective c, double message_bytes) const;
};

// Achievable fraction of peak for a GEMM (C[M,N] = A[M,K] B[K,N], any transposition) as a
// saturating curve in its smallest dimension d = min(M, N, K):
//   fraction(d) = max_fraction * d / (d + half_dim)
// Small dimensions (attention's head size, thin tensor-parallel slices) starve the tensor
// cores of reuse; large square-ish GEMMs approach max_fraction.
struct GemmEfficiency {
  double max_fraction = 0.78;
  double half_dim = 64;
  double at(double m, double n, double k) const;
};

// The local predictor's calibration (planner/local.h): what the engine's CPU kernels and the
// MPI shared-memory transport cost on the machine it was measured on, one thread per rank.
// The figures are configs/clusters/presets/local.toml's [calibration] table, where each is
// explained; a cluster file with `base = "local"` may override any of them. SI units:
// seconds, bytes per second. Zero on the GPU presets, which do not use them.
struct CpuCalibration {
  double memory_bandwidth = 0;  // bytes read + written per second by one thread
  // Arithmetic-bound kernels, seconds per element on one thread.
  double gelu_forward_s = 0, gelu_backward_s = 0;
  double cross_entropy_forward_s = 0, cross_entropy_backward_s = 0;  // per logit
  double sum_of_squares_s = 0;
  double onebit_compress_s = 0, onebit_decompress_s = 0;
  double int8_quantize_s = 0, int8_dequantize_s = 0;
  // The fused attention: per score element forward and backward, and per block backward.
  double attention_forward_element_s = 0, attention_backward_element_s = 0, attention_backward_block_s = 0;
  // The shared-memory transport's bus bandwidths, bytes/s, for data just computed (cached:
  // tp and pp messages) and for buffers last touched a pass ago (cold: dp and ZeRO).
  struct BusBandwidth {
    double all_reduce = 0, reduce_scatter = 0, all_gather = 0;
  };
  BusBandwidth cached, cold;
};

struct Cluster {
  std::string name;
  double peak_flops_16 = 0;  // dense bf16/fp16 tensor-core FLOP/s per GPU
  double peak_flops_32 = 0;  // fp32 FLOP/s per GPU (no TF32)
  double memory_bytes = 0;   // HBM per GPU
  double hbm_bandwidth = 0;  // bytes/s per GPU
  int gpus_per_node = 8;
  // NICs per node, each with `inter`'s bandwidth (DGX: one per GPU); the groups that cross
  // nodes share them (planner/placement.h). 0: one per GPU.
  int nics_per_node = 0;
  int nodes = 0;  // nodes (hosts) in the cluster; 0: as many as a layout needs
  Link intra;  // inside a node (NVLink), per GPU, one direction
  Link inter;  // between nodes (InfiniBand), per NIC, one direction
  // Calibrated efficiencies (fractions of the nominal figures above).
  GemmEfficiency gemm;
  double hbm_efficiency = 0.6;   // memory-bound kernels (norms, softmax, dropout, optimizer)
  double link_efficiency = 0.7;  // ring collectives and p2p on either link
  // Memory a GPU cannot give to the model: CUDA context, library workspaces, allocator
  // fragmentation (an allowance, docs/planning.md).
  double reserved_bytes = 0;
  // A CPU machine (the "local" cluster, planner/local.h): the cores every rank on it shares;
  // ranks whose threads outnumber them time-share the cores. 0: each GPU is its own device.
  // Not a cluster-file key.
  int cores = 0;
  // A CPU machine's cross-entropy kernels as measured now (planner::measure_local_cluster),
  // seconds per logit at the rank's threads; 0: the local predictor's built-in calibration.
  // Not cluster-file keys.
  double cross_entropy_forward_s = 0, cross_entropy_backward_s = 0;
  // The local predictor's calibration: file keys in a [calibration] table.
  CpuCalibration cpu;

  double peak_flops(Precision p) const { return p == Precision::kFp32 ? peak_flops_32 : peak_flops_16; }
};

// Presets: "a100-80g", "h100-80g", "h200" (configs/clusters/presets/<name>.toml). An unknown
// name gets an error listing them.
Status cluster_preset(const std::string& name, Cluster* out);
std::vector<std::string> cluster_preset_names();

// The files of configs/clusters/presets/, built in: each name (the file's stem) and text.
// The presets, and "local" (the local predictor's calibration, planner/local.h).
struct BuiltinClusterFile {
  const char* name;
  const char* text;
};
const std::vector<BuiltinClusterFile>& builtin_cluster_files();
// The text of one of them; an error names the known ones.
Status builtin_cluster_text(const std::string& name, std::string* text);

// The fields a cluster file may set, with the units the file uses (TFLOP/s, GB, GB/s, us;
// decimal units): what `meshtrain plan --cluster` documents and the loader accepts.
struct ClusterField {
  const char* key;   // e.g. "peak_tflops_bf16"
  const char* unit;  // e.g. "TFLOP/s"
  const char* help;
  bool optional = false;  // may be left out of a file without a base; 0 means "not given"
};
const std::vector<ClusterField>& cluster_fields();

// Sets one field from its file key and textual value ("312", "2.0e3"); `where` names the
// source for messages ("a100.toml"). Errors name the key: an unknown key (with the nearest
// known one), a value that is not a number, or one out of its range.
Status set_cluster_field(const std::string& key, const std::string& value, const std::string& where, Cluster* c);

// Rejects a cluster the time model cannot use, naming the field by its file key.
Status validate(const Cluster& c);

}  // namespace meshtrain::planner
