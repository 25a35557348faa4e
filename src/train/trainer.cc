#include "train/trainer.h"

#include "data/training_data.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <thread>

#include "checkpoint/checkpoint.h"
#include "comm/self_group.h"
#include "core/cpu_info.h"
#include "machine/describe.h"
#include "machine/peak.h"
#include "train/heartbeat.h"
#include "train/interrupt.h"
#include "train/metrics.h"
#include "train/progress.h"
#include "train/run.h"
#include "trace/trace.h"

namespace meshtrain::train {

namespace fs = std::filesystem;
using nlohmann::json;

float evaluate_loss(model::Gpt& gpt, const data::TokenLoader& data, int B, int T, int batches,
                    parallel::pp::PipelineExecutor* pipeline) {
  // Evaluation runs without dropout.
  struct NoDropout {
    model::Gpt& g;
    float p;
    ~NoDropout() { g.set_dropout(p, 0); }
  } restore{gpt, gpt.dropout_probability()};
  gpt.set_dropout(0, 0);
  const int64_t n = std::min<int64_t>(batches, data.windows(B, T));
  std::vector<int> inputs((size_t)B * T), targets((size_t)B * T);
  double sum = 0;
  for (int64_t k = 0; k < n; k++) {
    data.fill(k, B, T, 0, B, inputs.data(), targets.data());
    sum += pipeline ? pipeline->forward_only(inputs.data(), targets.data(), B, T)
                    : gpt.forward(inputs.data(), targets.data(), B, T);
  }
  return (float)(sum / n);
}

namespace {

// What a non-finite step's report says: the loss and norm, and the units whose gradients
// hold a NaN or an infinity on any rank (one all-reduce over the world).
std::string describe_nonfinite(const model::GptConfig& c, parallel::DataParallel& dp, comm::Group& world,
                               float loss, double norm) {
  const int units = model::final_unit_id(c) + 1;
  std::vector<double> flags = dp.nonfinite_units(units);
  world.all_reduce_f64(flags.data(), flags.size(), comm::ReduceOp::kMax);
  std::vector<std::string> names;
  for (int u = 0; u < units; u++)
    if (flags[u] > 0) names.push_back(model::unit_name(c, u));
  char head[96];
  std::snprintf(head, sizeof head, "the loss is %g and the gradient norm %g", (double)loss, norm);
  std::string out = head;
  if (names.empty()) return out + " (every unit's gradient is finite)";
  out += "; not finite: the gradient of " + names[0];
  constexpr size_t kNamed = 4;
  for (size_t i = 1; i < std::min(names.size(), kNamed); i++) out += ", " + names[i];
  if (names.size() > kNamed) out += " and " + std::to_string(names.size() - kNamed) + " more units";
  return out;
}

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

}  // namespace

StepResult train_step(model::Gpt& gpt, parallel::DataParallel& dp, comm::Group& dp_group,
                      const optim::AdamWConfig& cfg, const data::TokenLoader& data,
                      const BatchShape& shape, int64_t k, float lr,
                      parallel::pp::PipelineExecutor* pipeline, optim::DynamicLossScaler* scaler,
                      NonfinitePolicy* nonfinite, bool more_steps) {
  // T places the rows (the data windows and the dropout positions); L is what is trained.
  const int B = shape.B, T = shape.T, L = shape.length(), G = shape.G();
  const double S = scaler ? scaler->scale() : 1.0;
  const float loss_scale = (float)(S / ((double)G * L));
  // Micro-batch a of this rank: rows first_row + a*B of the step's global batch.
  auto row = [&](int a) { return shape.first_row() + a * B; };
  dp.set_step(k);
  dp.begin_step(shape.A);
  double loss_sum = 0;  // sum of token losses over this rank's rows
  if (pipeline) {
    parallel::pp::MicroBatches mbs{
        [&](int a, int* inputs, int* targets) { data.fill(k, G, T, row(a), B, L, inputs, targets); },
        [&](int a) { return (int64_t)row(a) * T; }, nullptr};
    if (more_steps)  // 2bw's lists reach into the next step (same shape: no curriculum)
      mbs.fill_next = [&](int a, int* inputs, int* targets) { data.fill(k + 1, G, T, row(a), B, L, inputs, targets); };
    loss_sum = pipeline->train_step(shape.A, B, L, k, mbs, loss_scale, dp);
  } else {
    std::vector<int> inputs((size_t)B * L), targets((size_t)B * L);
    gpt.param_store()->use_weights(model::WeightVersion::kPrevious);  // a store with one version: the current
    for (int a = 0; a < shape.A; a++) {
      data.fill(k, G, T, row(a), B, L, inputs.data(), targets.data());
      gpt.set_batch_position(k, (int64_t)row(a) * T);
      const json where = {{"step", k + 1}, {"mb", a}, {"chunk", 0}};
      {
        trace::Tracer::Span span(trace::Lane::kCompute, parallel::pp::span_name('F', a, 0, 1),
                                 trace::category::kForward, where);
        loss_sum += (double)gpt.forward(inputs.data(), targets.data(), B, L) * B * L;
      }
      {
        trace::Tracer::Span span(trace::Lane::kCompute, parallel::pp::span_name('B', a, 0, 1),
                                 trace::category::kBackward, where);
        gpt.backward(loss_scale);
      }
      dp.end_micro_batch();
    }
    gpt.param_store()->use_weights(model::WeightVersion::kCurrent);
  }
  dp.finish_reductions();
  dp.advance_weight_versions();  // 2bw: the weights this update starts from are the next step's
  dp_group.all_reduce_f64(&loss_sum, 1, comm::ReduceOp::kSum);
  StepResult r;
  r.loss = (float)(loss_sum / ((double)G * L));
  trace::Tracer::Span span(trace::Lane::kCompute, "optimizer", trace::category::kOptimizer, {{"step", k + 1}});
  if (nonfinite && k + 1 == nonfinite->debug_step) dp.poison_gradient(nonfinite->debug_unit);
  // The norm is reduced over every axis, so every rank reaches the same overflow verdict.
  const double norm = dp.grad_norm();
  r.grad_norm = norm / S;
  r.loss_scale = S;
  r.lr = lr;
  const int64_t applied = k - (scaler ? scaler->skipped_steps() : nonfinite ? nonfinite->skipped : 0);  // updates so far
  if (scaler) {
    r.skipped = !std::isfinite(norm);
    r.status = scaler->update(r.skipped);
    if (r.skipped) return r;
  } else if (nonfinite && !(std::isfinite(norm) && std::isfinite(r.loss))) {
    r.skipped = true;
    r.nonfinite = describe_nonfinite(gpt.config(), dp, *nonfinite->world, r.loss, norm);
    if (nonfinite->skip)
      nonfinite->skipped++;
    else
      r.status = Status::error("step " + std::to_string(k + 1) + ": " + r.nonfinite +
                               "; stopped before the update (--on-nonfinite stop; skip would go on without it)");
    return r;
  }
  dp.clip(norm, cfg.grad_clip, S);
  dp.optimizer_step(r.lr, (int)applied + 1);
  return r;
}

namespace {

// The step span's args: the step, and under a pipeline what `meshtrain timeline` needs to
// explain its bubble (the schedule and the rank's place in it).
json step_trace_args(const Run& run, int64_t k) {
  json args = {{"step", k + 1}};
  if (run.pipeline)
    args["pipeline"] = {{"schedule", parallel::pp::schedule_name(run.schedule)}, {"pp", run.mesh_shape.pp},
                        {"pp_rank", run.mesh->pp_rank()}, {"micro_batches", run.shape.A},
                        {"virtual_stages", run.chunks}};
  return args;
}

// Step k's learning rate: by steps, or with --lr-unit tokens by the tokens trained before it
// (`done`) and in it (`now`), the warmup lasting warmup_steps full-length steps' tokens.
float step_learning_rate(const TrainOptions& o, const BatchShape& shape, int64_t k, int64_t done, int64_t now,
                         int64_t total) {
  if (o.lr_unit != "tokens") return optim::learning_rate(o.adamw, (int)k, o.steps);
  const double warmup = (double)o.adamw.warmup_steps * shape.G() * shape.T;
  return optim::learning_rate_by_tokens(o.adamw, (double)done, (double)now, warmup, (double)total);
}

}  // namespace

StepResult train_step(model::Gpt& gpt, parallel::DataParallel& dp, comm::Group& dp_group,
                      const optim::AdamWConfig& cfg, const data::TokenLoader& data,
                      const BatchShape& shape, int64_t k, int total_steps,
                      parallel::pp::PipelineExecutor* pipeline, optim::DynamicLossScaler* scaler,
                      NonfinitePolicy* nonfinite, bool more_steps) {
  return train_step(gpt, dp, dp_group, cfg, data, shape, k, optim::learning_rate(cfg, (int)k, total_steps), pipeline,
                    scaler, nonfinite, more_steps);
}

Status run_training(const TrainOptions& options, comm::Group& world, TrainResult* result) {
  Run run;
  // Beating from the moment the run folder is this job's (guard_run_folder): a rank stuck
  // in setup (loading a checkpoint) is seen too.
  std::unique_ptr<Heartbeat> heartbeat;
  if (Status s = prepare(options, world, &run, [&] { heartbeat = start_flight_recorder(options, world); });
      !s.is_ok()) {
    heartbeat.reset();
    // A run that fails its setup leaves no folder behind, as before it had one.
    std::error_code ec;
    if (run.created_folder && run.is_main) fs::remove_all(options.out_dir, ec);
    return s;
  }
  const TrainOptions& o = run.opt;
  run.hosts = gather_host_names(world);
  MetricsWriter metrics;
  if (run.is_main && !o.out_dir.empty())
    RETURN_IF_ERROR(metrics.open((fs::path(o.out_dir) / "metrics.jsonl").string(),
                                 o.resume ? run.start_step : -1));

  const BatchShape& shape = run.shape;
  const Curriculum& curriculum = run.curriculum;
  // Tokens trained so far and in the whole run (rows cut short by a curriculum count as
  // their length): the metrics' "tokens" and, with --lr-unit tokens, the LR schedule's clock.
  int64_t tokens_done = curriculum.tokens_before(run.start_step, shape.G());
  const int64_t tokens_total = curriculum.tokens_before(o.steps, shape.G());
  const bool quiet = o.quiet || !run.is_main;
  if (!quiet) {
    std::printf("model: %s | %d layers, %d heads, dim %d, vocab %d, %.2fM parameters | T=%d B=%d A=%d "
                "G=%d | %s zero=%d | %s GEMMs | %d threads/rank, peak %.0f GFLOP/s per rank\n",
                model::describe_arch(run.config).c_str(), run.config.layers, run.config.heads, run.config.dim,
                run.config.vocab,
                model::num_parameters(run.config) / 1e6, shape.T, shape.B, shape.A, shape.G(),
                run.mesh->shape().to_string().c_str(), o.zero, o.precision.c_str(), run.threads,
                run.peak_gflops);
    std::printf("machine: %s | %s | oneDNN ISA %s | %s\n", cpu_info().model.c_str(), cpu_info().flags().c_str(),
                kernels::onednn_isa_name(), machine::mfu_basis(run.precision).c_str());
    if (run.train_data.is_mixture())
      std::printf("data: a mixture of %s (by rows; realised over the run's %lld steps: %s)\n", o.data_dir.c_str(),
                  (long long)o.steps, data::describe_shares(run.train_data, o.steps, shape.G()).c_str());
    if (run.start_step > 0)
      std::printf("resumed at step %lld from a checkpoint written at %s (re-sliced to this layout where it differs)%s\n",
                  (long long)run.start_step, run.resumed_layout.c_str(),
                  run.resume_note.empty() ? "" : ("; " + run.resume_note).c_str());
    if (const parallel::CompressedReduction* c = run.dp->compression()) {
      std::printf("compression: powersgd rank %d from step %lld: %zu matrices at rank r, %zu elements exact, "
                  "%.2f MB per rank and step (the plain all-reduce: %.2f MB)\n",
                  o.powersgd_rank, (long long)o.compress_start + 1, c->powersgd().compressed().size(),
                  c->powersgd().exact_elements(), c->wire_bytes() / 1e6,
                  comm::comm_bytes(comm::CommOp::kAllReduce, run.gpt->layout().total(), run.mesh->dp().size(), 4) / 1e6);
    }
    if (const parallel::OneBitAdam* c = run.dp->onebit_adam()) {
      const int64_t plain = comm::comm_bytes(comm::CommOp::kAllReduce, run.gpt->layout().total(), run.mesh->dp().size(), 4);
      std::printf("compression: 1-bit Adam, variance frozen after step %d: momentum as signs and one scale per "
                  "%zu elements, in chunks of %zu, %.3f MB per rank and step (the plain all-reduce: %.2f MB)%s\n",
                  o.compress_start, c->scale_block(), c->chunk(), c->wire_bytes() / 1e6, plain / 1e6,
                  o.zero == 1 ? ", plus ZeRO-1's parameter all-gather" : "");
    }
    if (o.zero_quantized_weights || o.zero_quantized_gradients)
      std::printf("quantized communication (ZeRO++): %s%s%s as int8 blocks of %zu values with an fp32 scale each%s\n",
                  o.zero_quantized_weights ? "ZeRO-3's parameter gathers (qwZ)" : "",
                  o.zero_quantized_weights && o.zero_quantized_gradients ? " and " : "",
                  o.zero_quantized_gradients ? "the gradient reduce-scatters (qgZ)" : "", parallel::DpConfig{}.quantized.block,
                  run.mesh->dp().size() == 1 ? " (one data-parallel rank: nothing is sent, nothing quantized)" : "");
    if (run.start_step > 0 && (run.dp->compression() || run.dp->onebit_adam()))
      std::printf("compression: %s\n", run.rank_arrays_restored
                                            ? "error feedback (and PowerSGD's warm start) restored from the checkpoint"
                                            : "error feedback (and PowerSGD's warm start) restart from zero: the "
                                              "checkpoint holds none for this layout");
    if (run.dp->keeps_weight_versions())
      std::printf("2bw: each step computes with the weights before the last update (W(t+1) = W(t) - lr * "
                  "update(grad at W(t-1)))%s\n",
                  run.start_step == 0              ? ""
                  : run.previous_weights_restored ? "; the previous version restored from the checkpoint"
                                                   : "; the checkpoint holds no previous version: the delay starts "
                                                     "again (previous = current)");
    // What --offload or --memory-budget put in files (rank 0's; every rank alike).
    const optim::ShardStore& store = run.dp->store();
    std::string in_files;
    bool direct = true;
    for (int a = 0; a < optim::kShardArrays; a++)
      if (store.in_file((optim::ShardArray)a)) {
        in_files += std::string(in_files.empty() ? "" : ", ") + optim::shard_array_name((optim::ShardArray)a);
        direct = direct && store.direct_io((optim::ShardArray)a);
      }
    if (!in_files.empty())
      std::printf("in files under %s: %s (%s)\n", o.offload_dir.c_str(), in_files.c_str(),
                  direct ? "O_DIRECT" : "through the page cache");
    if (curriculum.on())
      std::printf("curriculum: %s; LR schedule by %s\n", curriculum.describe().c_str(), o.lr_unit.c_str());
  }
  Progress progress(run.start_step, o.steps, quiet);
  const auto started = std::chrono::steady_clock::now();
  TrainResult local;
  TrainResult& res = result ? *result : local;
  const int world_size = world.size();
  json last_pipeline;
  int64_t saved_step = run.start_step;  // the newest checkpoint's step (start_step: none, or the resumed one)
  int64_t skipped_in_row = 0;           // --on-nonfinite skip: consecutive skipped steps
  for (int64_t k = run.start_step; k < o.steps; k++) {
    // Every rank looks at the signals here, between steps, and stops after the same step.
    if (const int sig = agreed_stop_signal(world); sig != 0) {
      res.interrupted_by = sig;
      RETURN_IF_ERROR(stop_on_signal(run, world, k, saved_step, sig));
      if (heartbeat) heartbeat->finish_as("interrupted");
      return Status::ok();
    }
    comm::set_current_step(k + 1);
    if (world.rank() == o.debug_stall_rank && k + 1 == o.debug_stall_step)
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));  // the watchdog test
    run.mesh->reset_stats();
    run.gpt->reset_flops();
    run.gpt->reset_moe_stats();
    auto t0 = std::chrono::steady_clock::now();
    std::optional<trace::Tracer::Span> step_span;
    if (trace::Tracer::instance().enabled())
      step_span.emplace(trace::Lane::kCompute, "step " + std::to_string(k + 1), trace::category::kStep,
                        step_trace_args(run, k));
    BatchShape step_shape = shape;
    step_shape.L = curriculum.length(k);
    const int64_t tokens_per_step = (int64_t)shape.G() * step_shape.L;
    const float lr = step_learning_rate(o, shape, k, tokens_done, tokens_per_step, tokens_total);
    StepResult r = train_step(*run.gpt, *run.dp, run.mesh->dp(), o.adamw, run.train_data, step_shape, k, lr,
                              run.pipeline.get(), run.scaler.get(), run.scaler ? nullptr : &run.nonfinite,
                              k + 1 < o.steps);
    tokens_done += tokens_per_step;
    if (std::string newest; !r.status.is_ok() && !r.nonfinite.empty() && !o.out_dir.empty() &&
                            checkpoint::find_latest_checkpoint(o.out_dir, &newest).is_ok())
      return Status::error(r.status.message() + "; the newest checkpoint is " + newest);
    RETURN_IF_ERROR(r.status);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    step_span.reset();
    const double tok_s = tokens_per_step / s;
    // MFU per rank: the step's model FLOPs spread over every rank's peak. A rank that beat
    // its peak shows the peak stale; it is measured again and raised (machine/peak.h).
    bool peak_raised = false;
    const double flops_per_token = run.gpt->flops_per_token(step_shape.L);  // at this step's length
    const double mfu = machine::honest_mfu(tok_s * flops_per_token / world_size / 1e9, &run.peak_gflops,
                                           run.threads, run.precision, o.peak_gflops <= 0, &peak_raised);
    if (peak_raised && !quiet)
      progress.message("note: this step ran above the cached GEMM peak (measured on a busy machine?); "
                       "the peak was measured again and is now " + std::to_string((int)run.peak_gflops) +
                       " GFLOP/s");
    if (!r.nonfinite.empty())
      progress.message("step " + std::to_string(k + 1) + ": " + r.nonfinite + "; skipped (--on-nonfinite skip)");
    skipped_in_row = r.nonfinite.empty() ? 0 : skipped_in_row + 1;
    if (skipped_in_row >= o.max_skipped_steps) return too_many_skips(run, k + 1, skipped_in_row, r.nonfinite);
    if (!std::isfinite(r.loss) && r.nonfinite.empty())
      return Status::error("loss is " + std::to_string(r.loss) + " at step " + std::to_string(k + 1) +
                           " (diverged; try a lower --lr)");
    res.losses.push_back(r.loss);
    res.grad_norms.push_back((float)r.grad_norm);
    json pipeline = pipeline_json(run);
    last_pipeline = pipeline;
    double wait_ms = 0, busy_ms = 0;
    json comm = comm_json(run.mesh->stats(), &wait_ms, &busy_ms);
    const double hidden = busy_ms > 0 ? std::clamp(1.0 - wait_ms / busy_ms, 0.0, 1.0) : 0.0;
    json record = {{"step", k + 1}, {"loss", r.loss}, {"lr", r.lr}, {"grad_norm", r.grad_norm},
                   {"tokens", tokens_done}, {"seq_len", step_shape.L}, {"step_ms", s * 1e3},
                   {"tokens_per_s", tok_s}, {"mfu", mfu}, {"peak_gflops", run.peak_gflops},
                   {"mem", memory_json(MemoryTracker::instance().stats())},
                   {"peak_rss", peak_rss_bytes()}, {"comm", comm},
                   {"comm_time", comm_time_json(run.mesh->stats())},
                   {"comm_ms", wait_ms}, {"comm_busy_ms", busy_ms}, {"comm_hidden", hidden},
                   // This rank's executed block FLOPs; recompute_fraction = recomputed forward
                   // work over one forward of the blocks (full recomputation: ~1).
                   {"block_flops", run.gpt->flops().model},
                   {"recompute_flops", run.gpt->flops().recompute},
                   {"recompute_fraction", run.gpt->flops().recompute / (run.gpt->flops().model / 3.0)}};
    record.update(pipeline);
    record.update(straggler_json(run, world, s, wait_ms / 1e3, run.mesh->stats()));
    const MoeJobStats moe_stats = moe_job_stats(run, world);
    if (!r.skipped) update_expert_biases(run, moe_stats);  // for the next step's routing
    const json moe = moe_json(run, moe_stats);
    record.update(moe);
    if (peak_raised) record["peak_raised"] = true;
    if (run.train_data.is_mixture()) {
      // The share of each source in the rows of steps 1..k+1: what the mixture really read.
      const std::vector<double> shares = run.train_data.realised_shares(k + 1, shape.G());
      for (size_t d = 0; d < shares.size(); d++) record["data_mix"][run.train_data.source_names()[d]] = shares[d];
    }
    if (optim::ShardStore& store = run.dp->store(); store.any_in_file(~0u)) {
      // Every file-backed array of this rank's shard: the optimizer's streaming and ZeRO-3's
      // per-unit reads and writes. Exposed: what compute waited for; hidden: the rest.
      const optim::OffloadStats st = store.stats();
      bool direct = true;
      json arrays = json::array();
      for (int a = 0; a < optim::kShardArrays; a++)
        if (store.in_file((optim::ShardArray)a)) {
          arrays.push_back(optim::shard_array_name((optim::ShardArray)a));
          direct = direct && store.direct_io((optim::ShardArray)a);
        }
      auto io_json = [](const optim::IoStats& s) {
        return json{{"read_bytes", s.bytes_read}, {"written_bytes", s.bytes_written},
                    {"io_ms", s.io_s * 1e3}, {"wait_ms", s.wait_s * 1e3},
                    {"hidden_ms", std::max(0.0, s.io_s - s.wait_s) * 1e3}};
      };
      json off = io_json(st);
      off["units"] = io_json(st.by[(int)optim::Traffic::kUnits]);
      off["update"] = io_json(st.by[(int)optim::Traffic::kUpdate]);
      off["direct_io"] = direct;
      off["arrays"] = arrays;
      record["offload"] = off;
      store.reset_stats();
    }
    if (run.scaler)
      record.update({{"loss_scale", r.loss_scale}, {"step_skipped", r.skipped},
                     {"skipped_steps", run.scaler->skipped_steps()}});
    if (!r.nonfinite.empty())
      record.update({{"step_skipped", true}, {"skipped_steps", run.nonfinite.skipped}, {"nonfinite", r.nonfinite}});
    metrics.write(record);
    std::string routing;  // the step line's MoE part, and a curriculum's length
    if (curriculum.on()) routing = " | T " + std::to_string(step_shape.L);
    if (moe.contains("moe")) {
      char text[96];
      const json& m = moe["moe"];
      std::snprintf(text, sizeof text, " | aux %.4f | experts cv %.2f | drop %.1f%%", m["aux_loss"].get<double>(),
                    m["tokens_per_expert"]["cv"].get<double>(), 100 * m["dropped_fraction"].get<double>());
      routing += text;
    }
    progress.step(k, r.loss, r.lr, r.grad_norm, s, tok_s, mfu, routing);

