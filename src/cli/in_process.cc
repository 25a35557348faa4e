#include "cli/in_process.h"

#include <cstdio>
#include <mutex>

#include "cli/app.h"
#include "comm/self_group.h"

namespace meshtrain::cli {

namespace {

InProcess* g_in_process = nullptr;
std::mutex g_in_process_mutex;  // one command at a time

}  // namespace

InProcess* in_process() { return g_in_process; }

Status run_in_process(const std::vector<std::string>& args, InProcess* io) {
  if (comm::launched_by_mpi())
    return Status::error("this process was started by mpirun: commands run in it would each want MPI's "
                         "world; start the host program alone (it runs the launcher for runs on several ranks)");
  const std::lock_guard<std::mutex> lock(g_in_process_mutex);
  std::vector<std::string> argv_text = {"meshtrain"};
  argv_text.insert(argv_text.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_text) argv.push_back(a.data());
  g_in_process = io;
  int rc = 1;
  try {
    rc = run_command_line((int)argv.size(), argv.data());
  } catch (...) {
    g_in_process = nullptr;
    throw;
  }
  g_in_process = nullptr;
  if (rc == 0) return Status::ok();
  return Status::error(io->error.empty() ? "the command ended with exit code " + std::to_string(rc) : io->error);
}

void emit_json(const nlohmann::json& result, int indent) {
  if (g_in_process != nullptr) {
    g_in_process->result = result;
    return;
  }
  std::printf("%s\n", result.dump(indent).c_str());
}

std::unique_ptr<comm::Group> command_world() {
  if (g_in_process != nullptr) return std::make_unique<comm::SelfGroup>("world");
  return comm::init_world(nullptr, nullptr);
}

void end_world(std::unique_ptr<comm::Group> world) {
  world.reset();
  if (g_in_process == nullptr) comm::finalize();
}

}  // namespace meshtrain::cli
