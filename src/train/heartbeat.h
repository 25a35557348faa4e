// A flight recorder for the job: every rank of a run with an out folder keeps a small file,
// OUT/heartbeat/rank_RRRRR.json, rewritten every few seconds by a thread of its own, saying
// where it is: its host and pid, the step, and the collective its compute thread waits in
// (comm::current_wait). The folder sits on the filesystem every rank already shares for
// checkpoints. When a collective times out, the watchdog reads every rank's file and names
// the ones at fault: a rank whose file went stale (it died, or its host did), a rank that
// never joined (stuck in compute), or, when every rank waits, a network that cannot carry
// their messages (a link down or a partition). The supervisor (cli/supervise) reads the
// same files after a failed job to name the failed rank's host and step.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace meshtrain::train {

// This machine's name (gethostname); on the hosts of scripts/hosts.sh, the host's name.
std::string host_name();

// The folder of a run's heartbeat files.
std::string heartbeat_dir(const std::string& out_dir);

class Heartbeat {
 public:
  // Starts beating into heartbeat_dir(out_dir) every `interval_s` seconds, and at once
  // whenever the step changes (comm::set_current_step): a rank that dies mid-step is
  // reported at that step, not at the one its last timed beat saw.
  Heartbeat(const std::string& out_dir, int rank, double interval_s);
  // Stops the thread and records how the rank ended: finished, failed (the default), or what
  // finish_as says ("interrupted": a signal stopped the run between steps).
  ~Heartbeat();
  void finish(bool done) { final_state_ = done ? "finished" : "failed"; }
  void finish_as(const char* state) { final_state_ = state; }
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

 private:
  bool beat(const char* state);  // false: no run folder yet
  void loop();
  void step_changed();  // wakes the thread to beat now (comm::set_step_listener)

  std::string path_;
  int rank_;
  double interval_s_;
  const char* final_state_ = "failed";
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool step_changed_ = false;
  std::thread thread_;  // last: starts after the members above exist
};

// One rank's last beat, as read back.
struct RankBeat {
  int rank = 0;
  bool present = false;  // the file exists and parses
  std::string host, state;  // state: running | finished | failed | interrupted
  int64_t pid = 0, step = 0;
  std::string op, axis;  // the collective it waits in ("": not waiting)
  double waited_s = 0;
  double age_s = 0;  // seconds since it was written
};
std::vector<RankBeat> read_heartbeats(const std::string& out_dir, int world);

// Seconds after which a beat is stale for a run beating every `interval_s`.
double stale_after(double interval_s);
// The interval a run with this --comm-timeout beats at: a tenth of it, within [0.5, 5] s.
double heartbeat_interval(double comm_timeout_s);

// The rank that holds the others up, judged from the beats (whichever rank reported the
// failure): the one whose beat is oldest among those gone stale (it died, or its host did);
// else one alive but not in a collective while others wait (stuck in computation); else
// the one at the lowest step, when it is below the others'. -1 when none stands out: every
// live rank waits at the same step (the network), or there are no beats.
int rank_behind(const std::vector<RankBeat>& beats, double stale_s);

// Every rank's last beat, one line each after `indent`: "rank 1 on mt1: step 3, 0.4 s ago,
// waiting in all_reduce on dp for 6.1 s" (or "running, not in a collective", "finished",
// "no heartbeat file").
std::string list_heartbeats(const std::vector<RankBeat>& beats, const std::string& indent);

// What the beats say about a stuck job, seen from rank `me`: one line per group of ranks in
// the same state on the same host, then the verdict (who is at fault).
std::string diagnose_ranks(const std::vector<RankBeat>& beats, int me, double stale_s);

}  // namespace meshtrain::train
