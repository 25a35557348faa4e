#include "train/trainer.h"

#include <omp.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <thread>

#include "checkpoint/checkpoint.h"
#include "checkpoint/model_file.h"
#include "comm/mesh.h"
#include "core/file_io.h"
#include "train/metrics.h"
#include "train/peak.h"
#include "train/progress.h"

namespace meshtrain::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

struct Run {
  TrainOptions opt;
  model::GptConfig config;
  BatchShape shape;
  comm::MeshShape mesh_shape;
  std::unique_ptr<comm::Mesh> mesh;
  data::TokenLoader train_data, val_data;
  bool has_val = false;
  std::unique_ptr<model::Gpt> gpt;
  std::unique_ptr<parallel::DataParallel> dp;
  int64_t start_step = 0;
  double peak_gflops = 0;
  int threads = 1;
  bool is_main = true;  // world rank 0 prints and writes run files
};

Status write_text(const std::string& path, const std::string& text) {
  return write_file_synced(path, text.data(), text.size());
}

Status check_options(const TrainOptions& o) {
  auto positive = [](const char* flag, int v) -> Status {
    if (v < 1) return Status::error(std::string(flag) + " must be >= 1, got " + std::to_string(v));
    return Status::ok();
  };
  RETURN_IF_ERROR(positive("--micro-batch", o.micro_batch));
  if (o.grad_accum < 0) return Status::error("--grad-accum must be >= 1, got " + std::to_string(o.grad_accum));
  RETURN_IF_ERROR(positive("--steps", o.steps));
  RETURN_IF_ERROR(positive("--eval-batches", o.eval_batches));
  if (o.global_batch < 0) return Status::error("--global-batch must be >= 1 (or 0: B*A*dp)");
  if (o.threads < 0) return Status::error("--threads must be >= 0");
  if (o.keep_checkpoints < 0) return Status::error("--keep-checkpoints must be >= 0 (0 keeps all)");
  if (o.eval_every < 0 || o.save_every < 0) return Status::error("--eval-every/--save-every must be >= 0");
  if (o.resume && o.out_dir.empty()) return Status::error("--resume needs --out DIR");
  if (o.save_every > 0 && o.out_dir.empty()) return Status::error("--save-every needs --out DIR");
  if (o.zero < 0 || o.zero > 3) return Status::error("--zero must be 0, 1, 2 or 3, got " + std::to_string(o.zero));
  if (!(o.bucket_mb > 0)) return Status::error("--bucket-mb must be > 0");
  if (o.recompute != "none" && o.recompute != "selective" && o.recompute != "full")
    return Status::error("--recompute must be none, selective or full, got '" + o.recompute + "'");
  if (o.recompute_every < 1) return Status::error("--recompute-every must be >= 1");
  if (!(o.dropout >= 0 && o.dropout < 1)) return Status::error("--dropout must be in [0, 1)");
  if (!(o.comm_timeout >= 0)) return Status::error("--comm-timeout must be >= 0 (0: never)");
  const auto& a = o.adamw;
  if (!(a.lr >= 0) || !(a.min_lr >= 0)) return Status::error("--lr and --min-lr must be >= 0");
  if (a.warmup_steps < 0) return Status::error("--warmup-steps must be >= 0");
  if (!(a.beta1 >= 0 && a.beta1 < 1) || !(a.beta2 >= 0 && a.beta2 < 1))
    return Status::error("--beta1 and --beta2 must be in [0, 1)");
  if (!(a.eps > 0)) return Status::error("--eps must be > 0");
  if (!(a.weight_decay >= 0)) return Status::error("--weight-decay must be >= 0");
  return Status::ok();
}

