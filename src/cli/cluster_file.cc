#include "cli/cluster_file.h"

#include <CLI/CLI.hpp>
#include <filesystem>
#include <set>
#include <sstream>
#include <vector>

#include "core/file_io.h"

namespace meshtrain::cli {

namespace {

// CLI11 2.1 strips a TOML string's quotes; older versions kept them, which this removes.
std::string unquote(std::string v) {
  if (v.size() >= 2 && (v.front() == '"' || v.front() == '\'') && v.back() == v.front()) v = v.substr(1, v.size() - 2);
  return v;
}

}  // namespace

Status load_cluster_file(const std::string& path, planner::Cluster* out) {
  if (!std::filesystem::exists(path)) return Status::error("cluster file not found: " + path);
  std::string text;
  RETURN_IF_ERROR(read_file(path, &text));
  return parse_cluster_toml(text, path, out);
}

Status parse_cluster_toml(const std::string& text, const std::string& path, planner::Cluster* out) {
  std::vector<CLI::ConfigItem> items;
  try {
    std::istringstream in(text);
    items = CLI::ConfigTOML().from_config(in);
  } catch (const std::exception& e) {
    return Status::error("cannot parse cluster file " + path + ": " + e.what());
  }
  // The base preset first, whatever its position in the file.
  planner::Cluster c;
  bool based = false;
  std::set<std::string> seen;
  for (const auto& item : items) {
    if (item.name == "++" || item.name == "--") continue;  // section markers
    if (!item.parents.empty())
      return Status::error("cluster file " + path + ": sections are not used; put '" + item.name +
                           "' at the top level");
    if (!seen.insert(item.name).second) return Status::error("key '" + item.name + "' is set twice in " + path);
    if (item.inputs.size() != 1 || item.inputs[0].empty())
      return Status::error("key '" + item.name + "' in " + path + " takes one value");
    if (item.name == "base") {
      RETURN_IF_ERROR(planner::cluster_preset(unquote(item.inputs[0]), &c).with_context(path + ": 'base'"));
      based = true;
    }
  }
  if (!based) c.name = std::filesystem::path(path).stem().string();
  for (const auto& item : items) {
    if (item.name == "++" || item.name == "--" || item.name == "base") continue;
    RETURN_IF_ERROR(planner::set_cluster_field(item.name, unquote(item.inputs[0]), path, &c));
  }
  if (!based) {
    std::string missing;
    for (const planner::ClusterField& f : planner::cluster_fields())
      if (!seen.count(f.key)) missing += (missing.empty() ? "" : ", ") + std::string(f.key);
    if (!missing.empty()) return Status::error("cluster file " + path + " has no 'base' preset and lacks: " + missing);
  }
  RETURN_IF_ERROR(planner::validate(c).with_context(path));
  *out = c;
  return Status::ok();
}

Status resolve_cluster(const std::string& preset_or_path, planner::Cluster* out) {
  if (std::filesystem::exists(preset_or_path) || preset_or_path.ends_with(".toml"))
    return load_cluster_file(preset_or_path, out);
  return planner::cluster_preset(preset_or_path, out);
}

}  // namespace meshtrain::cli
