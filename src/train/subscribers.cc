#include "train/subscribers.h"

#include <cstdio>

#include "core/profile.h"
#include "machine/peak.h"
#include "train/run.h"
#include "train/step_profile.h"

namespace meshtrain::train {

void ConsoleSubscriber::on_start(const StartReport& r) {
  if (!quiet_)
    for (const std::string& line : r.banner) console_.line(line);
  progress_.emplace(console_, r.first_step, r.total_steps, quiet_);
}

void ConsoleSubscriber::on_note(const std::string& line) { progress_->message(line); }

Reply ConsoleSubscriber::on_step(const StepReport& r) {
  progress_->step(r.step - 1, r.loss, r.lr, r.grad_norm, r.step_s, r.tokens_per_s, r.mfu, r.console_extra);
  return Reply::kContinue;
}

void ConsoleSubscriber::on_eval(const EvalReport& r) {
  char line[96];
  std::snprintf(line, sizeof line, "step %5lld | val loss %.4f", (long long)r.step, r.val_loss);
  progress_->message(line);
}

void ConsoleSubscriber::on_end(const EndReport& r) {
  if (quiet_ || (r.summary.empty() && r.closing.empty())) return;
  for (const std::string& line : r.summary) console_.line(line);
  for (const std::string& line : r.closing) console_.line(line);
  console_.flush();
}

Reply MetricsSubscriber::on_step(const StepReport& r) {
  writer_.write(r.record);
  return Reply::kContinue;
}

void MetricsSubscriber::on_eval(const EvalReport& r) { writer_.write(r.record); }

// Recording only from a step's beginning to its end: evaluations and saves stay out.
void ProfileSubscriber::on_step_begin(int64_t step) {
  if (step == first_) profile::reset();
  if (step >= first_) profile::set_enabled(true);
}

void ProfileSubscriber::on_step_end(int64_t /*step*/) { profile::set_enabled(false); }

Reply ProfileSubscriber::on_step(const StepReport& r) {
  if (r.step >= first_) steps_++, seconds_ += r.step_s;
  return Reply::kContinue;
}

Status ProfileSubscriber::on_finish() {
  profile::set_enabled(false);
  if (steps_ == 0 || !run_.is_main) return Status::ok();  // (the triad: 384 MiB, measured once)
  const profile::Profile recorded = profile::snapshot();
  const ProfilePeaks peaks{run_.peak_gflops, machine::measure_triad_gbps(run_.threads)};
  const double step_s = seconds_ / steps_;
  metrics_->write({{"profile", profile_json(recorded, steps_, step_s, peaks)}});
  if (!quiet_) console_.out(profile_table(recorded, steps_, step_s, peaks));
  return Status::ok();
}

namespace {

// The step span's args: the step, and under a pipeline what `meshtrain timeline` needs to
// explain its bubble (the schedule and the rank's place in it).
nlohmann::json step_trace_args(const Run& run, int64_t step) {
  nlohmann::json args = {{"step", step}};
  if (run.pipeline)
    args["pipeline"] = {{"schedule", parallel::pp::schedule_name(run.layout.schedule)}, {"pp", run.mesh_shape.pp},
                        {"pp_rank", run.mesh->pp_rank()}, {"micro_batches", run.shape.A},
                        {"virtual_stages", run.layout.chunks()}};
  return args;
}

}  // namespace

void TraceSubscriber::on_step_begin(int64_t step) {
  if (trace::Tracer::instance().enabled())
    span_.emplace(trace::Lane::kCompute, "step " + std::to_string(step), trace::category::kStep,
                  step_trace_args(run_, step));
}

Status TraceSubscriber::on_finish() {
  if (file_.empty()) return Status::ok();
  return agree(world_, write_trace(file_, world_));
}

}  // namespace meshtrain::train