// Layout and batch: the mesh from the world size, G and A from the flags.
Status resolve_layout(const TrainOptions& o, comm::Group& world, Run* run) {
  comm::MeshShape shape;
  RETURN_IF_ERROR(comm::resolve_mesh(world.size(), o.tp, o.pp, o.dp, &shape));
  if (shape.pp > 1)
    return Status::error("pipeline parallelism (--pp > 1) is not available yet; this build "
                         "trains tensor- and data-parallel layouts (--tp, --dp, --zero)");
  run->mesh_shape = shape;
  BatchShape& b = run->shape;
  b.B = o.micro_batch;
  b.dp = shape.dp;
  b.dp_rank = comm::Mesh::coordinates(world.rank(), shape).dp;
  if (o.global_batch > 0) {
    if (o.global_batch % (b.B * b.dp) != 0)
      return Status::error("--global-batch " + std::to_string(o.global_batch) +
                           " is not divisible by --micro-batch x dp = " + std::to_string(b.B) +
                           " x " + std::to_string(b.dp));
    b.A = o.global_batch / (b.B * b.dp);
    if (o.grad_accum > 0 && o.grad_accum != b.A)
      return Status::error("--grad-accum " + std::to_string(o.grad_accum) + " conflicts with --global-batch " +
                           std::to_string(o.global_batch) + " = micro-batch " + std::to_string(b.B) +
                           " x dp " + std::to_string(b.dp) + " x grad-accum " + std::to_string(b.A));
  } else {
    b.A = std::max(1, o.grad_accum);
  }
  return Status::ok();
}

int default_threads(int ranks_on_node) {
  int cores = (int)std::max(1u, std::thread::hardware_concurrency());
  return std::max(1, cores / std::max(1, ranks_on_node));
}

