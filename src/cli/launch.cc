#include "cli/launch.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <sstream>
#include <thread>

#include "checkpoint/checkpoint.h"
#include "comm/group.h"
#include "core/cpu_info.h"
#include "core/file_io.h"
#include "train/heartbeat.h"

namespace meshtrain::cli {

namespace {

using Clock = std::chrono::steady_clock;

std::vector<std::string>& args() {
  static std::vector<std::string> a;
  return a;
}

std::atomic<int> g_interrupt{0};  // the signal that asked the supervisor to stop (0: none)
std::atomic<int> g_interrupts{0};  // how many arrived
extern "C" void on_interrupt(int sig) {
  g_interrupt.store(sig);
  g_interrupts.fetch_add(1);
}

}  // namespace

std::vector<std::string> placement_flags(int ranks, int threads_per_rank, int physical_cores, bool hostfile,
                                         const std::string& mpirun_args) {
  std::istringstream words(mpirun_args);
  for (std::string w; words >> w;)
    if (w.rfind("--bind-to", 0) == 0 || w.rfind("--map-by", 0) == 0) return {};
  if (hostfile || (int64_t)ranks * threads_per_rank > physical_cores) return {"--bind-to", "none"};
  std::string map = "core";
  if (threads_per_rank > 1) map = std::string("slot:PE=").append(std::to_string(threads_per_rank));
  return {"--map-by", map, "--bind-to", "core"};
}

namespace {

// `restart`: the ranks resume from the newest checkpoint (`resume`), else start over in the
// run folder the failed attempt wrote to; either waits for that attempt's lock to go.
std::vector<std::string> mpirun_command(const LaunchOptions& o, const std::vector<std::string>& rank_args, bool restart,
                                        bool resume) {
  const int cores = (int)std::max(1u, std::thread::hardware_concurrency());
  const int threads = o.threads_per_rank > 0 ? o.threads_per_rank : std::max(1, cores / o.ranks);
  std::error_code ec;
  std::string self = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  if (ec) self = args()[0];
  std::vector<std::string> cmd = {"mpirun", "-n", std::to_string(o.ranks)};
  const auto placement = placement_flags(o.ranks, threads, physical_core_count(), !o.hostfile.empty(), o.mpirun_args);
  cmd.insert(cmd.end(), placement.begin(), placement.end());
  // Open MPI counts physical cores as slots; oversubscription is what we mean anyway.
  cmd.push_back("--oversubscribe");
  if (geteuid() == 0) cmd.push_back("--allow-run-as-root");
  if (!o.hostfile.empty()) cmd.insert(cmd.end(), {"--hostfile", o.hostfile});
  std::istringstream extra(o.mpirun_args);
  for (std::string word; extra >> word;) cmd.push_back(word);
  cmd.insert(cmd.end(), {"-x", "OMP_NUM_THREADS=" + std::to_string(threads)});
  cmd.insert(cmd.end(), {"-x", std::string("MESHTRAIN_STDOUT_TTY=") + (isatty(STDOUT_FILENO) ? "1" : "0")});
  // A restart's rank 0 waits a while for the failed attempt's rank 0 to let go of the run
  // folder's lock (train/run_folder.h): it may still be exiting.
  if (restart) cmd.insert(cmd.end(), {"-x", "MESHTRAIN_LOCK_WAIT_S=60"});
#ifdef MESHTRAIN_SANITIZED
  // Open MPI 4.1 dlcloses its plugins in MPI_Finalize, so LeakSanitizer reports their
  // one-time allocations from "<unknown module>" frames that no suppression can match.
  // The ranks keep AddressSanitizer's and UBSan's error checks; only their leak check is
  // off (the launching process, and every single-rank run, keep theirs).
  const char* asan = std::getenv("ASAN_OPTIONS");
  cmd.insert(cmd.end(), {"-x", std::string("ASAN_OPTIONS=") + (asan ? asan : "") + ":detect_leaks=0"});
#endif
  cmd.push_back(self);
  cmd.insert(cmd.end(), rank_args.begin(), rank_args.end());
  const bool has_resume = std::find(cmd.begin(), cmd.end(), "--resume") != cmd.end();
  if (restart && resume && !has_resume) cmd.push_back("--resume");
  // No checkpoint yet: the failed attempt's metrics would make the folder "another run".
  if (restart && !resume && !has_resume && std::find(cmd.begin(), cmd.end(), "--overwrite") == cmd.end())
    cmd.push_back("--overwrite");
  return cmd;
}

struct Attempt {
  int exit_code = 0;
  bool ended_hung = false;  // a rank reported a failure and mpirun did not end: we ended it
  bool never_started = false;  // some rank never beat within the start timeout: we ended it
  std::string err;          // mpirun's stderr (the ranks' and its own), as copied through
};

// Whether every rank has beaten since `since` (unix seconds): the attempt has started.
// Without a run folder there are no beats, and every attempt counts as started.
bool all_ranks_started(const LaunchOptions& o, double since_age_s) {
  if (o.out_dir.empty()) return true;
  for (const train::RankBeat& b : train::read_heartbeats(o.out_dir, o.ranks))
    if (!b.present || b.age_s > since_age_s) return false;
  return true;
}

// How long an attempt may take to start every rank: a daemon that could not reach mpirun
// (its host's link was down at launch) leaves mpirun waiting for it forever.
double start_timeout_s(const LaunchOptions& o) { return std::max(60.0, o.comm_timeout); }

// A pause before a restart: a link that flapped, or a host that rebooted, gets a moment.
constexpr double kRestartDelayS = 3;
// How long mpirun may go on after a rank's watchdog fired: it may be waiting for a daemon on
// a host it cannot reach any more (a link down), which it would do for TCP's whole timeout.
// Ordinarily MPI_Abort ends the job within a second of the first watchdog line; 2 s keeps
// the job's end close to --comm-timeout (the watchdog fires at it).
constexpr double kHungGraceS = 2;

// Copies what mpirun wrote to stderr through to ours, keeping it for read_failure. Returns
// read()'s count: 0 at the end of the pipe, < 0 when nothing is there yet.
ssize_t copy_through(int fd, std::string* kept) {
  char buf[4096];
  const ssize_t n = read(fd, buf, sizeof buf);
  if (n > 0) {
    (void)!write(STDERR_FILENO, buf, (size_t)n);
    kept->append(buf, (size_t)n);
  }
  return n;
}

// Runs `cmd` with its stderr copied through this process (and kept for read_failure); ends
// it when a rank reported a failure and it did not end within kHungGraceS, or when this
// process is interrupted.
// The forked child: mpirun with its stderr into the pipe `fds`, ending with its parent.
[[noreturn]] void exec_mpirun(const std::vector<std::string>& cmd, const LaunchOptions& o, const int fds[2],
                              pid_t parent) {
  dup2(fds[1], STDERR_FILENO);
  close(fds[0]);
  close(fds[1]);
  // mpirun ends its job when this process dies, however it dies (SIGKILL included).
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (getppid() != parent) _exit(1);  // it died before the line above
  if (o.graceful_stop) {
    setpgid(0, 0);  // the terminal's Ctrl-C is this process's to pass on
    // A process group in the background that reads the terminal is stopped (SIGTTIN):
    // the ranks of train read nothing from stdin.
    const int null_fd = open("/dev/null", O_RDONLY);
    if (null_fd >= 0) dup2(null_fd, STDIN_FILENO);
  }
  std::vector<char*> argv;
  for (const auto& c : cmd) argv.push_back(const_cast<char*>(c.c_str()));
  argv.push_back(nullptr);
  ::execvp("mpirun", argv.data());
  std::fprintf(stderr, "meshtrain: error: cannot start mpirun: %s (is Open MPI installed?)\n", std::strerror(errno));
  _exit(127);
}

Attempt run_attempt(const std::vector<std::string>& cmd, const LaunchOptions& o) {
  Attempt a;
  const auto launched = Clock::now();
  bool started = false;
  int fds[2];
  if (pipe(fds) != 0) {
    std::fprintf(stderr, "meshtrain: error: pipe: %s\n", std::strerror(errno));
    a.exit_code = 1;
    return a;
  }
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) exec_mpirun(cmd, o, fds, parent);
  close(fds[1]);
  fcntl(fds[0], F_SETFL, O_NONBLOCK);
  std::optional<Clock::time_point> hung_since, term_sent;
  int status = 0;
  bool exited = false, pipe_open = true, forwarded = false;
  for (;;) {
    pollfd p = {fds[0], POLLIN, 0};
    if (pipe_open && poll(&p, 1, 200) > 0) {
      const ssize_t n = copy_through(fds[0], &a.err);
      if (n > 0) {
        if (!hung_since && a.err.find("comm timeout:") != std::string::npos) hung_since = Clock::now();
        continue;
      }
      if (n == 0) pipe_open = false;
    } else if (!pipe_open) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (!exited && waitpid(pid, &status, WNOHANG) == pid) exited = true;
    // After mpirun ended, what is left in the pipe is read; a daemon that kept it open
    // does not keep us waiting.
    if (exited) {
      while (pipe_open && copy_through(fds[0], &a.err) > 0) {
      }
      break;
    }
    // A graceful stop: the first signal goes on to the ranks, which stop between steps; a
    // second one ends mpirun as any interruption does.
    if (o.graceful_stop && g_interrupts.load() == 1 && !forwarded) {
      kill(pid, g_interrupt.load() == SIGINT ? SIGUSR1 : SIGUSR2);
      forwarded = true;
    }
    const bool interrupted = g_interrupt.load() != 0 && (!o.graceful_stop || g_interrupts.load() > 1);
    const bool hung = hung_since && std::chrono::duration<double>(Clock::now() - *hung_since).count() > kHungGraceS;
    const double running_s = std::chrono::duration<double>(Clock::now() - launched).count();
    started = started || all_ranks_started(o, running_s);
    const bool stuck = !started && running_s > start_timeout_s(o);
    if ((interrupted || hung || stuck) && !term_sent) {
      a.ended_hung = (hung || stuck) && !interrupted;
      a.never_started = stuck && !hung && !interrupted;
      if (hung && !interrupted)
        std::fprintf(stderr, "meshtrain: mpirun did not end %g s after a rank's watchdog fired; ending it\n",
                     kHungGraceS);
      if (a.never_started)
        std::fprintf(stderr, "meshtrain: not every rank started within %g s (a host unreachable?); ending the job\n",
                     start_timeout_s(o));
      // A hung mpirun is killed outright: Open MPI 4.1's mpirun crashes in PMIx_Finalize when
      // asked to stop while it waits for an unreachable daemon. Its daemons on reachable
      // hosts lose their lifeline and end their ranks.
      kill(pid, a.ended_hung ? SIGKILL : SIGTERM);
      term_sent = Clock::now();
    } else if (term_sent && std::chrono::duration<double>(Clock::now() - *term_sent).count() > 5) {
      kill(pid, SIGKILL);
    }
  }
  close(fds[0]);
  a.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return a;
}

bool retryable(const Attempt& a, const FailureReport& f) {
  return a.ended_hung || a.exit_code == comm::kExitCommFailure || a.exit_code > 128 || f.signal > 0;
}

// A watchdog's timeout: the rank it fired on only waited. Every rank's heartbeat names the
// one holding the others up (train::rank_behind), and the list lets the user see why.
int timeout_rank_behind(const LaunchOptions& o, std::vector<train::RankBeat>* beats) {
  *beats = train::read_heartbeats(o.out_dir, o.ranks);
  return train::rank_behind(*beats, train::stale_after(train::heartbeat_interval(o.comm_timeout)));
}

std::string describe_timeout(const FailureReport& f, const LaunchOptions& o) {
  const std::string fired = (f.rank >= 0 ? "rank " + std::to_string(f.rank) + "'s watchdog fired: " : "") + f.timeout;
  if (o.out_dir.empty()) return fired;
  std::vector<train::RankBeat> beats;
  const int behind = timeout_rank_behind(o, &beats);
  std::string verdict = "no rank is behind the others (every rank waits at the same step: the network)";
  if (behind >= 0) {
    const train::RankBeat& b = beats[behind];
    verdict = "the rank behind is rank " + std::to_string(behind) + (b.host.empty() ? "" : " on host " + b.host) +
              (b.present ? " (step " + std::to_string(b.step) + ")" : " (no heartbeat)");
  }
  return fired + "; " + verdict;
}

// After the one-line error of a timeout: every rank's last heartbeat, a line each.
std::string timeout_heartbeats(const FailureReport& f, const LaunchOptions& o) {
  if (f.timeout.empty() || o.out_dir.empty()) return "";
  return "\nthe ranks' last heartbeats:\n" + train::list_heartbeats(train::read_heartbeats(o.out_dir, o.ranks), "  ");
}

// "rank 3 on host mt1 was killed by signal 9 (Killed) at step 5", from mpirun's words and
// the rank's heartbeat.
std::string describe_failure(const Attempt& a, const FailureReport& f, const LaunchOptions& o) {
  std::string host = f.host;
  int64_t step = -1;
  if (f.rank >= 0 && !o.out_dir.empty()) {
    const auto beats = train::read_heartbeats(o.out_dir, f.rank + 1);
    if (beats[f.rank].present) {
      if (host.empty()) host = beats[f.rank].host;
      step = beats[f.rank].step;
    }
  }
  std::string who = "rank " + std::to_string(f.rank) + (host.empty() ? "" : " on host " + host);
  std::string at = step > 0 ? " (its last heartbeat was at step " + std::to_string(step) + ")" : "";
  if (f.signal > 0 && f.rank >= 0)
    return who + " was killed by signal " + std::to_string(f.signal) + " (" + f.signal_name + ")" + at;
  if (a.never_started) return "not every rank started within " + std::to_string((int)start_timeout_s(o)) + " s";
  if (!f.timeout.empty()) return describe_timeout(f, o);
  if (f.rank >= 0) return who + " failed" + at + " (exit code " + std::to_string(a.exit_code) + ")";
  return "mpirun ended with exit code " + std::to_string(a.exit_code);
}

// The host of the rank that failed: mpirun's words, else its last heartbeat; for a
// timeout, the host of the rank behind (the rank whose watchdog fired only waited).
std::string failed_host(const FailureReport& f, const LaunchOptions& o) {
  if (!f.timeout.empty() && f.host.empty() && !o.out_dir.empty()) {
    std::vector<train::RankBeat> beats;
    const int behind = timeout_rank_behind(o, &beats);
    return behind >= 0 ? beats[behind].host : "";
  }
  if (!f.host.empty() || f.rank < 0 || o.out_dir.empty()) return f.host;
  const auto beats = train::read_heartbeats(o.out_dir, f.rank + 1);
  return beats[f.rank].present ? beats[f.rank].host : "";
}

std::string newest_checkpoint(const std::string& out_dir) {
  std::string dir;
  if (out_dir.empty() || !checkpoint::find_latest_checkpoint(out_dir, &dir).is_ok()) return "";
  return dir;
}

// `args` without the flags in `names` and their values ("--dp 2" and "--dp=2").
std::vector<std::string> without_flags(const std::vector<std::string>& args, const std::vector<std::string>& names) {
  std::vector<std::string> out;
  for (size_t i = 0; i < args.size(); i++) {
    bool drop = false;
    for (const std::string& n : names) {
      if (args[i] == n) drop = true, i++;  // and its value
      else if (args[i].starts_with(n + "=")) drop = true;
      if (drop) break;
    }
    if (!drop) out.push_back(args[i]);
  }
  return out;
}

}  // namespace

