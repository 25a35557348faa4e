#include "cli/launch.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

namespace meshtrain::cli {

namespace {
std::vector<std::string>& args() {
  static std::vector<std::string> a;
  return a;
}
}  // namespace

void set_original_args(int argc, char** argv) { args().assign(argv, argv + argc); }

int relaunch_under_mpirun(int ranks, int threads_per_rank) {
  const int cores = (int)std::max(1u, std::thread::hardware_concurrency());
  if (threads_per_rank <= 0) threads_per_rank = std::max(1, cores / ranks);
  std::error_code ec;
  std::string self = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  if (ec) self = args()[0];
  std::vector<std::string> cmd = {"mpirun", "-n", std::to_string(ranks), "--bind-to", "none"};
  // Open MPI counts physical cores as slots; oversubscription is what we mean anyway.
  cmd.push_back("--oversubscribe");
  if (geteuid() == 0) cmd.push_back("--allow-run-as-root");
  cmd.insert(cmd.end(), {"-x", "OMP_NUM_THREADS=" + std::to_string(threads_per_rank)});
  cmd.insert(cmd.end(), {"-x", std::string("MESHTRAIN_STDOUT_TTY=") + (isatty(STDOUT_FILENO) ? "1" : "0")});
#ifdef MESHTRAIN_SANITIZED
  // Open MPI 4.1 dlcloses its plugins in MPI_Finalize, so LeakSanitizer reports their
  // one-time allocations from "<unknown module>" frames that no suppression can match.
  // The ranks keep AddressSanitizer's and UBSan's error checks; only their leak check is
  // off (the launching process, and every single-rank run, keep theirs).
  const char* asan = std::getenv("ASAN_OPTIONS");
  cmd.insert(cmd.end(), {"-x", std::string("ASAN_OPTIONS=") + (asan ? asan : "") + ":detect_leaks=0"});
#endif
  cmd.push_back(self);
  cmd.insert(cmd.end(), args().begin() + 1, args().end());
  std::fprintf(stderr, "meshtrain: starting %d ranks:", ranks);
  for (const auto& c : cmd) std::fprintf(stderr, " %s", c.c_str());
  std::fprintf(stderr, "\n");
  std::vector<char*> argv;
  for (auto& c : cmd) argv.push_back(c.data());
  argv.push_back(nullptr);
  ::execvp("mpirun", argv.data());
  std::fprintf(stderr, "meshtrain: error: cannot start mpirun: %s (is Open MPI installed?)\n",
               std::strerror(errno));
  return 1;
}

}  // namespace meshtrain::cli
