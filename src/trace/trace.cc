#include "trace/trace.h"

#include <chrono>

#include "core/file_io.h"

namespace meshtrain::trace {
namespace {

using nlohmann::json;

json metadata(const char* what, int pid, int tid, const std::string& name) {
  return {{"name", what}, {"ph", "M"}, {"pid", pid}, {"tid", tid}, {"args", {{"name", name}}}};
}

}  // namespace

json trace_events(int rank, const std::vector<SpanRecord>& spans) {
  json events = json::array();
  events.push_back(metadata("process_name", rank, 0, "rank " + std::to_string(rank)));
  events.push_back(metadata("thread_name", rank, static_cast<int>(Lane::kCompute), "compute"));
  events.push_back(metadata("thread_name", rank, static_cast<int>(Lane::kComm), "comm"));
  // Viewers order processes by name otherwise, which puts "rank 10" before "rank 2".
  events.push_back({{"name", "process_sort_index"}, {"ph", "M"}, {"pid", rank}, {"args", {{"sort_index", rank}}}});
  for (const SpanRecord& s : spans) {
    json e = {{"name", s.name},
              {"cat", s.category},
              {"ph", "X"},
              {"ts", s.start_us},
              {"dur", s.end_us - s.start_us},
              {"pid", rank},
              {"tid", static_cast<int>(s.lane)}};
    if (s.args.is_object()) e["args"] = s.args;
    events.push_back(std::move(e));
  }
  return events;
}

Status write_trace(const std::string& path, const json& events) {
  std::string text = json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump();
  text += '\n';
  return write_file_synced(path, text.data(), text.size()).with_context("writing trace " + path);
}

Status read_trace(const std::string& path, json* events) {
  std::string text;
  RETURN_IF_ERROR(read_file(path, &text).with_context("reading trace " + path));
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::error("trace " + path + " is not valid JSON");
  if (j.is_object() && j.contains("traceEvents")) j = j["traceEvents"];
  if (!j.is_array()) return Status::error("trace " + path + " has no traceEvents array");
  *events = std::move(j);
  return Status::ok();
}

Status merge_rank_files(const std::vector<std::string>& parts, const std::string& out) {
  json merged = json::array();
  for (const std::string& part : parts) {
    json events;
    RETURN_IF_ERROR(read_trace(part, &events));
    for (json& e : events) merged.push_back(std::move(e));
  }
  return write_trace(out, merged);
}

Tracer& Tracer::instance() {
  static Tracer tracer;
  return tracer;
}

void Tracer::enable(int rank) {
  std::lock_guard<std::mutex> lock(mutex_);
  rank_ = rank;
  enabled_.store(true, std::memory_order_relaxed);
}

void Tracer::disable() { enabled_.store(false, std::memory_order_relaxed); }

int Tracer::rank() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return rank_;
}

double Tracer::now_us() {
  auto t = std::chrono::steady_clock::now().time_since_epoch();
  return std::chrono::duration<double, std::micro>(t).count();
}

void Tracer::record(Lane lane, std::string name, const char* category, double start_us, double end_us,
                    json args) {
  if (!enabled()) return;
  std::lock_guard<std::mutex> lock(mutex_);
  spans_.push_back({lane, std::move(name), category, start_us, end_us, std::move(args)});
}

void Tracer::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  spans_.clear();
}

std::vector<SpanRecord> Tracer::spans() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return spans_;
}

Status Tracer::write(const std::string& path) const {
  json events;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    events = trace_events(rank_, spans_);
  }
  return write_trace(path, events);
}

Tracer::Span::Span(Lane lane, std::string name, const char* category, json args)
    : active_(Tracer::instance().enabled()), lane_(lane), category_(category) {
  if (!active_) return;
  name_ = std::move(name);
  args_ = std::move(args);
  start_us_ = now_us();
}

Tracer::Span::~Span() {
  if (!active_) return;
  Tracer::instance().record(lane_, std::move(name_), category_, start_us_, now_us(), std::move(args_));
}

}  // namespace meshtrain::trace