Status elastic_shape(const LaunchOptions& o, const std::string& failed_host, const std::string& new_hostfile,
                     ElasticShape* out) {
  std::ifstream in(o.hostfile);
  if (!in) return Status::error("cannot read the hostfile " + o.hostfile);
  std::string kept;
  int slots = 0;
  bool found = false;
  static const std::regex slots_re(R"(\bslots\s*=\s*(\d+))");
  for (std::string line; std::getline(in, line);) {
    const std::string text = line.substr(0, line.find('#'));
    std::istringstream words(text);
    std::string host;
    if (!(words >> host)) continue;
    if (host == failed_host) {
      found = true;
      continue;
    }
    std::smatch m;
    if (!std::regex_search(text, m, slots_re))
      return Status::error("hostfile " + o.hostfile + ": host " + host + " has no slots=N (an elastic restart counts them)");
    slots += std::stoi(m[1]);
    kept += line + "\n";
  }
  if (!found) return Status::error("hostfile " + o.hostfile + " does not name host " + failed_host);
  int dp = std::min(o.dp, slots / std::max(1, o.model_parallel));
  while (dp >= 1 && o.global_batch % (o.micro_batch * dp) != 0) dp--;
  if (dp < 1)
    return Status::error("the hosts left hold " + std::to_string(slots) + " slots, not one replica of " +
                         std::to_string(o.model_parallel) + " ranks (tp x cp x pp) whose dp divides the global batch " +
                         std::to_string(o.global_batch));
  RETURN_IF_ERROR(write_file_synced(new_hostfile, kept.data(), kept.size()));
  out->dp = dp;
  out->ranks = dp * o.model_parallel;
  out->grad_accum = o.global_batch / (o.micro_batch * dp);
  out->hostfile = new_hostfile;
  const int old_accum = o.global_batch / (o.micro_batch * o.dp);
  out->summary = "without host " + failed_host + ": dp " + std::to_string(o.dp) + " -> " + std::to_string(dp) +
                 ", grad-accum " + std::to_string(old_accum) + " -> " + std::to_string(out->grad_accum) +
                 " (global batch " + std::to_string(o.global_batch) + ")";
  return Status::ok();
}

