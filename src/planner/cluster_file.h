// Cluster descriptions for the planner: a preset name or a TOML file (read with toml++).
// The file's top-level keys are cluster_fields() (units as listed there: TFLOP/s,
// GB, GB/s, us); `base = "a100-80g"` starts from a preset, `base = "local"` from this
// machine as the local predictor sees it (planner/local.h); without a base every field that
// is not optional must be given. Hosts and links may also be written as tables:
//
//   # my-cluster.toml
//   name = "a100-40g-ib100"
//   base = "a100-80g"
//   memory_gb = 40
//   [hosts]
//   count = 16              # nodes
//   ranks_per_host = 8      # gpus_per_node
//   nics_per_host = 8       # nics_per_node
//   [links.intra_host]
//   bandwidth_gbs = 300     # intra_node_gbps
//   latency_us = 2          # intra_node_latency_us
//   [links.inter_host]      # per NIC
//   bandwidth_gbs = 12.5    # inter_node_gbps (an all-reduce's bus bandwidth)
//   latency_us = 5          # inter_node_latency_us
//   reduce_scatter_gbs = 12 # inter_node_reduce_scatter_gbps, where it differs
//   all_gather_gbs = 12     # inter_node_all_gather_gbps, where it differs
//   [[links.inter_host.by_size]]  # optional, repeated: rates by message size (ascending),
//   bytes = 262144                # interpolated in log(size) by the local predictor
//   all_reduce_gbs = 0.109
//   reduce_scatter_gbs = 0.076    # optional (absent: all_reduce_gbs)
//   all_gather_gbs = 0.074        # optional
//
// A field set twice (also once flat and once in a table) is an error.
#pragma once
#include <functional>
#include <string>

#include "core/status.h"
#include "planner/cluster.h"

namespace meshtrain::planner {

// Reads a cluster file. Errors name the file and the bad key: TOML that does not parse (with
// its line and column), unknown tables or table keys, keys set twice or with other than one
// number or string, an unknown `base` preset, unknown
// keys (with the nearest known one), values that are not finite numbers (or whole numbers
// for integer fields), out-of-range values (negative or zero bandwidths, fractions above 1,
// reserved memory not below the memory), missing fields when there is no base.
Status load_cluster_file(const std::string& path, Cluster* out);
// A `base` name to the cluster it starts from.
using BaseLookup = std::function<Status(const std::string& name, Cluster* out)>;
// The presets, and "local": this machine (measure_local_cluster, one thread per
// rank: its GEMM peak and efficiency, memory bandwidth and cross-entropy measured now, in
// about a second).
Status base_cluster(const std::string& name, Cluster* out);
// The same for the file's text; `path` names it in messages and gives the default name.
// `lookup` resolves `base` (empty: the presets only, not "local").
Status parse_cluster_toml(const std::string& text, const std::string& path, Cluster* out,
                          const BaseLookup& lookup = {});

// Sets the fields `text` names over *c (a file without `base`: the local predictor's
// calibration over the measured machine, planner/local.h). Each value is checked; the
// whole is not (the caller derives fields from it first, then validates).
Status apply_cluster_toml(const std::string& text, const std::string& path, Cluster* c);

// A preset name (cluster_preset_names()) or, when it names an existing file (or
// ends in .toml), a cluster file.
Status resolve_cluster(const std::string& preset_or_path, Cluster* out);

}  // namespace meshtrain::planner
