#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "cli/commands.h"
#include "cli/config_file.h"
#include "train/activation_table.h"
#include "train/bench.h"
#include "machine/describe.h"
#include "machine/peak.h"

namespace meshtrain::cli {

namespace {

// One precision's measured peak and the best recorded for this machine. A precision that
// runs on another precision's GEMM (fp16 always, bf16 without bf16 units) has that one's
// peak; for bf16 the rate of its widened GEMM is printed beside it.
void print_peak(int threads, kernels::Precision p) {
  const char* name = kernels::precision_name(p);
  const kernels::Precision basis = kernels::peak_precision(p);
  if (basis != p) {
    std::printf("%s: runs on the %s GEMM, so its MFU is taken against the %s peak (best recorded %.1f)\n",
                name, kernels::precision_name(basis), kernels::precision_name(basis),
                machine::cached_gemm_peak_gflops(threads, false, basis));
    if (p == kernels::Precision::kBf16)
      std::printf("  no bf16 units here: the widened bf16 GEMM runs at %.1f GFLOP/s\n",
                  machine::measure_bf16_gemm_gflops(threads));
    return;
  }
  const double gflops = machine::measure_gemm_peak_gflops(threads, p);
  machine::record_gemm_peak_gflops(threads, gflops, p);
  std::printf("%s GEMM peak: %.1f GFLOP/s on %d threads (best of %s); MFU uses the best recorded: %.1f\n", name,
              gflops, threads, machine::peak_shapes().c_str(), machine::cached_gemm_peak_gflops(threads, false, p));
}

}  // namespace

Command add_bench_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("bench", "Measure the machine and the engine");
  cmd->require_subcommand(1);
  auto peak_threads = std::make_shared<int>(0);
  auto peak_precision = std::make_shared<std::vector<std::string>>(std::vector<std::string>{"fp32", "bf16"});
  auto* peak = cmd->add_subcommand("peak", "Measure the fp32 and bf16 GEMM peaks (GFLOP/s) and record them");
  peak->add_option("--threads", *peak_threads, "Threads (0 = all cores)");
  peak->add_option("--precision", *peak_precision, "fp32, bf16 or both (comma-separated)")
      ->delimiter(',')
      ->capture_default_str();

  auto o = std::make_shared<train::TrainOptions>();
  o->model_preset = "gpt2-124m";
  o->micro_batch = 8;
  o->seq_len = 256;
  auto warmup = std::make_shared<int>(1), steps = std::make_shared<int>(3);
  auto* step = cmd->add_subcommand("step", "Time training steps on random tokens");
  add_config_option(step);
  add_model_flags(step, o.get());
  step->add_option("--warmup", *warmup, "Untimed steps first")->capture_default_str();
  step->add_option("--steps", *steps, "Timed steps (median reported)")->capture_default_str();

  auto act = std::make_shared<train::TrainOptions>();
  act->model_preset = "gpt2-124m";
  act->micro_batch = 1;
  act->seq_len = 1024;
  auto act_tp = std::make_shared<int>(2);
  auto* activations = cmd->add_subcommand(
      "activations", "Activation bytes per layer, measured, beside Korthikanti et al. 2022");
  add_model_flags(activations, act.get());
  activations->add_option("--tp", *act_tp, "Tensor-parallel size of the tp rows")->capture_default_str();

  return {cmd, [=] {
            if (activations->parsed()) {
              model::GptConfig config;
              int T = 0;
              Status s = train::resolve_model(*act, &config, &T);
              if (s.is_ok()) s = model::validate_tp(config, *act_tp);
              if (!s.is_ok()) return fail(s);
              std::printf("%s", train::activation_table(config, act->micro_batch, T, *act_tp).c_str());
              return 0;
            }
            if (peak->parsed()) {
              int threads = *peak_threads > 0 ? *peak_threads
                                              : (int)std::max(1u, std::thread::hardware_concurrency());
              std::vector<kernels::Precision> precisions;
              for (const std::string& name : *peak_precision) {
                kernels::Precision p;
                if (Status s = train::parse_precision_flag(name, &p); !s.is_ok()) return fail(s);
                precisions.push_back(p);
              }
              std::printf("%s", machine::machine_summary().c_str());
              for (kernels::Precision p : precisions) print_peak(threads, p);
              std::printf("cache: %s\n", machine::peak_cache_path().c_str());
              return 0;
            }
            Status s = train::bench_step(*o, *warmup, *steps);
            return s.is_ok() ? 0 : fail(s);
          }};
}

}  // namespace meshtrain::cli
