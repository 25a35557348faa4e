// `--config FILE.toml` for any subcommand: the file's keys are the subcommand's long flag
// names (dashes or underscores), and flags given on the command line win over the file.
// The file is expanded into ordinary flags before CLI11 parses, so types, ranges and
// help are exactly those of the flags.
#pragma once
#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "core/status.h"

namespace meshtrain::cli {

// Documents --config on `cmd` (the value itself is consumed by expand_config_args).
void add_config_option(CLI::App* cmd);

// Rewrites args (argv without the program name): removes "--config FILE" after the
// subcommand and inserts "--key value" for every file key not given as a flag. Unknown
// keys get "unknown key 'stpes' in run.toml (did you mean 'steps'?)".
Status expand_config_args(CLI::App& app, std::vector<std::string>* args);

// The options of `cmd` after parsing as TOML (`key = value`, one per line; options with
// no value omitted; `skip` keys left out): a run folder's config.toml reproduces the run.
std::string resolved_config_toml(CLI::App* cmd, const std::vector<std::string>& skip);

}  // namespace meshtrain::cli
