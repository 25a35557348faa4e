#include "train/trainer.h"

#include <omp.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <thread>

#include "checkpoint/checkpoint.h"
#include "checkpoint/model_file.h"
#include "core/file_io.h"
#include "data/loader.h"
#include "model/gpt.h"
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
  int T = 0, B = 0, A = 0, G = 0;
  data::TokenLoader train_data, val_data;
  bool has_val = false;
  std::unique_ptr<model::Gpt> gpt;
  std::unique_ptr<optim::AdamW> adamw;
  int64_t start_step = 0;
  double peak_gflops = 0;
  int threads = 1;
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
  RETURN_IF_ERROR(positive("--grad-accum", o.grad_accum));
  RETURN_IF_ERROR(positive("--steps", o.steps));
  RETURN_IF_ERROR(positive("--eval-batches", o.eval_batches));
  if (o.threads < 0) return Status::error("--threads must be >= 0");
  if (o.keep_checkpoints < 0) return Status::error("--keep-checkpoints must be >= 0 (0 keeps all)");
  if (o.eval_every < 0 || o.save_every < 0) return Status::error("--eval-every/--save-every must be >= 0");
  if (o.resume && o.out_dir.empty()) return Status::error("--resume needs --out DIR");
  if (o.save_every > 0 && o.out_dir.empty()) return Status::error("--save-every needs --out DIR");
  const auto& a = o.adamw;
  if (!(a.lr >= 0) || !(a.min_lr >= 0)) return Status::error("--lr and --min-lr must be >= 0");
  if (a.warmup_steps < 0) return Status::error("--warmup-steps must be >= 0");
  if (!(a.beta1 >= 0 && a.beta1 < 1) || !(a.beta2 >= 0 && a.beta2 < 1))
    return Status::error("--beta1 and --beta2 must be in [0, 1)");
  if (!(a.eps > 0)) return Status::error("--eps must be > 0");
  if (!(a.weight_decay >= 0)) return Status::error("--weight-decay must be >= 0");
  return Status::ok();
}

// Every check that can fail happens here, before any training work.
Status prepare(const TrainOptions& o, Run* run) {
  RETURN_IF_ERROR(check_options(o));
  run->opt = o;
  run->threads = o.threads > 0 ? o.threads : (int)std::max(1u, std::thread::hardware_concurrency());
  omp_set_num_threads(run->threads);

  // The model shape comes from the flags (the same as the interrupted run's);
  // load_checkpoint() rejects a checkpoint of another shape.
  RETURN_IF_ERROR(resolve_model(o, &run->config, &run->T));
  std::string resume_dir;
  if (o.resume) RETURN_IF_ERROR(checkpoint::find_latest_checkpoint(o.out_dir, &resume_dir));
  run->B = o.micro_batch;
  run->A = o.grad_accum;
  run->G = run->B * run->A;

  const std::string train_path = (fs::path(o.data_dir) / "train.bin").string();
  const std::string val_path = (fs::path(o.data_dir) / "val.bin").string();
  RETURN_IF_ERROR(data::TokenLoader::open(train_path, &run->train_data));
  RETURN_IF_ERROR(run->train_data.check(run->G, run->T, run->config.vocab));
  if (fs::exists(val_path)) {
    RETURN_IF_ERROR(data::TokenLoader::open(val_path, &run->val_data));
    run->has_val = run->val_data.check(run->B, run->T, run->config.vocab).is_ok();
  }

  run->gpt = std::make_unique<model::Gpt>(run->config);
  run->adamw = std::make_unique<optim::AdamW>(o.adamw, run->gpt->layout());
  if (!resume_dir.empty()) {
    RETURN_IF_ERROR(checkpoint::load_checkpoint(resume_dir, run->gpt.get(), run->adamw.get(),
                                                &run->start_step));
    if (run->start_step >= o.steps)
      return Status::error(resume_dir + " is at step " + std::to_string(run->start_step) +
                           ", already >= --steps " + std::to_string(o.steps));
  } else if (!o.init_from.empty()) {
    RETURN_IF_ERROR(checkpoint::load_model_file(o.init_from, run->gpt.get()));
  } else {
    run->gpt->init_weights(o.seed);
  }

  if (!o.out_dir.empty()) {
    std::error_code ec;
    fs::create_directories(o.out_dir, ec);
    if (ec) return Status::error("cannot create --out " + o.out_dir + ": " + ec.message());
    json resolved = to_json(o);
    resolved["resolved_model"] = {{"layers", run->config.layers}, {"heads", run->config.heads},
                                  {"dim", run->config.dim}, {"vocab", run->config.vocab},
                                  {"max_seq_len", run->config.max_seq_len}, {"seq_len", run->T}};
    RETURN_IF_ERROR(write_text((fs::path(o.out_dir) / "config.json").string(), resolved.dump(2) + "\n"));
    if (!o.resolved_config_toml.empty())
      RETURN_IF_ERROR(write_text((fs::path(o.out_dir) / "config.toml").string(), o.resolved_config_toml));
  }
  run->peak_gflops = o.peak_gflops > 0 ? o.peak_gflops : cached_gemm_peak_gflops(run->threads, !o.quiet);
  return Status::ok();
}

}  // namespace

