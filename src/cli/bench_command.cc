#include <cstdio>
#include <thread>

#include "cli/commands.h"
#include "cli/config_file.h"
#include "train/bench.h"
#include "train/peak.h"

namespace meshtrain::cli {

Command add_bench_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("bench", "Measure the machine and the engine");
  cmd->require_subcommand(1);
  auto peak_threads = std::make_shared<int>(0);
  auto* peak = cmd->add_subcommand("peak", "Measure the fp32 GEMM peak (GFLOP/s) and record it");
  peak->add_option("--threads", *peak_threads, "Threads (0 = all cores)");

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

  return {cmd, [=] {
            if (peak->parsed()) {
              int threads = *peak_threads > 0 ? *peak_threads
                                              : (int)std::max(1u, std::thread::hardware_concurrency());
              double gflops = train::measure_gemm_peak_gflops(threads);
              train::record_gemm_peak_gflops(threads, gflops);
              std::printf("fp32 GEMM peak: %.1f GFLOP/s on %d threads (2048^3 sgemm, best of 7); "
                          "MFU uses the best recorded: %.1f\n",
                          gflops, threads, train::cached_gemm_peak_gflops(threads, false));
              return 0;
            }
            Status s = train::bench_step(*o, *warmup, *steps);
            return s.is_ok() ? 0 : fail(s);
          }};
}

}  // namespace meshtrain::cli
