// Starting a multi-rank job from a plain shell, and watching it: meshtrain runs itself under
// mpirun with the flags a new user should not need to know (root, oversubscription, one
// OpenMP thread per rank when ranks outnumber cores), as mpirun's parent. Like torchrun's
// elastic agent, that parent outlives a failed job: it names what failed (the rank, its
// host, its step), the newest complete checkpoint, and with --max-restarts starts the job
// again from that checkpoint.
#pragma once
#include <string>
#include <vector>

#include "core/status.h"

namespace meshtrain::cli {

// The command line this process was started with (set by main).
void set_original_args(int argc, char** argv);

struct LaunchOptions {
  int ranks = 1;
  int threads_per_rank = 0;  // 0: cores / ranks
  std::string hostfile;      // mpirun --hostfile (empty: every rank on this machine)
  std::string mpirun_args;   // more mpirun flags, split at spaces (a launch agent, MCA settings)
  int max_restarts = 0;      // restarts after a failure a restart may cure
  std::string out_dir;       // the run folder: its checkpoints and heartbeats
  double comm_timeout = 300; // how long the ranks wait before their watchdog fires
  // --elastic: a restart leaves out the host of the rank that failed and runs on fewer
  // data-parallel ranks, with the same global batch (more gradient accumulation).
  bool elastic = false;
  int model_parallel = 1;  // tp x cp x pp: the ranks of one model replica
  int dp = 1;
  int micro_batch = 1;
  int global_batch = 1;    // rows per step: micro-batch x grad-accum x dp
  // train: mpirun runs in a process group of its own, so the terminal's Ctrl-C reaches this
  // process alone, which passes SIGINT and SIGTERM on as SIGUSR1 and SIGUSR2 (mpirun
  // forwards those to every rank; train/interrupt.h): the ranks stop between steps. A second
  // signal ends mpirun at once. Without it, mpirun gets the signals as they come.
  bool graceful_stop = false;
};

// mpirun's placement flags. On one machine with a core for every thread of every rank, each
// rank is bound to its own cores (`--map-by core` or `slot:PE=threads`, `--bind-to core`):
// unbound, the scheduler moves a rank's thread to the other core whenever it wakes from a
// wait, and a pipeline's 1F1B waits between every pass (docs/pipeline.md: 1F1B at pp 2, m 8
// stepped 8% faster bound). Otherwise (more threads than cores, a hostfile, whose hosts may
// be namespaces of one machine that each bind from core 0) ranks are left unbound. Flags the
// user gave with --mpirun-args that place ranks (--bind-to, --map-by) replace these.
std::vector<std::string> placement_flags(int ranks, int threads_per_rank, int physical_cores, bool hostfile,
                                         const std::string& mpirun_args);

// For a rank under mpirun: the rank ends (SIGKILL) when its parent (mpirun, or Open MPI's
// daemon on another host) dies, so no rank trains on orphaned after its launcher is gone.
void end_with_parent();

// An elastic restart's job: `ranks` ranks of `dp` replicas on `hostfile`, the grad-accum
// that keeps the global batch.
struct ElasticShape {
  int ranks = 0, dp = 0, grad_accum = 0;
  std::string hostfile;
  std::string summary;  // "without host mt1: dp 2 -> 1, grad-accum 1 -> 2 (global batch 4)"
};
// The shape of an elastic restart without `failed_host`, whose hostfile (o.hostfile less
// that host's lines) is written to `new_hostfile`: the most dp ranks the other hosts' slots
// hold that divide the global batch into whole micro-batches, at most o.dp. Errors: a host
// the hostfile does not name, lines without slots=N, no slots left for one replica.
Status elastic_shape(const LaunchOptions& o, const std::string& failed_host, const std::string& new_hostfile,
                     ElasticShape* out);

// Runs `mpirun -n ranks ... <this program> <same args>` (adding --resume to a restart) and
// returns the job's exit code, after reporting and restarting failures as described above.
int supervise(const LaunchOptions& options);

// What a failed attempt's stderr says, as the supervisor reads it (exposed for tests).
struct FailureReport {
  int rank = -1;       // the rank the launcher saw fail, or the first to time out
  std::string host;    // its host, when the launcher named it
  int signal = 0;      // the signal that ended it (0: it exited)
  std::string signal_name;
  std::string timeout;  // the first watchdog line ("comm timeout: ..."), if any
};
FailureReport read_failure(const std::string& stderr_text);

}  // namespace meshtrain::cli
