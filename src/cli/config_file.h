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
// subcommand and inserts "--key value" for every file key not given as a flag. Every
// error names the file and the key:
//   - the file must parse as TOML 1.0 (toml++; its errors give the line and the column),
//     with every key at the top level;
//   - a key is one of the subcommand's long flags (dashes or underscores), not "config"
//     or "help", set once; unknown keys get "unknown key 'stpes' in run.toml (did you mean
//     'steps'?)";
//   - a flag's value is true or false; an option's values are non-empty strings, numbers
//     (a float as written: "lr = 2e-3" gives 2e-3) or booleans, one unless the option
//     takes several (an array), and each converts to the option's type and passes its
//     checks exactly as the same flag on the command line would ("steps = 'ten'" is an error).
Status expand_config_args(CLI::App& app, std::vector<std::string>* args);

// The parts of expand_config_args, for the fuzz target (tests/fuzz): TOML text to items
// (`path` names it in errors), and the items to "--key value" tokens for subcommand `cmd`,
// skipping keys that args[from..] already give.
Status parse_config_toml(const std::string& text, const std::string& path, std::vector<CLI::ConfigItem>* items);
Status config_tokens(CLI::App* cmd, const std::vector<CLI::ConfigItem>& items, const std::vector<std::string>& args,
                     size_t from, const std::string& path, std::vector<std::string>* tokens);

// The options of `cmd` after parsing as TOML (`key = value`, one per line; options with
// no value omitted; `skip` keys left out): a run folder's config.toml reproduces the run.
// Each value is written so that the reader gives it back exactly (bare, or as a quoted
// string with escapes); one it cannot give back (empty, or not UTF-8) becomes a comment
// naming the key, to pass on the command line instead.
std::string resolved_config_toml(CLI::App* cmd, const std::vector<std::string>& skip);

}  // namespace meshtrain::cli
