// The command line's parsing: the subcommands, the spelling checks that run before CLI11's,
// --config's expansion, then the chosen command.
#include "cli/app.h"

#include <algorithm>
#include <cstdio>
#include <vector>

#include "cli/commands.h"
#include "cli/config_file.h"
#include "cli/in_process.h"
#include "cli/launch.h"
#include "cli/serve_request.h"
#include "comm/group.h"
#include "core/cpu_info.h"

namespace {

// A binary built with -march=native on one machine and copied to another whose CPU lacks
// an extension would die of SIGILL somewhere inside a kernel; say so first, and how to fix it.
meshtrain::Status check_build_matches_cpu() {
  const std::string missing = meshtrain::missing_build_extensions();
  if (missing.empty()) return meshtrain::Status::ok();
  return meshtrain::Status::error(std::string("this meshtrain was built with -march=") + MESHTRAIN_MARCH +
                                  " for a CPU with " + missing + ", which this CPU (" +
                                  meshtrain::cpu_info().model + ") lacks; rebuild it here "
                                  "(scripts/setup.sh) or build with -DMESHTRAIN_MARCH=x86-64-v3");
}

std::string did_you_mean(const std::string& name, const std::vector<std::string>& known) {
  std::vector<std::string_view> views(known.begin(), known.end());
  std::string near = meshtrain::cli::nearest_name(name, views);
  // Two letters swapped ("trian") are two edits, too many for a short word; same letters are near.
  auto letters = [](std::string w) { return std::sort(w.begin(), w.end()), w; };
  for (const std::string& k : known)
    if (near.empty() && letters(k) == letters(name)) near = k;
  return near.empty() ? "" : " (did you mean '" + near + "'?)";
}

// The commands other than `except` (their paths: "bench step") that have `flag`.
void commands_with_flag(CLI::App& cmd, const std::string& path, const CLI::App* except, const std::string& flag,
                        std::vector<std::string>* out) {
  for (CLI::App* sub : cmd.get_subcommands({})) {
    const std::string sub_path = path.empty() ? sub->get_name() : path + " " + sub->get_name();
    if (sub != except && sub->get_option_no_throw(flag) != nullptr) out->push_back(sub_path);
    commands_with_flag(*sub, sub_path, except, flag, out);
  }
}

// "unknown flag --step for meshtrain train (did you mean '--steps'?)", or, for a flag that
// another command has, which ones: "(a flag of meshtrain train, meshtrain bench step)".
meshtrain::Status unknown_flag(CLI::App& app, const CLI::App& cmd, const std::string& path, const std::string& flag) {
  std::vector<std::string> known;
  for (const CLI::Option* o : cmd.get_options())
    for (const std::string& n : o->get_lnames()) known.push_back("--" + n);
  std::string hint = did_you_mean(flag, known);
  std::vector<std::string> others;
  commands_with_flag(app, "", &cmd, flag, &others);
  if (hint.empty() && !others.empty()) {
    hint = " (a flag of";
    for (size_t i = 0; i < others.size() && i < 3; i++) hint += (i ? ", meshtrain " : " meshtrain ") + others[i];
    hint += others.size() > 3 ? ", ...)" : ")";
  }
  return meshtrain::Status::error("unknown flag " + flag + " for " + path + hint + "; see " + path + " --help");
}

// A misspelt subcommand or flag, named with the nearest known one, before CLI11 parses: it
// alone says "A subcommand is required" for `meshtrain trian` and "The following arguments
// were not expected: 10 --step" for `train --step 10`.
meshtrain::Status check_spelling(CLI::App& app, const std::vector<std::string>& args) {
  CLI::App* cmd = &app;
  std::string path = "meshtrain";
  size_t i = 0;
  // The subcommand, and any of its own (bench tokenize).
  for (; i < args.size() && !args[i].starts_with("-"); i++) {
    std::vector<std::string> names;
    CLI::App* found = nullptr;
    for (CLI::App* sub : cmd->get_subcommands({})) {
      names.push_back(sub->get_name());
      if (sub->get_name() == args[i]) found = sub;
    }
    if (names.empty()) break;  // a positional argument of a command without subcommands
    if (!found)
      return meshtrain::Status::error("unknown command '" + args[i] + "' for " + path +
                                      did_you_mean(args[i], names) + "; see " + path + " --help");
    cmd = found, path += " " + args[i];
  }
  for (; i < args.size(); i++) {
    if (!args[i].starts_with("--") || args[i] == "--") continue;
    // --config FILE is expanded into flags for any subcommand (expand_config_args).
    if (args[i] == "--config") {
      i++;
      continue;
    }
    const std::string flag = args[i].substr(0, args[i].find('='));
    const CLI::Option* opt = cmd->get_option_no_throw(flag);
    if (opt == nullptr && cmd != &app) opt = app.get_option_no_throw(flag);
    if (opt == nullptr) return unknown_flag(app, *cmd, path, flag);
    // A flag's value may itself start with "--" (a prompt): it is not a flag.
    if (opt->get_type_size() > 0 && flag.size() == args[i].size() && opt->get_expected_max() == 1) i++;
  }
  return meshtrain::Status::ok();
}

}  // namespace

namespace meshtrain::cli {

int run_command_line(int argc, char** argv) {
  if (auto s = check_build_matches_cpu(); !s.is_ok()) return fail(s);
  CLI::App app{"meshtrain: train GPT-2, Llama and MoE language models on one or many processes, then "
                "evaluate, sample, export and serve them (see README.md)"};
  app.require_subcommand(1);
  std::vector<Command> commands = {
      add_prep_command(app),   add_tokenize_command(app), add_train_command(app),
      add_eval_command(app),   add_generate_command(app), add_export_command(app),
      add_bench_command(app),  add_plot_command(app),     add_timeline_command(app), add_plan_command(app),
      add_serve_command(app)};
  // A host program's process is its own: it is not the launcher's child, and its arguments
  // are not the ones a restart would run again.
  if (in_process() == nullptr) {
    set_original_args(argc, argv);
    if (meshtrain::comm::launched_by_mpi()) end_with_parent();
  }
  std::vector<std::string> args(argv + 1, argv + argc);
  if (auto s = check_spelling(app, args); !s.is_ok()) return fail(s);
  if (auto s = expand_config_args(app, &args); !s.is_ok()) return fail(s);
  std::vector<const char*> expanded = {argv[0]};
  for (const auto& a : args) expanded.push_back(a.c_str());
  try {
    app.parse((int)expanded.size(), expanded.data());
  } catch (const CLI::ParseError& e) {
    // --help and --version print as they do on the command line; a host gets an error's text.
    if (in_process() != nullptr && e.get_exit_code() != 0) return fail(meshtrain::Status::error(e.what()));
    return app.exit(e);
  }
  for (auto& c : commands)
    if (c.app->parsed()) return c.run();
  return 0;
}

}  // namespace meshtrain::cli

