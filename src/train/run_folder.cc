#include "train/run_folder.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/file_io.h"
#include "train/heartbeat.h"

namespace meshtrain::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kLockFile = "job.lock";

std::string utc_now_text() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%d %H:%M:%S UTC", &tm);
  return text;
}

// This process's command line, arguments joined by spaces.
std::string own_command() {
  std::string raw;
  if (!read_file("/proc/self/cmdline", &raw).is_ok()) return "";
  std::replace(raw.begin(), raw.end(), '\0', ' ');
  while (!raw.empty() && raw.back() == ' ') raw.pop_back();
  return raw;
}

// Who holds the lock, in words, from what the holder wrote into the file.
std::string holder_text(int fd) {
  char buf[4096];
  const ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
  const json j = json::parse(std::string(buf, n > 0 ? (size_t)n : 0), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return "another job (its lock file names no holder yet)";
  std::string out = "pid " + std::to_string(j.value("pid", (int64_t)0)) + " on host " + j.value("host", "?");
  if (j.contains("since")) out += ", running since " + j.value("since", "");
  if (const std::string cmd = j.value("command", ""); !cmd.empty()) out += " (" + cmd + ")";
  return out;
}

Status open_lock_file(const std::string& out_dir, int* fd) {
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) return Status::error("cannot create the run folder " + out_dir + ": " + ec.message());
  const std::string path = (fs::path(out_dir) / kLockFile).string();
  *fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (*fd < 0) return Status::error("cannot write the run folder " + out_dir + ": " + path + ": " + errno_text());
  return Status::ok();
}

Status in_use(const std::string& out_dir, int fd) {
  return Status::error("the run folder " + out_dir + " is in use by another job: " + holder_text(fd) +
                       "; wait for it to end or stop it, or choose another --out");
}

}  // namespace

Status RunFolderLock::acquire(const std::string& out_dir, double wait_s, std::unique_ptr<RunFolderLock>* out) {
  int fd = -1;
  RETURN_IF_ERROR(open_lock_file(out_dir, &fd));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(std::max(0.0, wait_s));
  while (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK && errno != EINTR) {
      const Status s = Status::error("cannot lock the run folder " + out_dir + ": " + errno_text());
      ::close(fd);
      return s;
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      const Status s = in_use(out_dir, fd);
      ::close(fd);
      return s;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const std::string holder = json{{"pid", (int64_t)getpid()}, {"host", host_name()}, {"since", utc_now_text()},
                                  {"command", own_command()}}
                                 .dump() +
                             "\n";
  if (::ftruncate(fd, 0) != 0 || !write_all(fd, holder.data(), holder.size()).is_ok()) {
    const Status s = Status::error("cannot write the run folder's lock " + out_dir + "/" + kLockFile + ": " +
                                   errno_text());
    ::close(fd);
    return s;
  }
  out->reset(new RunFolderLock(fd));
  return Status::ok();
}

RunFolderLock::~RunFolderLock() { ::close(fd_); }  // closing drops the lock

Status check_run_folder_free(const std::string& out_dir) {
  std::error_code ec;
  const std::string path = (fs::path(out_dir) / kLockFile).string();
  if (out_dir.empty() || !fs::exists(path, ec)) return Status::ok();
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::ok();  // unreadable: the ranks' own lock says why
  Status s = Status::ok();
  if (::flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK) s = in_use(out_dir, fd);
  ::close(fd);
  return s;
}

Status check_writable(const std::string& dir, int rank) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return Status::error("cannot create the run folder " + dir + ": " + ec.message());
  std::vector<fs::path> places = {dir};
  if (fs::is_directory(fs::path(dir) / "checkpoints", ec)) places.push_back(fs::path(dir) / "checkpoints");
  for (const fs::path& place : places) {
    const std::string probe = (place / (".write_probe_" + std::to_string(rank))).string();
    const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
      return Status::error("cannot write into " + place.string() + ": " + errno_text() +
                           " (checked before the first step: checkpoints and metrics go there)");
    const char byte = 0;
    const Status wrote = write_all(fd, &byte, 1);
    ::close(fd);
    ::unlink(probe.c_str());
    if (!wrote.is_ok()) return Status::error("cannot write into " + place.string() + ": " + wrote.message());
  }
  return Status::ok();
}

std::string earlier_run_contents(const std::string& out_dir) {
  std::error_code ec;
  std::vector<std::string> steps;
  const fs::path root = fs::path(out_dir) / "checkpoints";
  if (fs::is_directory(root, ec))
    for (const auto& e : fs::directory_iterator(root, ec)) {
      const std::string name = e.path().filename().string();
      if (name.starts_with("step_") && !name.ends_with(".tmp")) steps.push_back(name);
    }
  std::sort(steps.begin(), steps.end());
  std::string out;
  if (!steps.empty()) {
    out = "checkpoints/" + steps.front();
    if (steps.size() > 1) out += (steps.size() > 2 ? " ... " : ", ") + steps.back();
  }
  std::ifstream metrics(fs::path(out_dir) / "metrics.jsonl");
  int64_t records = 0;
  for (std::string line; std::getline(metrics, line);) records += !line.empty();
  if (records > 0)
    out += (out.empty() ? "" : " and ") + std::string("metrics.jsonl with ") + std::to_string(records) + " records";
  return out;
}

Status check_not_mixed(const std::string& out_dir, bool resume, bool overwrite) {
  if (resume && overwrite)
    return Status::error("--resume continues the run in --out and --overwrite starts it again: give one of them");
  if (out_dir.empty() || resume || overwrite) return Status::ok();
  const std::string there = earlier_run_contents(out_dir);
  if (there.empty()) return Status::ok();
  return Status::error("--out " + out_dir + " already holds a run (" + there +
                       "): give --resume to continue it, --overwrite to start again there (its checkpoints and "
                       "metrics are deleted), or another --out");
}

Status clear_earlier_run(const std::string& out_dir) {
  for (const char* part : {"checkpoints", "metrics.jsonl", "heartbeat"}) {
    std::error_code ec;
    fs::remove_all(fs::path(out_dir) / part, ec);
    if (ec) return Status::error("--overwrite: cannot remove " + (fs::path(out_dir) / part).string() + ": " + ec.message());
  }
  return Status::ok();
}

}  // namespace meshtrain::train
