// The run's built-in subscribers (reporter.h): the console (banner, step lines or the live
// progress line, notes, evaluations, the closing lines), metrics.jsonl, and the trace.
#pragma once
#include <memory>
#include <optional>
#include <string>

#include "comm/group.h"
#include "train/console.h"
#include "train/metrics.h"
#include "train/progress.h"
#include "train/reporter.h"
#include "trace/trace.h"

namespace meshtrain::train {

struct Run;

// Writes through `console` what the run says; nothing when `quiet` (--quiet, and every rank
// but world rank 0).
class ConsoleSubscriber : public RunSubscriber {
 public:
  ConsoleSubscriber(const Console& console, bool quiet) : console_(console), quiet_(quiet) {}
  void on_start(const StartReport& r) override;
  void on_note(const std::string& line) override;
  Reply on_step(const StepReport& r) override;
  void on_eval(const EvalReport& r) override;
  void on_end(const EndReport& r) override;

 private:
  const Console& console_;
  bool quiet_;
  std::optional<Progress> progress_;  // from on_start: it knows the first and last step
};

// metrics.jsonl: every step's and every evaluation's record (MetricsWriter); nothing before
// open() or with an empty path.
class MetricsSubscriber : public RunSubscriber {
 public:
  Status open(const std::string& path, int64_t resume_step) { return writer_.open(path, resume_step); }
  Reply on_step(const StepReport& r) override;
  void on_eval(const EvalReport& r) override;
  void write(const nlohmann::json& record) { writer_.write(record); }  // a record of another subscriber's

 private:
  MetricsWriter writer_;
};

// --profile: this rank's step profile (core/profile.h) over the steps after the run's first
// (all of them when it runs one), its table printed and written to metrics.jsonl (through
// `metrics`) once, at the end; the rates set against the run's GEMM peak and a STREAM triad
// measured then on the rank's threads.
class ProfileSubscriber : public RunSubscriber {
 public:
  ProfileSubscriber(const Run& run, MetricsSubscriber* metrics, const Console& console, bool quiet)
      : run_(run), metrics_(metrics), console_(console), quiet_(quiet) {}
  void on_start(const StartReport& r) override { first_ = r.first_step + (r.total_steps - r.first_step > 1 ? 2 : 1); }
  void on_step_begin(int64_t step) override;
  void on_step_end(int64_t step) override;
  Reply on_step(const StepReport& r) override;
  Status on_finish() override;

 private:
  const Run& run_;
  MetricsSubscriber* metrics_;
  const Console& console_;
  bool quiet_;
  int64_t first_ = 1;  // the first profiled step (1-based)
  int steps_ = 0;
  double seconds_ = 0;
};

// The trace (trace/trace.h): a span per step while tracing is on, and at the end every
// rank's trace merged into `file` (none when empty).
class TraceSubscriber : public RunSubscriber {
 public:
  TraceSubscriber(const Run& run, comm::Group& world, std::string file)
      : run_(run), world_(world), file_(std::move(file)) {}
  void on_step_begin(int64_t step) override;
  void on_step_end(int64_t step) override { span_.reset(); }
  Status on_finish() override;

 private:
  const Run& run_;
  comm::Group& world_;
  std::string file_;
  std::optional<trace::Tracer::Span> span_;
};

}  // namespace meshtrain::train
