// run_training: the training loop, phase by phase. prepare builds the run (setup.cc) and
// its reporter; each step runs step, report, evaluate and save; finish ends the run. What
// the run tells anyone goes through the reporter (reporter.h), never printed from here.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>

#include "checkpoint/checkpoint.h"
#include "machine/peak.h"
#include "train/debug_hooks.h"
#include "train/heartbeat.h"
#include "train/interrupt.h"
#include "train/run.h"
#include "train/subscribers.h"

namespace meshtrain::train {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

// The watchdog's report (comm::set_timeout_report): what every rank's heartbeat says, and
// the checkpoint a resume would start from.
struct WatchdogContext {
  std::string out_dir;
  int rank = 0, world = 1;
  double stale_s = 0;
};
WatchdogContext g_watchdog;

std::string watchdog_report() {
  const WatchdogContext& w = g_watchdog;
  std::string text = diagnose_ranks(read_heartbeats(w.out_dir, w.world), w.rank, w.stale_s);
  std::string newest;
  if (checkpoint::find_latest_checkpoint(w.out_dir, &newest).is_ok())
    return text + "\nthe newest complete checkpoint is " + newest + " (--resume continues from it)";
  return text + "\nno checkpoint was saved yet";
}

// Every rank of a run with an out folder beats (heartbeat.h), and a collective that times
// out reports what the beats say.
std::unique_ptr<Heartbeat> start_flight_recorder(const TrainOptions& o, comm::Group& world) {
  if (o.out_dir.empty()) return nullptr;
  const double interval = heartbeat_interval(o.comm_timeout);
  g_watchdog = {o.out_dir, world.rank(), world.size(), stale_after(interval)};
  comm::set_timeout_report(&watchdog_report);
  return std::make_unique<Heartbeat>(o.out_dir, world.rank(), interval);
}

// Step k's learning rate: by steps, or with --lr-unit tokens by the tokens trained before it
// (`done`) and in it (`now`), the warmup lasting warmup_steps full-length steps' tokens.
float step_learning_rate(const TrainOptions& o, LrUnit unit, const BatchShape& shape, int64_t k, int64_t done,
                         int64_t now, int64_t total) {
  if (unit == LrUnit::kSteps) return optim::learning_rate(o.adamw, (int)k, o.steps);
  const double warmup = (double)o.adamw.warmup_steps * shape.G() * shape.T;
  return optim::learning_rate_by_tokens(o.adamw, (double)done, (double)now, warmup, (double)total);
}

// What one step left for its report.
struct StepOutcome {
  StepResult result;
  BatchShape shape;    // this step's (a curriculum's row length in L)
  int64_t tokens = 0;  // trained in this step
  double seconds = 0;
};

class Training {
 public:
  Training(comm::Group& world, const Console& console, TrainResult& result)
      : world_(world), console_(console), res_(result) {}
  Status prepare(const TrainOptions& options, RunSubscriber* subscriber);
  int64_t first_step() const { return run_.start_step; }
  int64_t steps() const { return run_.opt.steps; }
  // Collective: a signal any rank received, or a subscriber's stop (kStopRequested), or 0.
  int agreed_stop() { return train::agreed_stop(world_, reporter_.stop_requested()); }
  Status stop(int64_t k, int why);
  Status step(int64_t k, StepOutcome* out);
  Status report(int64_t k, const StepOutcome& s);
  Status evaluate(int64_t k);
  Status save(int64_t k);
  Status finish();

 private:
  json record(int64_t k, const StepOutcome& s, const StepReport& r, bool peak_raised, json* moe);

