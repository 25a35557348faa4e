// `--config FILE.toml` for a subcommand: the file's keys are the subcommand's long flag
// names (dashes or underscores), flags given on the command line override the file.
#pragma once
#include <CLI/CLI.hpp>
#include <string>

#include "core/status.h"

namespace meshtrain::cli {

// Adds --config to `cmd`; call check_config_keys() before acting on the options.
void add_config_option(CLI::App* cmd);

// Checks every key of the TOML file against cmd's flags before CLI11 reads it, so that a
// typo gets "unknown key 'lr_min' in run.toml (did you mean 'min-lr'?)".
Status check_config_keys(CLI::App* cmd, const std::string& path);

// The resolved options of `cmd` as TOML (every flag with its value), minus the keys in
// `skip`: a run folder's config.toml reproduces the run with --config.
std::string resolved_config_toml(CLI::App* cmd, const std::vector<std::string>& skip);

}  // namespace meshtrain::cli
