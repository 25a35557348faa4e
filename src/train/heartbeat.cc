#include "train/heartbeat.h"

#include <unistd.h>

#include <algorithm>
#include <climits>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "comm/group.h"
#include "core/file_io.h"

namespace meshtrain::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string beat_file(const std::string& dir, int rank) {
  char name[32];
  std::snprintf(name, sizeof name, "rank_%05d.json", rank);
  return (fs::path(dir) / name).string();
}

std::string seconds_text(double s) {
  char t[32];
  std::snprintf(t, sizeof t, "%.1f s", s);
  return t;
}

// "0-1, 3": ranks in ascending order, runs collapsed.
std::string rank_list(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) j++;
    out += (out.empty() ? "" : ", ") + std::to_string(ranks[i]);
    if (j > i) out += "-" + std::to_string(ranks[j]);
    i = j + 1;
  }
  return out;
}

// A rank's state in words, the key that groups ranks in diagnose_ranks.
std::string state_text(const RankBeat& b, double stale_s) {
  if (!b.present) return "no heartbeat file";
  if (b.state == "finished") return "finished";
  if (b.age_s > stale_s)
    return "silent for " + seconds_text(b.age_s) + " (last seen at step " + std::to_string(b.step) +
           "): dead, or its host is";
  if (!b.op.empty())
    return "waiting in " + b.op + " on " + b.axis + " at step " + std::to_string(b.step);
  return "at step " + std::to_string(b.step) + ", not waiting for any collective";
}

}  // namespace

std::string host_name() {
  char name[256] = {0};
  if (gethostname(name, sizeof name - 1) != 0) return "unknown";
  return name;
}

std::string heartbeat_dir(const std::string& out_dir) { return (fs::path(out_dir) / "heartbeat").string(); }

double heartbeat_interval(double comm_timeout_s) {
  if (comm_timeout_s <= 0) return 5;
  return std::clamp(comm_timeout_s / 10, 0.5, 5.0);
}

double stale_after(double interval_s) { return 3 * interval_s + 1; }

Heartbeat::Heartbeat(const std::string& out_dir, int rank, double interval_s)
    : path_(beat_file(heartbeat_dir(out_dir), rank)), rank_(rank), interval_s_(interval_s),
      thread_([this] { loop(); }) {
  comm::set_step_listener([this] { step_changed(); });
}

Heartbeat::~Heartbeat() {
  comm::set_step_listener(nullptr);
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  beat(final_state_);
}

void Heartbeat::loop() {
  std::unique_lock<std::mutex> lk(mu_);
  while (!stop_) {
    lk.unlock();
    // Until setup has made the run folder, look again soon: the first beat says the rank started.
    const double next_s = beat("running") ? interval_s_ : std::min(interval_s_, 0.1);
    lk.lock();
    cv_.wait_for(lk, std::chrono::duration<double>(next_s), [&] { return stop_ || step_changed_; });
    step_changed_ = false;
  }
}

void Heartbeat::step_changed() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    step_changed_ = true;
  }
  cv_.notify_all();
}

// Written to a temporary name and renamed, so a reader never sees half a file.
bool Heartbeat::beat(const char* state) {
  // The run folder is made by setup once the flags are valid: a run that fails its checks
  // leaves no folder behind, heartbeats included. Until then there is nothing to write.
  const fs::path dir = fs::path(path_).parent_path();
  std::error_code ec;
  if (!fs::is_directory(dir.parent_path(), ec)) return false;
  fs::create_directory(dir, ec);  // not its parents: a run folder removed stays removed
  const comm::WaitState wait = comm::current_wait();
  const json record = {{"rank", rank_},       {"host", host_name()},     {"pid", (int64_t)getpid()},
                       {"state", state},      {"step", comm::current_step()}, {"op", wait.op},
                       {"axis", wait.axis},   {"waited_s", wait.waited_s}, {"time", unix_now()}};
  const std::string tmp = path_ + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << record.dump() << "\n";
    if (!out) return true;  // a full disk: the beat is skipped, the last one stays
  }
  fs::rename(tmp, path_, ec);
  return true;
}

std::vector<RankBeat> read_heartbeats(const std::string& out_dir, int world) {
  std::vector<RankBeat> beats(world);
  const double now = unix_now();
  for (int r = 0; r < world; r++) {
    RankBeat& b = beats[r];
    b.rank = r;
    std::string text;
    if (!read_file(beat_file(heartbeat_dir(out_dir), r), &text).is_ok()) continue;
    const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("time") || !j["time"].is_number()) continue;
    b.present = true;
    b.host = j.value("host", "");
    b.state = j.value("state", "");
    b.pid = j.value("pid", (int64_t)0);
    b.step = j.value("step", (int64_t)0);
    b.op = j.value("op", "");
    b.axis = j.value("axis", "");
    b.waited_s = j.value("waited_s", 0.0);
    b.age_s = std::max(0.0, now - j["time"].get<double>());
  }
  return beats;
}