void set_original_args(int argc, char** argv) { args().assign(argv, argv + argc); }

void end_with_parent() {
  const pid_t parent = getppid();
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) ::kill(getpid(), SIGKILL);  // it died before the line above
}

FailureReport read_failure(const std::string& text) {
  FailureReport f;
  std::smatch m;
  // Open MPI: "mpirun noticed that process rank 3 with PID 6388 on node mt1 exited on
  // signal 9 (Killed)." or "... on node mt1 exited with status 1" / "MPI_ABORT was invoked
  // on rank 1"; Slurm: "srun: error: mt1: task 3: Killed".
  static const std::regex signaled(R"(process rank (\d+) with PID \d+ on node (\S+) exited on signal (\d+) \(([^)]*)\))");
  static const std::regex exited(R"(process rank (\d+) with PID \d+ on node (\S+) exited)");
  static const std::regex aborted(R"(MPI_ABORT was invoked on rank (\d+))");
  static const std::regex slurm(R"(srun: error: (\S+): task (\d+): (\w+))");
  static const std::regex timeout(R"(\[rank (\d+)\] meshtrain: error: (comm timeout: [^\n]*))");
  if (std::regex_search(text, m, signaled)) {
    f.rank = std::stoi(m[1]);
    f.host = m[2];
    f.signal = std::stoi(m[3]);
    f.signal_name = m[4];
  } else if (std::regex_search(text, m, slurm)) {
    f.host = m[1];
    f.rank = std::stoi(m[2]);
    if (m[3] == "Killed") f.signal = SIGKILL, f.signal_name = "Killed";
  } else if (std::regex_search(text, m, timeout)) {
    f.rank = std::stoi(m[1]);
  } else if (std::regex_search(text, m, exited)) {
    f.rank = std::stoi(m[1]);
    f.host = m[2];
  } else if (std::regex_search(text, m, aborted)) {
    f.rank = std::stoi(m[1]);
  }
  if (std::regex_search(text, m, timeout)) f.timeout = m[2];
  return f;
}