    const bool last = k + 1 == o.steps;
    if (run.has_val && ((o.eval_every > 0 && (k + 1) % o.eval_every == 0) || last)) {
      // Every rank evaluates the same batches (ZeRO-3 forwards are collective).
      float val = evaluate_loss(*run.gpt, run.val_data, shape.B, shape.T, o.eval_batches,
                                run.pipeline.get());
      res.final_val_loss = val;
      metrics.write({{"step", k + 1}, {"val_loss", val}, {"tokens", tokens_done}});
      char line[96];
      std::snprintf(line, sizeof line, "step %5lld | val loss %.4f", (long long)k + 1, val);
      progress.message(line);
    }
    // The final step is always saved when there is a run folder (export/generate read it),
    // and at once: the run's last checkpoint is complete when it returns.
    const bool save = !o.out_dir.empty() && ((o.save_every > 0 && (k + 1) % o.save_every == 0) || last);
    RETURN_IF_ERROR(finish_run_save(run, world, /*wait=*/save));
    if (save) RETURN_IF_ERROR(save_run_checkpoint(run, world, k + 1, o.async_save && !last));
    if (save) saved_step = k + 1;
  }
  RETURN_IF_ERROR(finish_run_save(run, world, /*wait=*/true));
  if (!o.trace_file.empty()) RETURN_IF_ERROR(agree(world, write_trace(o.trace_file, world)));
  if (!o.quiet && world.size() > 1) print_summary(run, world, last_pipeline);
  if (!quiet) print_run_end(run, res, std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
  if (heartbeat) heartbeat->finish(true);
  return Status::ok();
}

}  // namespace meshtrain::train