int rank_behind(const std::vector<RankBeat>& beats, double stale_s) {
  const RankBeat* oldest = nullptr;  // the stalest of the stale (or missing) ranks
  const RankBeat* idle = nullptr;    // alive, not in a collective
  const RankBeat* lowest = nullptr;  // the lowest step among the live ranks
  int64_t highest = INT64_MIN;
  bool someone_waits = false;
  for (const RankBeat& b : beats) {
    if (b.present && b.state == "finished") continue;
    if (!b.present || b.age_s > stale_s) {
      if (!oldest || (oldest->present && (!b.present || b.age_s > oldest->age_s))) oldest = &b;
      continue;
    }
    if (b.op.empty()) {
      if (!idle) idle = &b;
    } else {
      someone_waits = true;
    }
    if (!lowest || b.step < lowest->step) lowest = &b;
    highest = std::max(highest, b.step);
  }
  if (oldest) return oldest->rank;
  if (idle && someone_waits) return idle->rank;
  if (lowest && lowest->step < highest) return lowest->rank;
  return -1;
}

std::string list_heartbeats(const std::vector<RankBeat>& beats, const std::string& indent) {
  std::string out;
  for (const RankBeat& b : beats) {
    out += indent + "rank " + std::to_string(b.rank) + (b.host.empty() ? "" : " on " + b.host) + ": ";
    if (!b.present) {
      out += "no heartbeat file\n";
      continue;
    }
    out += "step " + std::to_string(b.step) + ", " + seconds_text(b.age_s) + " ago, ";
    if (b.state != "running") out += b.state;
    else if (b.op.empty()) out += "running, not in a collective";
    else out += "waiting in " + b.op + " on " + b.axis + " for " + seconds_text(b.waited_s);
    out += "\n";
  }
  if (!out.empty()) out.pop_back();
  return out;
}

std::string diagnose_ranks(const std::vector<RankBeat>& beats, int me, double stale_s) {
  // Ranks in the same state on the same host, in order of first appearance.
  struct SameState {
    std::string state, host;
    std::vector<int> ranks;
    double newest_s = 1e300, oldest_s = 0;  // the ages of their beats
  };
  std::vector<SameState> groups;
  std::vector<int> stale, idle;
  std::map<std::string, int> ops;
  int64_t low = INT64_MAX, high = INT64_MIN;  // the live waiting ranks' steps
  for (const RankBeat& b : beats) {
    const std::string state = state_text(b, stale_s);
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const SameState& g) { return g.state == state && g.host == b.host; });
    if (it == groups.end()) it = groups.insert(groups.end(), {state, b.host, {}});
    it->ranks.push_back(b.rank);
    if (b.present) it->newest_s = std::min(it->newest_s, b.age_s), it->oldest_s = std::max(it->oldest_s, b.age_s);
    if (b.present && !b.op.empty() && b.age_s <= stale_s) {
      ops[b.op + " on " + b.axis]++;
      low = std::min(low, b.step), high = std::max(high, b.step);
    }
    if (b.rank == me) continue;
    if (!b.present || (b.state != "finished" && b.age_s > stale_s)) stale.push_back(b.rank);
    else if (b.state == "running" && b.op.empty()) idle.push_back(b.rank);
  }
  std::string out = "the ranks' last heartbeats:";
  for (const SameState& g : groups) {
    out += "\n  rank" + std::string(g.ranks.size() > 1 ? "s " : " ") + rank_list(g.ranks) +
           (g.host.empty() ? "" : " on " + g.host) + ": " + g.state;
    if (g.oldest_s > 0 && g.state.find("silent") == std::string::npos) {  // a silent rank's line has its age
      const bool one = g.oldest_s - g.newest_s < 0.05;
      out += " (beat " + (one ? "" : seconds_text(g.newest_s) + " to ") + seconds_text(g.oldest_s) + " ago)";
    }
  }
  auto hosts_of = [&](const std::vector<int>& ranks) {
    std::string h;
    for (int r : ranks)
      if (!beats[r].host.empty() && h.find(beats[r].host) == std::string::npos)
        h += (h.empty() ? "" : ", ") + beats[r].host;
    return h.empty() ? std::string() : " (host " + h + ")";
  };
  if (!stale.empty())
    out += "\nat fault: rank" + std::string(stale.size() > 1 ? "s " : " ") + rank_list(stale) + hosts_of(stale) +
           ", whose heartbeat stopped: the process died or its host went down";
  else if (!idle.empty())
    out += "\nat fault: rank" + std::string(idle.size() > 1 ? "s " : " ") + rank_list(idle) + hosts_of(idle) +
           ", alive but not in the collective the others wait in (stuck in computation, or a bug that "
           "skipped the call)";
  else if (low < high) {
    std::vector<int> behind;
    for (const RankBeat& b : beats)
      if (b.present && !b.op.empty() && b.age_s <= stale_s && b.step == low) behind.push_back(b.rank);
    out += "\nat fault: rank" + std::string(behind.size() > 1 ? "s " : " ") + rank_list(behind) + hosts_of(behind) +
           ", behind at step " + std::to_string(low) + " while others are at step " + std::to_string(high) +
           ": its collective of that step has not finished (its link lost the last messages, or the ranks "
           "called their collectives in a different order)";
  } else
    // A ring collective lets some ranks finish it and wait in the next one while their
    // peers still wait for its last messages: different operations do not mean a mismatch.
    out += "\nat fault: the network: every rank is alive and waiting for communication, so their messages do not "
           "arrive (a link down or a partition between hosts" + std::string(ops.size() > 1 ? ", or collectives "
           "called in a different order on different ranks" : "") + ")";
  return out;
}

}  // namespace meshtrain::train
