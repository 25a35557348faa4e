// What a training run reports, and who listens. The loop hands each event to one Reporter;
// subscribers turn it into the console's lines and the live progress display, metrics.jsonl,
// the trace, or (a caller of run_training) anything else. A Reporter and its subscribers
// live on every rank: each subscriber decides what its rank writes (the built-in ones
// write on world rank 0, and the trace on every rank).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace meshtrain::train {

// Before the first step.
struct StartReport {
  int64_t first_step = 0;  // 0-based: the steps run are first_step + 1 .. total_steps
  int64_t total_steps = 0;
  std::vector<std::string> banner;  // what the run is: model, machine, data, resume, layout notes
};

// One optimizer step, after it ran. `record` is exactly its metrics.jsonl line; the rest is
// what the console's line needs beside it.
struct StepReport {
  int64_t step = 0;  // 1-based
  int64_t total_steps = 0;
  float loss = 0, lr = 0;
  double grad_norm = 0, step_s = 0, tokens_per_s = 0, mfu = 0;
  std::string console_extra;       // after MFU on the line: a curriculum's length, MoE routing
  std::vector<std::string> notes;  // lines that stay on screen before it (a raised peak, a skip)
  nlohmann::json record;
};

// A validation pass after step `step`; `record` is its metrics.jsonl line.
struct EvalReport {
  int64_t step = 0;
  float val_loss = 0;
  nlohmann::json record;
};

// After the last step, once the run's collective reports are in.
struct EndReport {
  std::vector<std::string> summary;  // every rank's peak memory, the pipeline's bubble (multi-rank runs)
  std::vector<std::string> closing;  // final loss, wall time, the checkpoint, how to continue
};

// What a subscriber answers to a step. kStop asks the run to stop: every rank agrees at
// the next step boundary (with the signals of interrupt.h, which win over a request), and
// the run ends there without error, saving the last step when it has a run folder and it
// is not saved yet; TrainResult::stopped_by_request says so. Later steps' events do not come.
enum class Reply { kContinue, kStop };

// Events arrive in this order, on the thread that runs the loop: on_start; per step
// on_step_begin, on_step_end (its computation done, before its record is assembled), any
// on_note, on_step, and on_eval when it evaluates; after the last step on_finish then on_end. A run
// that stops early or fails sends neither on_finish nor on_end.
class RunSubscriber {
 public:
  virtual ~RunSubscriber() = default;
  virtual void on_start(const StartReport&) {}
  virtual void on_step_begin(int64_t /*step*/) {}
  virtual void on_step_end(int64_t /*step*/) {}
  // A line for the console that stays on screen (a raised GEMM peak, a skipped step): sent
  // during a step, before its record, and also when the step then fails the run.
  virtual void on_note(const std::string& /*line*/) {}
  virtual Reply on_step(const StepReport&) { return Reply::kContinue; }
  virtual void on_eval(const EvalReport&) {}
  // Every rank's subscribers are called here, at the same point of the run, so a subscriber
  // may communicate over the world (the trace merges its rank files); an error fails the run.
  virtual Status on_finish() { return Status::ok(); }
  virtual void on_end(const EndReport&) {}
};

// Hands each event to its subscribers in the order they subscribed.
class Reporter {
 public:
  void subscribe(RunSubscriber* subscriber) { subscribers_.push_back(subscriber); }  // not owned
  void own(std::unique_ptr<RunSubscriber> subscriber);  // kept for the reporter's life, and subscribed

  void start(const StartReport& r);
  void step_begin(int64_t step);
  void step_end(int64_t step);
  void note(const std::string& line);
  void step(const StepReport& r);
  void eval(const EvalReport& r);
  Status finish();
  void end(const EndReport& r);
  // Some subscriber answered kStop to a step (this rank's; the loop agrees over the world).
  bool stop_requested() const { return stop_requested_; }

 private:
  std::vector<RunSubscriber*> subscribers_;
  std::vector<std::unique_ptr<RunSubscriber>> owned_;
  bool stop_requested_ = false;
};

}  // namespace meshtrain::train