  comm::Group& world_;
  const Console& console_;
  TrainResult& res_;
  Run run_;
  std::unique_ptr<Heartbeat> heartbeat_;  // after run_: it stops (and records how) first
  Reporter reporter_;
  std::unique_ptr<StepHooks> hooks_;  // testing aids (debug_hooks.h), usually none
  bool quiet_ = true;                 // this rank prints nothing
  // Tokens trained so far and in the whole run (rows cut short by a curriculum count as
  // their length): the metrics' "tokens" and, with --lr-unit tokens, the LR schedule's clock.
  int64_t tokens_done_ = 0, tokens_total_ = 0;
  int64_t saved_step_ = 0;      // the newest checkpoint's step (start_step: none, or the resumed one)
  int64_t skipped_in_row_ = 0;  // --on-nonfinite skip: consecutive skipped steps
  json last_pipeline_;
  Clock::time_point started_;
};

Status Training::prepare(const TrainOptions& options, RunSubscriber* subscriber) {
  // Beating from the moment the run folder is this job's (guard_run_folder): a rank stuck
  // in setup (loading a checkpoint) is seen too.
  if (Status s = train::prepare(options, world_, &run_, [&] { heartbeat_ = start_flight_recorder(options, world_); });
      !s.is_ok()) {
    heartbeat_.reset();
    // A run that fails its setup leaves no folder behind, as before it had one.
    std::error_code ec;
    if (run_.created_folder && run_.is_main) fs::remove_all(options.out_dir, ec);
    return s;
  }
  const TrainOptions& o = run_.opt;
  run_.hosts = gather_host_names(world_);
  auto metrics = std::make_unique<MetricsSubscriber>();
  if (run_.is_main && !o.out_dir.empty())
    RETURN_IF_ERROR(metrics->open((fs::path(o.out_dir) / "metrics.jsonl").string(), o.resume ? run_.start_step : -1));
  quiet_ = o.quiet || !run_.is_main;
  hooks_ = debug_hooks(o, world_.rank(), run_.scaler != nullptr);
  tokens_done_ = run_.curriculum.tokens_before(run_.start_step, run_.shape.G());
  tokens_total_ = run_.curriculum.tokens_before(o.steps, run_.shape.G());
  saved_step_ = run_.start_step;
  reporter_.own(std::make_unique<TraceSubscriber>(run_, world_, o.trace_file));
  if (o.profile) reporter_.own(std::make_unique<ProfileSubscriber>(run_, metrics.get(), console_, quiet_));
  reporter_.own(std::move(metrics));
  reporter_.own(std::make_unique<ConsoleSubscriber>(console_, quiet_));
  if (subscriber) reporter_.subscribe(subscriber);
  reporter_.start({run_.start_step, o.steps, quiet_ ? std::vector<std::string>{} : banner_lines(run_)});
  started_ = Clock::now();
  return Status::ok();
}

Status Training::stop(int64_t k, int why) {
  if (why == kStopRequested) {
    // A subscriber asked: the run ends as if it had been given k steps, quietly.
    res_.stopped_by_request = true;
    RETURN_IF_ERROR(finish_run_save(run_, world_, /*wait=*/true));
    if (!run_.opt.out_dir.empty() && k > saved_step_) RETURN_IF_ERROR(save_run_checkpoint(run_, world_, k));
  } else {
    res_.interrupted_by = why;
    RETURN_IF_ERROR(stop_on_signal(run_, world_, k, saved_step_, why, console_));
  }
  if (heartbeat_) heartbeat_->finish_as("interrupted");
  return Status::ok();
}

Status Training::step(int64_t k, StepOutcome* out) {
  const TrainOptions& o = run_.opt;
  comm::set_current_step(k + 1);
  if (hooks_) hooks_->before_step(k);
  run_.mesh->reset_stats();
  run_.gpt->reset_flops();
  run_.gpt->reset_moe_stats();
  run_.gpt->reset_cp_balance();
  const auto t0 = Clock::now();
  reporter_.step_begin(k + 1);
  out->shape = run_.shape;
  out->shape.L = run_.curriculum.length(k);
  out->tokens = (int64_t)run_.shape.G() * out->shape.L;
  const float lr = step_learning_rate(o, run_.policy.lr_unit, run_.shape, k, tokens_done_, out->tokens, tokens_total_);
  const StepResult& r = out->result =
      train_step(*run_.gpt, *run_.dp, run_.mesh->dp(), o.adamw, run_.train_data, out->shape, k, lr,
                 run_.pipeline.get(), run_.scaler.get(), run_.scaler ? nullptr : &run_.nonfinite, k + 1 < o.steps,
                 hooks_.get());
  tokens_done_ += out->tokens;
  if (std::string newest; !r.status.is_ok() && !r.nonfinite.empty() && !o.out_dir.empty() &&
                          checkpoint::find_latest_checkpoint(o.out_dir, &newest).is_ok())
    return Status::error(r.status.message() + "; the newest checkpoint is " + newest);
  RETURN_IF_ERROR(r.status);
  out->seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  reporter_.step_end(k + 1);
  return Status::ok();
}

Status Training::report(int64_t k, const StepOutcome& s) {
  const TrainOptions& o = run_.opt;
  const StepResult& r = s.result;
  StepReport rep;
  rep.step = k + 1, rep.total_steps = o.steps;
  rep.loss = r.loss, rep.lr = r.lr, rep.grad_norm = r.grad_norm;
  rep.step_s = s.seconds, rep.tokens_per_s = s.tokens / s.seconds;
  // MFU per rank: the step's model FLOPs spread over every rank's peak. A rank that beat
  // its peak shows the peak stale; it is measured again and raised (machine/peak.h).
  bool peak_raised = false;
  const double flops_per_token = run_.gpt->flops_per_token(s.shape.L);  // at this step's length
  rep.mfu = machine::honest_mfu(rep.tokens_per_s * flops_per_token / world_.size() / 1e9, &run_.peak_gflops,
                                run_.threads, run_.layout.precision, o.peak_gflops <= 0, &peak_raised);
  if (peak_raised)
    reporter_.note("note: this step ran above the cached GEMM peak (measured on a busy machine?); "
                   "the peak was measured again and is now " + std::to_string((int)run_.peak_gflops) + " GFLOP/s");
  if (!r.nonfinite.empty())
    reporter_.note("step " + std::to_string(k + 1) + ": " + r.nonfinite + "; skipped (--on-nonfinite skip)");
  skipped_in_row_ = r.nonfinite.empty() ? 0 : skipped_in_row_ + 1;
  if (skipped_in_row_ >= o.max_skipped_steps) return too_many_skips(run_, k + 1, skipped_in_row_, r.nonfinite);
  if (!std::isfinite(r.loss) && r.nonfinite.empty())
    return Status::error("loss is " + std::to_string(r.loss) + " at step " + std::to_string(k + 1) +
                         " (diverged; try a lower --lr)");
  res_.losses.push_back(r.loss);
  res_.grad_norms.push_back((float)r.grad_norm);
  json moe;
  rep.record = record(k, s, rep, peak_raised, &moe);
  // The step line's MoE part, and a curriculum's length.
  if (run_.curriculum.on()) rep.console_extra = " | T " + std::to_string(s.shape.L);
  if (moe.contains("moe")) {
    char text[96];
    const json& m = moe["moe"];
    std::snprintf(text, sizeof text, " | aux %.4f | experts cv %.2f | drop %.1f%%", m["aux_loss"].get<double>(),
                  m["tokens_per_expert"]["cv"].get<double>(), 100 * m["dropped_fraction"].get<double>());
    rep.console_extra += text;
  }
  reporter_.step(rep);
  return Status::ok();
}

// Step k's metrics.jsonl line. Collective (the pipeline's bubble, the straggler, the MoE
// routing over the job); `moe` gets the routing part.
json Training::record(int64_t k, const StepOutcome& s, const StepReport& r, bool peak_raised, json* moe) {
  json pipeline = pipeline_json(run_);
  last_pipeline_ = pipeline;
  double wait_ms = 0, busy_ms = 0;
  json comm = comm_json(run_.mesh->stats(), &wait_ms, &busy_ms);
  const double hidden = busy_ms > 0 ? std::clamp(1.0 - wait_ms / busy_ms, 0.0, 1.0) : 0.0;
  const auto& flops = run_.gpt->flops();
  json record = {{"step", k + 1}, {"loss", r.loss}, {"lr", r.lr}, {"grad_norm", r.grad_norm},
                 {"tokens", tokens_done_}, {"seq_len", s.shape.L}, {"step_ms", s.seconds * 1e3},
                 {"tokens_per_s", r.tokens_per_s}, {"mfu", r.mfu}, {"peak_gflops", run_.peak_gflops},
                 {"mem", memory_json(MemoryTracker::instance().stats())},
                 {"peak_rss", peak_rss_bytes()}, {"comm", comm},
                 {"comm_time", comm_time_json(run_.mesh->stats())},
                 {"comm_ms", wait_ms}, {"comm_busy_ms", busy_ms}, {"comm_hidden", hidden},
                 // This rank's executed block FLOPs; recompute_fraction = recomputed forward
                 // work over one forward of the blocks (full recomputation: ~1).
                 {"block_flops", flops.model},
                 {"recompute_flops", flops.recompute},
                 {"recompute_fraction", flops.recompute / (flops.model / 3.0)}};
  record.update(pipeline);
  if (const model::Gpt::CpBalance& b = run_.gpt->cp_balance(); b.used > 0)  // cp with a document mask
    record["cp_balance"] = {{"imbalance", b.used}, {"causal_imbalance", b.causal}};
  record.update(straggler_json(run_, world_, s.seconds, wait_ms / 1e3, run_.mesh->stats()));
  const MoeJobStats moe_stats = moe_job_stats(run_, world_);
  if (!s.result.skipped) update_expert_biases(run_, moe_stats);  // for the next step's routing
  *moe = moe_json(run_, moe_stats);
  record.update(*moe);
  if (peak_raised) record["peak_raised"] = true;
  if (run_.train_data.is_mixture()) {
    // The share of each source in the rows of steps 1..k+1: what the mixture really read.
    const std::vector<double> shares = run_.train_data.realised_shares(k + 1, run_.shape.G());
    for (size_t d = 0; d < shares.size(); d++) record["data_mix"][run_.train_data.source_names()[d]] = shares[d];
  }
  if (optim::ShardStore& store = run_.dp->store(); store.any_in_file(~0u)) record["offload"] = offload_json(store);
  if (run_.scaler)
    record.update({{"loss_scale", s.result.loss_scale}, {"step_skipped", s.result.skipped},
                   {"skipped_steps", run_.scaler->skipped_steps()}});
  if (!s.result.nonfinite.empty())
    record.update({{"step_skipped", true}, {"skipped_steps", run_.nonfinite.skipped}, {"nonfinite", s.result.nonfinite}});
  return record;
}

Status Training::evaluate(int64_t k) {
  const TrainOptions& o = run_.opt;
  const bool last = k + 1 == o.steps;
  if (!run_.has_val || !((o.eval_every > 0 && (k + 1) % o.eval_every == 0) || last)) return Status::ok();
  // Every rank evaluates the same batches (ZeRO-3 forwards are collective).
  const float val = evaluate_loss(*run_.gpt, run_.val_data, run_.shape.B, run_.shape.T, o.eval_batches,
                                  run_.pipeline.get());
  res_.final_val_loss = val;
  reporter_.eval({k + 1, val, {{"step", k + 1}, {"val_loss", val}, {"tokens", tokens_done_}}});
  return Status::ok();
}

Status Training::save(int64_t k) {
  const TrainOptions& o = run_.opt;
  const bool last = k + 1 == o.steps;
  // The final step is always saved when there is a run folder (export/generate read it),
  // and at once: the run's last checkpoint is complete when it returns.
  const bool save = !o.out_dir.empty() && ((o.save_every > 0 && (k + 1) % o.save_every == 0) || last);
  RETURN_IF_ERROR(finish_run_save(run_, world_, /*wait=*/save));
  if (!save) return Status::ok();
  RETURN_IF_ERROR(save_run_checkpoint(run_, world_, k + 1, o.async_save && !last));
  saved_step_ = k + 1;
  return Status::ok();
}

Status Training::finish() {
  const TrainOptions& o = run_.opt;
  RETURN_IF_ERROR(finish_run_save(run_, world_, /*wait=*/true));
  RETURN_IF_ERROR(reporter_.finish());
  EndReport end;
  if (!o.quiet && world_.size() > 1) end.summary = summary_lines(run_, world_, last_pipeline_);
  if (!quiet_) end.closing = run_end_lines(run_, res_, std::chrono::duration<double>(Clock::now() - started_).count());
  reporter_.end(end);
  if (heartbeat_) heartbeat_->finish(true);
  return Status::ok();
}

}  // namespace

Status run_training(const TrainOptions& options, comm::Group& world, const Console& console, TrainResult* result,
                    RunSubscriber* subscriber) {
  TrainResult local;
  Training run(world, console, result ? *result : local);
  RETURN_IF_ERROR(run.prepare(options, subscriber));
  for (int64_t k = run.first_step(); k < run.steps(); k++) {
    // Every rank looks at the signals (and at a subscriber's stop) here, between steps, and
    // stops after the same step.
    if (const int why = run.agreed_stop(); why != 0) return run.stop(k, why);
    StepOutcome step;
    RETURN_IF_ERROR(run.step(k, &step));
    RETURN_IF_ERROR(run.report(k, step));
    RETURN_IF_ERROR(run.evaluate(k));
    RETURN_IF_ERROR(run.save(k));
  }
  return run.finish();
}

}  // namespace meshtrain::train
