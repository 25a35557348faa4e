// Timeline spans of one rank, written as a Chrome trace (JSON that Perfetto and
// chrome://tracing open), and the merge of every rank's file into one.
//
// Trace format. Each rank is a process (pid = world rank, named "rank N") with two threads,
// its lanes: tid 0 "compute" (the training thread) and tid 1 "comm" (the communication
// thread). Every span is a complete event ("ph": "X", ts and dur in microseconds of
// std::chrono::steady_clock, which all ranks of one machine share, so merged files line up).
// Categories ("cat"), and the args each carries:
//   forward, backward   compute lane; {"step": k, "mb": micro-batch, "chunk": c}
//   optimizer           compute lane; {"step": k}
//   step                compute lane; the whole training step, {"step": k}
//   collective, p2p     comm lane; {"axis": "tp" | "dp" | "pp", "bytes": n} (a "step" arg is
//                       optional: spans without one are placed in a step by their time)
// Idle time is never recorded: it is what the spans leave uncovered. Names are free text
// for the viewer ("F3", "B3.1", "all_reduce dp"); analysis reads only cat and args.
#pragma once
#include <atomic>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace meshtrain::trace {

namespace category {
inline constexpr char kForward[] = "forward";
inline constexpr char kBackward[] = "backward";
inline constexpr char kBackwardWeight[] = "backward_weight";  // a zero-bubble schedule's W
inline constexpr char kOptimizer[] = "optimizer";
inline constexpr char kStep[] = "step";
inline constexpr char kCollective[] = "collective";
inline constexpr char kP2p[] = "p2p";
}  // namespace category

// The Chrome trace "tid" of a span.
enum class Lane { kCompute = 0, kComm = 1 };

struct SpanRecord {
  Lane lane = Lane::kCompute;
  std::string name;
  std::string category;
  double start_us = 0, end_us = 0;
  nlohmann::json args;  // null or an object
};

// One rank's spans as trace events: process and thread names, then one "X" event each.
nlohmann::json trace_events(int rank, const std::vector<SpanRecord>& spans);

// Writes {"traceEvents": events, "displayTimeUnit": "ms"} to `path` (fsynced).
Status write_trace(const std::string& path, const nlohmann::json& events);

// The traceEvents array of a trace file, in object form or the bare-array form Chrome also
// accepts. Errors name the file and what is wrong with it.
Status read_trace(const std::string& path, nlohmann::json* events);

// Concatenates the events of per-rank trace files (FILE.rank<N>) into one file `out`.
Status merge_rank_files(const std::vector<std::string>& parts, const std::string& out);

// The process-wide recorder. Off by default; while off, enabled() is one relaxed atomic
// load and Span does nothing, so hot paths can keep their spans in place. When building a
// span's name or args costs something, test enabled() first. Thread-safe: the compute and
// the communication thread record concurrently.
class Tracer {
 public:
  static Tracer& instance();

  // Starts recording, as process `rank` of the trace.
  void enable(int rank);
  void disable();
  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }
  int rank() const;

  static double now_us();

  // Records a finished span; does nothing while disabled.
  void record(Lane lane, std::string name, const char* category, double start_us, double end_us,
              nlohmann::json args = {});
  void clear();
  std::vector<SpanRecord> spans() const;  // a copy, in recording order

  // This rank's spans as a Chrome trace file.
  Status write(const std::string& path) const;

  // Records [construction, destruction) on the process-wide tracer.
  class Span {
   public:
    Span(Lane lane, std::string name, const char* category, nlohmann::json args = {});
    ~Span();
    Span(const Span&) = delete;
    Span& operator=(const Span&) = delete;

   private:
    bool active_;
    Lane lane_;
    std::string name_;
    const char* category_;
    nlohmann::json args_;
    double start_us_ = 0;
  };

 private:
  std::atomic<bool> enabled_{false};
  mutable std::mutex mutex_;
  int rank_ = 0;
  std::vector<SpanRecord> spans_;
};

}  // namespace meshtrain::trace
