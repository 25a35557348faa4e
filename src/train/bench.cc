#include "train/bench.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <random>
#include <thread>

#include "comm/self_group.h"
#include "core/profile.h"
#include "machine/describe.h"
#include "machine/peak.h"
#include "train/step_profile.h"
#include "train/trainer.h"

namespace meshtrain::train {

Status bench_step(const TrainOptions& o, int warmup, int steps, const Console& console, bool profile) {
  model::GptConfig config;
  int T = 0;
  RETURN_IF_ERROR(resolve_model(o, &config, &T));
  if (steps < 1 || warmup < 0) return Status::error("--steps must be >= 1 and --warmup >= 0");
  kernels::Precision precision;
  RETURN_IF_ERROR(parse_precision_flag(o.precision, &precision));
  const int threads = o.threads > 0 ? o.threads : (int)std::max(1u, std::thread::hardware_concurrency());
  omp_set_num_threads(threads);
  // Measured afresh (and not cached): the figure printed beside the result is this run's.
  double peak = o.peak_gflops > 0 ? o.peak_gflops : machine::measure_gemm_peak_gflops(threads, precision);
  if (o.peak_gflops <= 0) machine::record_gemm_peak_gflops(threads, peak, precision);

  BatchShape shape{o.micro_batch, std::max(1, o.grad_accum), T, 1, 0};
  std::mt19937 rng(o.seed);
  std::vector<data::Token> tokens((size_t)shape.G() * T * (warmup + steps) + 1);
  for (auto& t : tokens) t = (data::Token)(rng() % config.vocab);
  auto data = data::TokenLoader::from_tokens(std::move(tokens));

  // As training stores it: fp32, or 16-bit weights and gradients with fp32 master weights.
  model::Gpt init(config, model::Gpt::LocalState::kParamsOnly);
  init.init_weights(o.seed);
  model::Gpt gpt(config, parallel::model_state_for_stage(0, precision));
  gpt.set_precision(precision);
  comm::SelfGroup self("dp");
  parallel::DpConfig dpc;
  dpc.storage = precision;
  parallel::DataParallel dp(gpt, self, dpc, o.adamw, init.params());
  const double flops_per_token = gpt.flops_per_token(T);
  console.out(formatted("bench step: %s | %d layers, dim %d, %d heads, vocab %d, %.1fM parameters | B=%d A=%d T=%d | "
                        "%d threads\n%s%s\n",
                        model::describe_arch(config).c_str(), config.layers, config.dim, config.heads, config.vocab,
                        model::num_parameters(config) / 1e6, shape.B, shape.A, T, threads,
                        machine::machine_summary().c_str(), machine::mfu_basis(precision).c_str()));
  std::vector<double> times;
  for (int k = 0; k < warmup + steps; k++) {
    if (profile && k == warmup) profile::reset(), profile::set_enabled(true);
    auto t0 = std::chrono::steady_clock::now();
    train_step(gpt, dp, self, o.adamw, data, shape, k, warmup + steps);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (k >= warmup) times.push_back(s);
  }
  profile::set_enabled(false);
  const profile::Profile recorded = profile::snapshot();
  double total = 0;
  for (double t : times) total += t;
  std::sort(times.begin(), times.end());
  const double median = times[times.size() / 2];
  const double tok_s = (double)shape.G() * T / median;
  const double achieved = tok_s * flops_per_token / 1e9;
  bool raised = false;
  const double mfu = machine::honest_mfu(achieved, &peak, threads, precision, o.peak_gflops <= 0, &raised);
  console.out(formatted("step time (median of %d): %.1f ms | %.1f tokens/s | %.1f GFLOP/s achieved | "
                        "peak %.1f GFLOP/s (%s GEMM, %d threads) | MFU %.1f%%\n",
                        steps, median * 1e3, tok_s, achieved, peak,
                        kernels::precision_name(kernels::peak_precision(precision)), threads, 100 * mfu));
  if (raised)
    console.line("note: the step ran faster than the peak measured before it, so that measurement was "
                 "disturbed; the peak was measured again and raised to at least the achieved rate");
  if (profile) {  // the timed steps' mean: the ops' times add up to their total
    const ProfilePeaks peaks{peak, machine::measure_triad_gbps(threads)};
    console.out(profile_table(recorded, steps, total / steps, peaks));
  }
  return Status::ok();
}

}  // namespace meshtrain::train
