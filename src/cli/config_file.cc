#include "cli/config_file.h"

#include <algorithm>
#include <filesystem>
#include <sstream>

namespace meshtrain::cli {

namespace {

std::string normalise(std::string key) {
  std::replace(key.begin(), key.end(), '_', '-');
  return key;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); j++) row[j] = j;
  for (size_t i = 1; i <= a.size(); i++) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); j++) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] != b[j - 1])});
      diag = up;
    }
  }
  return row[b.size()];
}

std::vector<std::string> flag_names(CLI::App* cmd) {
  std::vector<std::string> names;
  for (const CLI::Option* opt : cmd->get_options())
    for (const auto& n : opt->get_lnames()) names.push_back(n);
  return names;
}

}  // namespace

void add_config_option(CLI::App* cmd) {
  cmd->set_config("--config", "", "TOML file whose keys are this command's flags (flags win)");
  // Unknown keys are reported by check_config_keys() with a suggestion.
  cmd->allow_config_extras(CLI::config_extras_mode::ignore);
}

Status check_config_keys(CLI::App* cmd, const std::string& path) {
  if (!std::filesystem::exists(path)) return Status::error("config file not found: " + path);
  std::vector<CLI::ConfigItem> items;
  try {
    items = CLI::ConfigTOML().from_file(path);
  } catch (const std::exception& e) {
    return Status::error("cannot parse " + path + ": " + e.what());
  }
  const auto names = flag_names(cmd);
  for (const auto& item : items) {
    if (item.name == "++" || item.name == "--") continue;  // section markers
    const std::string key = normalise(item.name);
    if (!item.parents.empty())
      return Status::error("config " + path + ": sections are not used; put '" + item.name +
                           "' at the top level");
    if (std::find(names.begin(), names.end(), key) != names.end()) continue;
    // Suggest the nearest flag when it is close enough to be a typo.
    std::string best;
    size_t best_d = std::max<size_t>(2, key.size() / 3) + 1;
    for (const auto& n : names)
      if (size_t d = edit_distance(key, n); d < best_d) best = n, best_d = d;
    return Status::error("unknown key '" + item.name + "' in " + path +
                         (best.empty() ? "" : " (did you mean '" + best + "'?)"));
  }
  return Status::ok();
}

std::string resolved_config_toml(CLI::App* cmd, const std::vector<std::string>& skip) {
  std::istringstream in(cmd->config_to_str(true, false));
  std::string line, out = "# Resolved options of this run: meshtrain train --config config.toml\n";
  while (std::getline(in, line)) {
    std::string key = line.substr(0, line.find('='));
    key.erase(key.find_last_not_of(' ') + 1);
    if (std::find(skip.begin(), skip.end(), key) != skip.end()) continue;
    out += line + "\n";
  }
  return out;
}

}  // namespace meshtrain::cli
