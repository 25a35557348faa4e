// The run folder's guards, checked before any rank writes into it:
//   - one job at a time: rank 0 holds an exclusive lock on OUT/job.lock (flock) for the whole
//     run, and the file names the holder (host, pid, start time, command), so a second job
//     fails at once naming it. The kernel drops the lock when the holder dies, however it
//     dies: a lock is never stale on one host (on NFS, Linux maps flock to POSIX locks);
//   - writable: the folder (and its checkpoints/) takes a file, or the error gives the
//     operating system's reason before step 1 rather than at the first save;
//   - never two runs mixed: a folder that holds another run's checkpoints or metrics is
//     refused unless --resume continues it or --overwrite starts again in it.
#pragma once
#include <memory>
#include <string>

#include "core/status.h"

namespace meshtrain::train {

class RunFolderLock {
 public:
  // Takes OUT/job.lock (creating OUT), waiting up to `wait_s` seconds for a holder to end (a
  // restart whose previous attempt is still exiting); then an error naming the holder.
  static Status acquire(const std::string& out_dir, double wait_s, std::unique_ptr<RunFolderLock>* out);
  ~RunFolderLock();
  RunFolderLock(const RunFolderLock&) = delete;
  RunFolderLock& operator=(const RunFolderLock&) = delete;

 private:
  explicit RunFolderLock(int fd) : fd_(fd) {}
  int fd_;
};

// Whether another job holds OUT's lock now (the launcher asks before starting any rank); OK
// when none does or there is no folder yet. Takes and releases the lock.
Status check_run_folder_free(const std::string& out_dir);

// Creates `dir` if needed and writes and removes a small file in it (and in its checkpoints/
// when that exists): an error with the operating system's reason otherwise.
Status check_writable(const std::string& dir, int rank);

// What a run folder already holds of an earlier run: its checkpoints' names and the records
// of metrics.jsonl, in words ("" when nothing).
std::string earlier_run_contents(const std::string& out_dir);

// --resume, --overwrite and what the folder holds: a fresh run into a folder with an earlier
// run's checkpoints or metrics is refused, naming them; both flags together are refused.
Status check_not_mixed(const std::string& out_dir, bool resume, bool overwrite);

// --overwrite: removes the earlier run's checkpoints/, metrics.jsonl and heartbeat/ (what
// would mix with the new run's), after every check has passed.
Status clear_earlier_run(const std::string& out_dir);

}  // namespace meshtrain::train