int local_ranks() {
  if (const char* s = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE")) return std::atoi(s);
  return 1;
}

// Model and optimizer state: initialised, loaded from a model file, or resumed.
// This rank's slice of the initial weights: from --init-from (a whole model, sliced for
// tensor parallelism) or the seeded initialisation (identical to tp = 1's).
Status initial_weights(const TrainOptions& o, model::Gpt* gpt) {
  if (o.init_from.empty()) {
    gpt->init_weights(o.seed);
    return Status::ok();
  }
  if (gpt->layout().tp() == 1) return checkpoint::load_model_file(o.init_from, gpt);
  model::Gpt whole(gpt->config(), model::Gpt::LocalState::kParamsOnly);
  RETURN_IF_ERROR(checkpoint::load_model_file(o.init_from, &whole));
  gpt->set_from_global(whole.params());
  return Status::ok();
}

Status build_state(const TrainOptions& o, const std::string& resume_dir, Run* run) {
  const bool sharded_params = o.zero == 3;
  comm::Group* tp = &run->mesh->tp();
  run->gpt = std::make_unique<model::Gpt>(run->config, parallel::model_state_for_stage(o.zero), tp,
                                          o.sp);
  const model::Recompute mode = o.recompute == "full"        ? model::Recompute::kFull
                                : o.recompute == "selective" ? model::Recompute::kSelective
                                                             : model::Recompute::kNone;
  run->gpt->set_recompute(mode, o.recompute_every);
  run->gpt->set_dropout(o.dropout, o.seed);
  parallel::DpConfig dpc{o.zero, o.bucket_mb, o.overlap};
  if (sharded_params) {
    // The full initial weights exist only during setup (peaks are reset before training).
    model::Gpt full(run->config, model::Gpt::LocalState::kParamsOnly, tp);
    RETURN_IF_ERROR(initial_weights(o, &full));
    run->dp = std::make_unique<parallel::DataParallel>(*run->gpt, run->mesh->dp(), dpc, o.adamw,
                                                       full.params(), tp);
  } else {
    RETURN_IF_ERROR(initial_weights(o, run->gpt.get()));
    run->dp = std::make_unique<parallel::DataParallel>(*run->gpt, run->mesh->dp(), dpc, o.adamw,
                                                       nullptr, tp);
  }
  if (resume_dir.empty()) return Status::ok();
  checkpoint::RankState st;
  st.params = sharded_params ? run->dp->param_shard() : run->gpt->params();
  st.params_full = !sharded_params;
  st.m = run->dp->adamw().m();
  st.v = run->dp->adamw().v();
  st.moments_full = o.zero == 0;
  RETURN_IF_ERROR(checkpoint::load_checkpoint(resume_dir, run->gpt->layout(), run->config,
                                              run->dp->shards(), st, &run->start_step));
  if (run->start_step >= o.steps)
    return Status::error(resume_dir + " is at step " + std::to_string(run->start_step) +
                         ", already >= --steps " + std::to_string(o.steps));
  return Status::ok();
}

checkpoint::RankState rank_state(Run& run) {
  const bool sharded = run.opt.zero == 3;
  return {sharded ? run.dp->param_shard() : run.gpt->params(), !sharded, run.dp->adamw().m(),
          run.dp->adamw().v(), run.opt.zero == 0};
}

Status write_run_files(const TrainOptions& o, const Run& run) {
  std::error_code ec;
  fs::create_directories(o.out_dir, ec);
  if (ec) return Status::error("cannot create --out " + o.out_dir + ": " + ec.message());
  json resolved = to_json(o);
  resolved["resolved_model"] = {{"layers", run.config.layers}, {"heads", run.config.heads},
                                {"dim", run.config.dim}, {"vocab", run.config.vocab},
                                {"max_seq_len", run.config.max_seq_len}, {"seq_len", run.shape.T}};
  resolved["resolved_layout"] = {{"world", run.mesh_shape.world()}, {"tp", run.mesh_shape.tp},
                                 {"pp", run.mesh_shape.pp}, {"dp", run.mesh_shape.dp},
                                 {"grad_accum", run.shape.A}, {"global_batch", run.shape.G()}};
  RETURN_IF_ERROR(write_text((fs::path(o.out_dir) / "config.json").string(), resolved.dump(2) + "\n"));
  if (!o.resolved_config_toml.empty())
    RETURN_IF_ERROR(write_text((fs::path(o.out_dir) / "config.toml").string(), o.resolved_config_toml));
  return Status::ok();
}

// Checks without communication: flags, layout arithmetic, model shape, data files.
Status prepare_local(const TrainOptions& o, comm::Group& world, Run* run, std::string* resume_dir) {
  RETURN_IF_ERROR(check_options(o));
  run->opt = o;
  run->is_main = world.rank() == 0;
  run->threads = o.threads > 0 ? o.threads : default_threads(local_ranks());
  omp_set_num_threads(run->threads);
  RETURN_IF_ERROR(resolve_layout(o, world, run));
  // The model shape comes from the flags (the same as the interrupted run's);
  // load_checkpoint() rejects a checkpoint of another shape.
  RETURN_IF_ERROR(resolve_model(o, &run->config, &run->shape.T));
  RETURN_IF_ERROR(model::validate_tp(run->config, run->mesh_shape.tp));
  if (o.sp && run->mesh_shape.tp < 2)
    return Status::error("--sp (sequence parallelism) needs --tp > 1");
  if (o.sp && (run->shape.B * run->shape.T) % run->mesh_shape.tp != 0)
    return Status::error("--sp needs micro-batch x seq-len (" +
                         std::to_string(run->shape.B * run->shape.T) + " tokens) divisible by --tp " +
                         std::to_string(run->mesh_shape.tp));
  if (o.resume) RETURN_IF_ERROR(checkpoint::find_latest_checkpoint(o.out_dir, resume_dir));

  const std::string train_path = (fs::path(o.data_dir) / "train.bin").string();
  const std::string val_path = (fs::path(o.data_dir) / "val.bin").string();
  RETURN_IF_ERROR(data::TokenLoader::open(train_path, &run->train_data));
  RETURN_IF_ERROR(run->train_data.check(run->shape.G(), run->shape.T, run->config.vocab));
  if (fs::exists(val_path)) {
    RETURN_IF_ERROR(data::TokenLoader::open(val_path, &run->val_data));
    run->has_val = run->val_data.check(run->shape.B, run->shape.T, run->config.vocab).is_ok();
  }
  return Status::ok();
}

// Every rank reaches the same verdict: an error on any rank stops all of them at this
// point, each with a message, and none is left waiting in a collective.
Status agree(comm::Group& world, const Status& mine) {
  double failed = mine.is_ok() ? 0.0 : 1.0;
  world.all_reduce_f64(&failed, 1, comm::ReduceOp::kSum);
  if (failed == 0) return Status::ok();
  if (!mine.is_ok()) return mine;
  return Status::error("rank " + std::to_string(world.rank()) +
                       ": stopping because another rank rejected the run (its message says why)");
}

// Every check that can fail happens here, before any training work, on every rank.
Status prepare(const TrainOptions& o, comm::Group& world, Run* run) {
  std::string resume_dir;
  RETURN_IF_ERROR(agree(world, prepare_local(o, world, run, &resume_dir)));
  run->mesh = std::make_unique<comm::Mesh>(world, run->mesh_shape);
  RETURN_IF_ERROR(agree(world, build_state(o, resume_dir, run)));
  if (run->is_main && !o.out_dir.empty()) RETURN_IF_ERROR(write_run_files(o, *run));
  run->peak_gflops = o.peak_gflops > 0 ? o.peak_gflops
                                       : cached_gemm_peak_gflops(run->threads, run->is_main && !o.quiet);
  comm::set_comm_timeout(o.comm_timeout);
  MemoryTracker::instance().reset_peaks();  // setup-only buffers are not training memory
  return Status::ok();
}

json comm_json(const std::map<std::string, comm::AxisStats>& stats, double* wait_ms,
               double* busy_ms) {
  json out = json::object();
  *wait_ms = *busy_ms = 0;
  for (const auto& [axis, s] : stats) {
    if (s.calls == 0) continue;
    out[axis] = {{"bytes", s.bytes}, {"calls", s.calls}};
    *wait_ms += s.wait_s * 1e3;
    *busy_ms += s.busy_s * 1e3;
  }
  return out;
}

}  // namespace

