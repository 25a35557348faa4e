// Commands run inside a host program's process (the Python module, src/python): the same
// parsing, checks and messages as `meshtrain ...` in a shell, with these differences:
//   - an error comes back to the host (InProcess::error) instead of going to stderr;
//   - a command's --json result comes back as a value (emit_json) instead of going to stdout;
//   - the world is this process alone (no MPI: a host may run many commands, and MPI starts
//     once a process); a training run whose layout needs several ranks runs nothing here and
//     says how many (the host starts them through the launcher, as a shell would);
//   - a training run's events also go to the host's subscriber, which may stop it, and the
//     host's own signal handlers stay.
// One command at a time per process.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/group.h"
#include "core/status.h"
#include "train/reporter.h"

namespace meshtrain::cli {

struct InProcess {
  train::RunSubscriber* subscriber = nullptr;  // train: the run's events, after the built-in subscribers
  std::string error;                           // the first error the command reported
  nlohmann::json result;                       // its --json result (null: none)
  // train: the ranks the launcher must start (several, or restarts or a hostfile asked for);
  // nothing ran here. 0: the run ran in this process.
  int launcher_ranks = 0;
};

// The InProcess of the command running now; null when the process is the command line.
InProcess* in_process();

// Runs `meshtrain args...` here. An error status carries the command's own message.
Status run_in_process(const std::vector<std::string>& args, InProcess* io);

// A command's machine-readable result: to stdout as JSON (`indent` as nlohmann's dump), or
// to the host.
void emit_json(const nlohmann::json& result, int indent);

// The command's world: MPI's when launched by mpirun (comm::init_world), else this process
// alone. end_world releases it (and MPI with it, on the command line).
std::unique_ptr<comm::Group> command_world();
void end_world(std::unique_ptr<comm::Group> world);

}  // namespace meshtrain::cli