int supervise(const LaunchOptions& options) {
  struct sigaction sa = {};
  sa.sa_handler = on_interrupt;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  LaunchOptions o = options;  // an elastic restart shrinks the job
  std::vector<std::string> rank_args(args().begin() + 1, args().end());
  std::string resume_from;  // a restart's checkpoint ("": start as the user asked)
  for (int attempt = 0;; attempt++) {
    const std::vector<std::string> cmd = mpirun_command(o, rank_args, attempt > 0, !resume_from.empty());
    if (attempt == 0) {
      std::fprintf(stderr, "meshtrain: starting %d ranks:", o.ranks);
      for (const auto& c : cmd) std::fprintf(stderr, " %s", c.c_str());
      std::fprintf(stderr, "\n");
    }
    const Attempt a = run_attempt(cmd, o);
    if (a.exit_code == 0) return 0;
    if (g_interrupt.load() != 0) return a.exit_code;
    const FailureReport f = read_failure(a.err);
    // An error every rank reported itself (a bad flag, a non-finite loss, a full disk) is
    // final, and its messages say all there is.
    if (!retryable(a, f)) return a.exit_code;
    const std::string newest = newest_checkpoint(o.out_dir);
    const std::string where = newest.empty() ? "no checkpoint was saved" : "the newest complete checkpoint is " + newest;
    std::fprintf(stderr, "meshtrain: error: the job failed: %s; %s%s\n", describe_failure(a, f, o).c_str(),
                 where.c_str(), timeout_heartbeats(f, o).c_str());
    if (attempt >= o.max_restarts) {
      std::fprintf(stderr, "meshtrain: %s%s\n",
                   o.max_restarts > 0 ? ("no restarts left (--max-restarts " + std::to_string(o.max_restarts) + "); ").c_str() : "",
                   newest.empty() ? "run it again to start over" : "run it again with --resume to continue");
      return a.exit_code;
    }
    std::string elastic;
    if (o.elastic) {
      ElasticShape e;
      const std::string host = failed_host(f, o);
      const std::string file = o.out_dir + "/hostfile.restart" + std::to_string(attempt + 1);
      if (host.empty()) {
        elastic = "; elastic: no host to leave out (the failure names none), so on the same hosts";
      } else if (Status s = elastic_shape(o, host, file, &e); !s.is_ok()) {
        std::fprintf(stderr, "meshtrain: error: an elastic restart is not possible: %s\n", s.message().c_str());
        return a.exit_code;
      } else {
        elastic = "; elastic: " + e.summary;
        o.ranks = e.ranks, o.dp = e.dp, o.hostfile = e.hostfile;
        rank_args = without_flags(rank_args, {"--dp", "--grad-accum", "--global-batch", "--hostfile"});
        // Both batch flags, consistent, so that a config file's grad_accum cannot conflict.
        rank_args.insert(rank_args.end(), {"--dp", std::to_string(e.dp), "--grad-accum", std::to_string(e.grad_accum),
                                           "--global-batch", std::to_string(o.global_batch), "--hostfile", e.hostfile});
      }
    }
    std::fprintf(stderr, "meshtrain: restart %d of %d in %g s, %s%s\n", attempt + 1, o.max_restarts, kRestartDelayS,
                 newest.empty() ? "from step 0 (no checkpoint yet)" : ("from " + newest).c_str(), elastic.c_str());
    std::this_thread::sleep_for(std::chrono::duration<double>(kRestartDelayS));
    resume_from = newest;
  }
}

}  // namespace meshtrain::cli
