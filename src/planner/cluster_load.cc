// The cluster files' loading and `base` names (planner/cluster_file.h); the parser itself is
// cluster_file.cc, which the fuzz targets build without the engine.
#include <filesystem>

#include "planner/cluster_file.h"
#include "core/file_io.h"
#include "planner/local.h"

namespace meshtrain::planner {

Status load_cluster_file(const std::string& path, Cluster* out) {
  if (!std::filesystem::exists(path)) return Status::error("cluster file not found: " + path);
  std::string text;
  RETURN_IF_ERROR(read_file(path, &text));
  return parse_cluster_toml(text, path, out, base_cluster);
}

Status base_cluster(const std::string& name, Cluster* out) {
  if (name != "local") return cluster_preset(name, out);
  *out = measure_local_cluster(1);
  out->name = "local";
  return Status::ok();
}

Status resolve_cluster(const std::string& preset_or_path, Cluster* out) {
  if (std::filesystem::exists(preset_or_path) || preset_or_path.ends_with(".toml"))
    return load_cluster_file(preset_or_path, out);
  return cluster_preset(preset_or_path, out);
}

}  // namespace meshtrain::planner
