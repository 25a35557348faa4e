// meshtrain command line: one subcommand per task, each in its own file in this folder
// (cli/app.h parses them).
#include <cstdio>
#include <exception>

#include "cli/app.h"
#include "core/memory.h"

// Recoverable errors arrive as Status; this last catch turns anything thrown past them (a
// parser's exception that escaped its Status wrapper, an out-of-memory error, which names
// the allocation that failed) into the same one-line error and exit code 1 instead of
// std::terminate's abort. Every rank of a multi-rank run runs main, so each reports and exits this way.
int main(int argc, char** argv) {
  try {
    return meshtrain::cli::run_command_line(argc, argv);
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
