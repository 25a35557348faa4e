// meshtrain command line: one subcommand per task, each in its own file in this folder.
#include <cstdio>
#include <exception>
#include <vector>

#include "cli/commands.h"
#include "cli/config_file.h"
#include "cli/launch.h"
#include "comm/group.h"
#include "core/cpu_info.h"
#include "core/memory.h"

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

int run_main(int argc, char** argv) {
  using namespace meshtrain::cli;
  if (auto s = check_build_matches_cpu(); !s.is_ok()) return fail(s);
  CLI::App app{"meshtrain: train GPT-style language models (see README.md)"};
  app.require_subcommand(1);
  std::vector<Command> commands = {
      add_prep_command(app),   add_tokenize_command(app), add_train_command(app),
      add_eval_command(app),   add_generate_command(app), add_export_command(app),
      add_bench_command(app),  add_plot_command(app),     add_timeline_command(app), add_plan_command(app),
      add_serve_command(app)};
  set_original_args(argc, argv);
  if (meshtrain::comm::launched_by_mpi()) end_with_parent();
  std::vector<std::string> args(argv + 1, argv + argc);
  if (auto s = expand_config_args(app, &args); !s.is_ok()) return fail(s);
  std::vector<const char*> expanded = {argv[0]};
  for (const auto& a : args) expanded.push_back(a.c_str());
  CLI11_PARSE(app, (int)expanded.size(), expanded.data());
  for (auto& c : commands)
    if (c.app->parsed()) return c.run();
  return 0;
}

}  // namespace

// Recoverable errors arrive as Status; this last catch turns anything thrown past them (a
// parser's exception that escaped its Status wrapper, an out-of-memory error, which names
// the allocation that failed) into the same one-line error and exit code 1 instead of
// std::terminate's abort. Every rank of a multi-rank run runs main, so each reports and exits this way.
int main(int argc, char** argv) {
  try {
    return run_main(argc, argv);
  } catch (const meshtrain::AllocationError& e) {  // a tracked buffer: it names itself
    std::fprintf(stderr, "meshtrain: error: %s\n", e.what());
  } catch (const std::bad_alloc&) {  // elsewhere: say what the tracked buffers held
    std::fprintf(stderr, "meshtrain: error: out of memory in an allocation outside the tracked buffers; %s\n",
                 meshtrain::describe_tracked_memory().c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "meshtrain: error: %s\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "meshtrain: error: unknown exception\n");
  }
  return 1;
}