float evaluate_loss(model::Gpt& gpt, const data::TokenLoader& data, int B, int T, int batches) {
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
    sum += gpt.forward(inputs.data(), targets.data(), B, T);
  }
  return (float)(sum / n);
}

StepResult train_step(model::Gpt& gpt, parallel::DataParallel& dp, comm::Group& dp_group,
                      const optim::AdamWConfig& cfg, const data::TokenLoader& data,
                      const BatchShape& shape, int64_t k, int total_steps) {
  const int B = shape.B, T = shape.T, G = shape.G();
  std::vector<int> inputs((size_t)B * T), targets((size_t)B * T);
  dp.zero_grads();
  double loss_sum = 0;  // sum of token losses over this rank's rows
  for (int a = 0; a < shape.A; a++) {
    data.fill(k, G, T, shape.first_row() + a * B, B, inputs.data(), targets.data());
    dp.begin_micro_batch(a + 1 == shape.A);
    gpt.set_batch_position(k, (int64_t)(shape.first_row() + a * B) * T);
    loss_sum += (double)gpt.forward(inputs.data(), targets.data(), B, T) * B * T;
    gpt.backward(1.0f / ((float)G * T));
    dp.end_micro_batch();
  }
  dp_group.all_reduce_f64(&loss_sum, 1, comm::ReduceOp::kSum);
  StepResult r;
  r.loss = (float)(loss_sum / ((double)G * T));
  r.grad_norm = dp.grad_norm();
  dp.clip(r.grad_norm, cfg.grad_clip);
  r.lr = optim::learning_rate(cfg, (int)k, total_steps);
  dp.optimizer_step(r.lr, (int)k + 1);
  return r;
}

