// Cluster descriptions for the planner: a preset name or a TOML file. The file's keys are
// planner::cluster_fields() (units as listed there: TFLOP/s, GB, GB/s, us), at the top
// level; `base = "a100-80g"` starts from a preset (default: every field must be given).
//
//   # my-cluster.toml
//   name = "a100-40g-ib100"
//   base = "a100-80g"
//   memory_gb = 40
//   inter_node_gbps = 12.5
#pragma once
#include <string>

#include "core/status.h"
#include "planner/cluster.h"

namespace meshtrain::cli {

// Reads a cluster file. Errors name the file and the bad key: TOML that does not parse,
// sections, keys set twice or with other than one value, an unknown `base` preset, unknown
// keys (with the nearest known one), values that are not finite numbers (or whole numbers
// for integer fields), out-of-range values (negative or zero bandwidths, fractions above 1,
// reserved memory not below the memory), missing fields when there is no base.
Status load_cluster_file(const std::string& path, planner::Cluster* out);
// The same for the file's text; `path` names it in messages and gives the default name.
Status parse_cluster_toml(const std::string& text, const std::string& path, planner::Cluster* out);

// A preset name (planner::cluster_preset_names()) or, when it names an existing file (or
// ends in .toml), a cluster file.
Status resolve_cluster(const std::string& preset_or_path, planner::Cluster* out);

}  // namespace meshtrain::cli