float evaluate_loss(model::Gpt& gpt, const data::TokenLoader& data, int B, int T, int batches) {
  const int64_t n = std::min<int64_t>(batches, data.windows(B, T));
  std::vector<int> inputs((size_t)B * T), targets((size_t)B * T);
  double sum = 0;
  for (int64_t k = 0; k < n; k++) {
    data.fill(k, B, T, 0, B, inputs.data(), targets.data());
    sum += gpt.forward(inputs.data(), targets.data(), B, T);
  }
  return (float)(sum / n);
}

StepResult train_step(model::Gpt& gpt, optim::AdamW& adamw, const optim::AdamWConfig& cfg,
                      const data::TokenLoader& data, const BatchShape& shape, int64_t k,
                      int total_steps) {
  const int B = shape.B, T = shape.T, G = shape.G();
  std::vector<int> inputs((size_t)B * T), targets((size_t)B * T);
  gpt.zero_grads();
  double loss_sum = 0;
  for (int a = 0; a < shape.A; a++) {
    data.fill(k, G, T, a * B, B, inputs.data(), targets.data());
    loss_sum += (double)gpt.forward(inputs.data(), targets.data(), B, T) * B * T;
    gpt.backward(1.0f / ((float)G * T));
  }
  StepResult r;
  r.loss = (float)(loss_sum / ((double)G * T));
  const size_t n = gpt.num_elements();
  r.grad_norm = optim::grad_norm(gpt.grads(), n);
  optim::clip_grads(gpt.grads(), n, r.grad_norm, cfg.grad_clip);
  r.lr = optim::learning_rate(cfg, (int)k, total_steps);
  adamw.step(gpt.params(), gpt.grads(), r.lr, (int)k + 1);
  return r;
}

Status run_training(const TrainOptions& options, TrainResult* result) {
  Run run;
  RETURN_IF_ERROR(prepare(options, &run));
  const TrainOptions& o = run.opt;
  MetricsWriter metrics;
  if (!o.out_dir.empty())
    RETURN_IF_ERROR(metrics.open((fs::path(o.out_dir) / "metrics.jsonl").string(),
                                 o.resume ? run.start_step : -1));

  const double flops_per_token = run.gpt->flops_per_token(run.T);
  const int64_t tokens_per_step = (int64_t)run.G * run.T;
  if (!o.quiet) {
    std::printf("model: %d layers, %d heads, dim %d, vocab %d, %.2fM parameters | T=%d B=%d A=%d "
                "G=%d | %d threads, peak %.0f GFLOP/s\n",
                run.config.layers, run.config.heads, run.config.dim, run.config.vocab,
                model::num_parameters(run.config) / 1e6, run.T, run.B, run.A, run.G, run.threads,
                run.peak_gflops);
    if (run.start_step > 0) std::printf("resumed at step %lld\n", (long long)run.start_step);
  }
  Progress progress(run.start_step, o.steps, o.quiet);
  TrainResult local;
  TrainResult& res = result ? *result : local;
  for (int64_t k = run.start_step; k < o.steps; k++) {
    auto t0 = std::chrono::steady_clock::now();
    StepResult r = train_step(*run.gpt, *run.adamw, o.adamw, run.train_data,
                              {run.B, run.A, run.T}, k, o.steps);
    const float loss = r.loss, lr = r.lr;
    const double norm = r.grad_norm;
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double tok_s = tokens_per_step / s;
    const double mfu = tok_s * flops_per_token / (run.peak_gflops * 1e9);
    if (!std::isfinite(loss))
      return Status::error("loss is " + std::to_string(loss) + " at step " + std::to_string(k + 1) +
                           " (diverged; try a lower --lr)");
    res.losses.push_back(loss);
    res.grad_norms.push_back((float)norm);
    metrics.write({{"step", k + 1}, {"loss", loss}, {"lr", lr}, {"grad_norm", norm},
                   {"tokens", (k + 1) * tokens_per_step}, {"step_ms", s * 1e3},
                   {"tokens_per_s", tok_s}, {"mfu", mfu},
                   {"mem", memory_json(MemoryTracker::instance().stats())}});
    progress.step(k, loss, lr, norm, s, tok_s, mfu);

    const bool last = k + 1 == o.steps;
    if (run.has_val && ((o.eval_every > 0 && (k + 1) % o.eval_every == 0) || last)) {
      float val = evaluate_loss(*run.gpt, run.val_data, run.B, run.T, o.eval_batches);
      res.final_val_loss = val;
      metrics.write({{"step", k + 1}, {"val_loss", val}, {"tokens", (k + 1) * tokens_per_step}});
      char line[96];
      std::snprintf(line, sizeof line, "step %5lld | val loss %.4f", (long long)k + 1, val);
      progress.message(line);
    }
    if (o.save_every > 0 && ((k + 1) % o.save_every == 0 || last)) {
      RETURN_IF_ERROR(checkpoint::save_checkpoint(o.out_dir, k + 1, *run.gpt, *run.adamw,
                                                  to_json(o), o.keep_checkpoints));
    }
  }
  if (!o.out_dir.empty() && o.save_every == 0) {
    // Always leave the final weights behind so export/generate have something to read.
    RETURN_IF_ERROR(checkpoint::save_checkpoint(o.out_dir, o.steps, *run.gpt, *run.adamw,
                                                to_json(o), o.keep_checkpoints));
  }
  return Status::ok();
}

}  // namespace meshtrain::train