Status run_training(const TrainOptions& options, comm::Group& world, TrainResult* result) {
  Run run;
  RETURN_IF_ERROR(prepare(options, world, &run));
  const TrainOptions& o = run.opt;
  MetricsWriter metrics;
  if (run.is_main && !o.out_dir.empty())
    RETURN_IF_ERROR(metrics.open((fs::path(o.out_dir) / "metrics.jsonl").string(),
                                 o.resume ? run.start_step : -1));

  const BatchShape& shape = run.shape;
  const double flops_per_token = run.gpt->flops_per_token(shape.T);
  const int64_t tokens_per_step = (int64_t)shape.G() * shape.T;
  const bool quiet = o.quiet || !run.is_main;
  if (!quiet) {
    std::printf("model: %d layers, %d heads, dim %d, vocab %d, %.2fM parameters | T=%d B=%d A=%d "
                "G=%d | %s zero=%d | %d threads/rank, peak %.0f GFLOP/s per rank\n",
                run.config.layers, run.config.heads, run.config.dim, run.config.vocab,
                model::num_parameters(run.config) / 1e6, shape.T, shape.B, shape.A, shape.G(),
                run.mesh->shape().to_string().c_str(), o.zero, run.threads, run.peak_gflops);
    if (run.start_step > 0) std::printf("resumed at step %lld\n", (long long)run.start_step);
  }
  Progress progress(run.start_step, o.steps, quiet);
  TrainResult local;
  TrainResult& res = result ? *result : local;
  const int world_size = world.size();
  for (int64_t k = run.start_step; k < o.steps; k++) {
    comm::set_current_step(k + 1);
    if (world.rank() == o.debug_stall_rank && k + 1 == o.debug_stall_step)
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));  // the watchdog test
    run.mesh->reset_stats();
    run.gpt->reset_flops();
    auto t0 = std::chrono::steady_clock::now();
    StepResult r = train_step(*run.gpt, *run.dp, run.mesh->dp(), o.adamw, run.train_data, shape, k,
                              o.steps);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double tok_s = tokens_per_step / s;
    // MFU per rank: the step's model FLOPs spread over every rank's peak.
    const double mfu = tok_s * flops_per_token / (run.peak_gflops * 1e9 * world_size);
    if (!std::isfinite(r.loss))
      return Status::error("loss is " + std::to_string(r.loss) + " at step " + std::to_string(k + 1) +
                           " (diverged; try a lower --lr)");
    res.losses.push_back(r.loss);
    res.grad_norms.push_back((float)r.grad_norm);
    double wait_ms = 0, busy_ms = 0;
    json comm = comm_json(run.mesh->stats(), &wait_ms, &busy_ms);
    const double hidden = busy_ms > 0 ? std::clamp(1.0 - wait_ms / busy_ms, 0.0, 1.0) : 0.0;
    metrics.write({{"step", k + 1}, {"loss", r.loss}, {"lr", r.lr}, {"grad_norm", r.grad_norm},
                   {"tokens", (k + 1) * tokens_per_step}, {"step_ms", s * 1e3},
                   {"tokens_per_s", tok_s}, {"mfu", mfu},
                   {"mem", memory_json(MemoryTracker::instance().stats())}, {"comm", comm},
                   {"comm_ms", wait_ms}, {"comm_busy_ms", busy_ms}, {"comm_hidden", hidden},
                   // This rank's executed block FLOPs; recompute_fraction = recomputed forward
                   // work over one forward of the blocks (full recomputation: ~1).
                   {"block_flops", run.gpt->flops().model},
                   {"recompute_flops", run.gpt->flops().recompute},
                   {"recompute_fraction", run.gpt->flops().recompute / (run.gpt->flops().model / 3.0)}});
    progress.step(k, r.loss, r.lr, r.grad_norm, s, tok_s, mfu);

    const bool last = k + 1 == o.steps;
    if (run.has_val && ((o.eval_every > 0 && (k + 1) % o.eval_every == 0) || last)) {
      // Every rank evaluates the same batches (ZeRO-3 forwards are collective).
      float val = evaluate_loss(*run.gpt, run.val_data, shape.B, shape.T, o.eval_batches);
      res.final_val_loss = val;
      metrics.write({{"step", k + 1}, {"val_loss", val}, {"tokens", (k + 1) * tokens_per_step}});
      char line[96];
      std::snprintf(line, sizeof line, "step %5lld | val loss %.4f", (long long)k + 1, val);
      progress.message(line);
    }
    // The final step is always saved when there is a run folder (export/generate read it).
    const bool save = !o.out_dir.empty() && ((o.save_every > 0 && (k + 1) % o.save_every == 0) || last);
    if (save)
      RETURN_IF_ERROR(checkpoint::save_checkpoint(o.out_dir, k + 1, run.gpt->layout(), run.config,
                                                  run.dp->shards(), rank_state(run), world,
                                                  to_json(o), o.keep_checkpoints));
  }
  return Status::ok();
}

}  // namespace meshtrain::train
