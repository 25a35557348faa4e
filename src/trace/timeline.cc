#include "trace/timeline.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>

namespace meshtrain::trace {
namespace {

using nlohmann::json;
constexpr double kInf = std::numeric_limits<double>::infinity();

// A complete ("X") event of the trace.
struct Event {
  int pid = 0, tid = 0;
  std::string category, name;
  double start_us = 0, end_us = 0;
  std::optional<int> step;
  int microbatch = -1, chunk = 0;
  json pipeline;  // a step span's args.pipeline (train --trace under --pp), null otherwise
};

std::optional<int> as_int(const json& object, const char* key) {
  auto it = object.find(key);
  if (it == object.end() || !it->is_number()) return std::nullopt;
  double v = it->get<double>();
  if (v != std::floor(v) || std::fabs(v) > 1e9) return std::nullopt;
  return static_cast<int>(v);
}

std::optional<double> as_number(const json& object, const char* key) {
  auto it = object.find(key);
  if (it == object.end() || !it->is_number()) return std::nullopt;
  double v = it->get<double>();
  return std::isfinite(v) ? std::optional(v) : std::nullopt;
}

std::string as_string(const json& object, const char* key) {
  auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : "";
}

// Other phases (metadata, instant and counter events) carry no span and are skipped; an
// "X" event without usable times or pid is an error, since dropping it would skew the bubble.
Status parse_events(const json& events, std::vector<Event>* out) {
  if (!events.is_array()) return Status::error("traceEvents is not an array");
  for (size_t i = 0; i < events.size(); ++i) {
    const json& e = events[i];
    if (!e.is_object() || as_string(e, "ph") != "X") continue;
    auto ts = as_number(e, "ts"), dur = as_number(e, "dur");
    auto pid = as_int(e, "pid");
    if (!ts || !dur || *dur < 0 || !pid) {
      return Status::error("trace event " + std::to_string(i) + " (\"" + as_string(e, "name") +
                           "\") needs numeric ts, dur >= 0 and an integer pid");
    }
    Event ev;
    ev.pid = *pid;
    ev.tid = as_int(e, "tid").value_or(0);
    ev.category = as_string(e, "cat");
    ev.name = as_string(e, "name");
    ev.start_us = *ts;
    ev.end_us = *ts + *dur;
    auto args = e.find("args");
    if (args != e.end() && args->is_object()) {
      ev.step = as_int(*args, "step");
      ev.microbatch = as_int(*args, "mb").value_or(-1);
      ev.chunk = std::max(0, as_int(*args, "chunk").value_or(0));
      if (auto p = args->find("pipeline"); p != args->end() && p->is_object()) ev.pipeline = *p;
    }
    out->push_back(std::move(ev));
  }
  return Status::ok();
}

// Forward and backward spans: what the step window and busy time are made of.
bool is_work(const Event& e) {
  return e.tid == static_cast<int>(Lane::kCompute) &&
         (e.category == category::kForward || e.category == category::kBackward ||
          e.category == category::kBackwardWeight);
}

std::string list_steps(const std::set<int>& steps) {
  std::string out;
  int shown = 0;
  for (int s : steps) {
    if (shown++ == 12) return out + ", ...";
    out += (out.empty() ? "" : ", ") + std::to_string(s);
  }
  return out;
}

// The event clipped to [origin, end] of the drawn range, in ms from its start.
Block to_block(const Event& e, double origin_us, double end_us) {
  Block b;
  b.lane = e.tid == static_cast<int>(Lane::kComm) ? Lane::kComm : Lane::kCompute;
  b.category = e.category;
  b.name = e.name;
  b.start_ms = (std::max(e.start_us, origin_us) - origin_us) / 1000;
  b.end_ms = (std::min(e.end_us, end_us) - origin_us) / 1000;
  b.microbatch = e.microbatch;
  b.chunk = e.chunk;
  return b;
}

}  // namespace

Status analyze(const json& events, std::optional<int> step, Timeline* out) {
  std::vector<Event> all;
  RETURN_IF_ERROR(parse_events(events, &all));
  std::set<int> steps, ranks;
  for (const Event& e : all) {
    if (!is_work(e)) continue;
    ranks.insert(e.pid);
    if (e.step) steps.insert(*e.step);
  }
  if (steps.empty()) return Status::error("the trace has no forward/backward spans with a step (args.step)");
  int k = step.value_or(*steps.rbegin());
  if (!steps.count(k)) {
    return Status::error("step " + std::to_string(k) + " is not in the trace (its steps: " + list_steps(steps) +
                         ")");
  }

  // The window: the step's forward and backward spans. The drawn range: every span tagged
  // with the step; untagged spans (communication) belong to it where they overlap it.
  double window_begin = kInf, window_end = -kInf, range_begin = kInf, range_end = -kInf;
  for (const Event& e : all) {
    if (e.step != k) continue;
    range_begin = std::min(range_begin, e.start_us);
    range_end = std::max(range_end, e.end_us);
    if (!is_work(e)) continue;
    window_begin = std::min(window_begin, e.start_us);
    window_end = std::max(window_end, e.end_us);
  }

  std::map<int, RankTimeline> by_rank;
  std::map<int, double> busy_us;
  for (int r : ranks) by_rank[r].rank = r;
  Timeline t;
  for (const Event& e : all) {
    bool in_step = e.step ? *e.step == k : e.end_us > range_begin && e.start_us < range_end;
    auto rank = by_rank.find(e.pid);
    if (in_step && e.category == category::kStep && rank != by_rank.end() && e.pipeline.is_object()) {
      rank->second.pp_rank = as_int(e.pipeline, "pp_rank").value_or(-1);
      t.pipeline = e.pipeline;
      t.pipeline.erase("pp_rank");
    }
    // A whole-step span would cover the blocks it contains; processes without compute are
    // not pipeline ranks.
    if (!in_step || e.category == category::kStep || rank == by_rank.end()) continue;
    Block b = to_block(e, range_begin, range_end);
    if (e.tid == static_cast<int>(Lane::kComm)) rank->second.comm.push_back(b);
    else if (e.tid == static_cast<int>(Lane::kCompute)) rank->second.compute.push_back(b);
    else continue;
    t.chunks = std::max(t.chunks, b.chunk + 1);
    if (is_work(e)) busy_us[e.pid] += e.end_us - e.start_us;
  }

  t.step = k;
  t.steps.assign(steps.begin(), steps.end());
  t.range_ms = (range_end - range_begin) / 1000;
  t.window_start_ms = (window_begin - range_begin) / 1000;
  t.window_end_ms = (window_end - range_begin) / 1000;
  // Busy and capacity are summed in the trace's microseconds: with whole-unit simulated
  // spans every term is an integer, so the fraction is exactly the schedule's ratio.
  double window_us = window_end - window_begin, total_busy_us = 0;
  auto by_start = [](const Block& a, const Block& b) { return a.start_ms < b.start_ms; };
  for (auto& [r, rt] : by_rank) {
    std::stable_sort(rt.compute.begin(), rt.compute.end(), by_start);
    std::stable_sort(rt.comm.begin(), rt.comm.end(), by_start);
    rt.busy_ms = busy_us[r] / 1000;
    rt.idle_ms = (window_us - busy_us[r]) / 1000;
    total_busy_us += busy_us[r];
    t.ranks.push_back(std::move(rt));
  }
  double capacity_us = static_cast<double>(t.ranks.size()) * window_us;
  t.bubble_fraction = capacity_us > 0 ? (capacity_us - total_busy_us) / capacity_us : 0;
  *out = std::move(t);
  return Status::ok();
}

Status read_timeline(const std::string& path, std::optional<int> step, Timeline* out) {
  json events;
  RETURN_IF_ERROR(read_trace(path, &events));
  return analyze(events, step, out).with_context(path);
}

}  // namespace meshtrain::trace
