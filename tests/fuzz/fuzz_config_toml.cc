// A --config TOML file: parse_config_toml and config_tokens against a subcommand with one
// option of each kind the engine's commands use. What the file check accepts must parse as
// flags (the file check converts every value through its option, so the real parse cannot
// fail later with a message that does not name the file), and the resolved config.toml of
// the parsed options (what a run folder keeps) must be accepted again and resolve the same.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <memory>
#include <utility>
#include <string>
#include <vector>

#include "cli/config_file.h"
#include "fuzz_util.h"

namespace meshtrain::fuzz {
namespace {

// The keys of configs/*.toml and the kinds of option the engine's commands have: ints,
// a checked int, an unsigned 64-bit seed, floats and doubles, strings, a string from a
// set, a flag and a comma-separated list.
struct Options {
  int layers = 2, heads = 4, dim = 64, seq_len = 64, micro_batch = 8, grad_accum = 1, steps = 50;
  int warmup_steps = 0, eval_every = 0, save_every = 0, tp = 1, pp = 1, dp = 0, zero = 0;
  uint64_t seed = 1337;
  float lr = 6e-4f, min_lr = 6e-5f, weight_decay = 0.1f, beta1 = 0.9f, beta2 = 0.95f, grad_clip = 1;
  double bucket_mb = 25;
  std::string model = "tiny", precision = "fp32", out;
  bool quiet = false;
  std::vector<int> stage_layers;
};

// A `meshtrain`-like app with a `train` subcommand bound to `o`.
std::unique_ptr<CLI::App> make_app(Options* o, CLI::App** train) {
  auto app = std::make_unique<CLI::App>("fuzz");
  CLI::App* t = app->add_subcommand("train");
  cli::add_config_option(t);
  for (auto [name, v] : {std::pair{"--layers", &o->layers}, {"--heads", &o->heads}, {"--dim", &o->dim},
                         {"--seq-len", &o->seq_len}, {"--grad-accum", &o->grad_accum}, {"--steps", &o->steps},
                         {"--warmup-steps", &o->warmup_steps}, {"--eval-every", &o->eval_every},
                         {"--save-every", &o->save_every}, {"--tp", &o->tp}, {"--pp", &o->pp}, {"--dp", &o->dp}})
    t->add_option(name, *v)->capture_default_str();
  for (auto [name, v] : {std::pair{"--lr", &o->lr}, {"--min-lr", &o->min_lr}, {"--weight-decay", &o->weight_decay},
                         {"--beta1", &o->beta1}, {"--beta2", &o->beta2}, {"--grad-clip", &o->grad_clip}})
    t->add_option(name, *v)->capture_default_str();
  t->add_option("--micro-batch", o->micro_batch)->check(CLI::PositiveNumber)->capture_default_str();
  t->add_option("--zero", o->zero)->check(CLI::Range(0, 3))->capture_default_str();
  t->add_option("--seed", o->seed)->capture_default_str();
  t->add_option("--bucket-mb", o->bucket_mb)->capture_default_str();
  t->add_option("--model", o->model)->capture_default_str();
  t->add_option("--precision", o->precision)->check(CLI::IsMember({"fp32", "bf16"}))->capture_default_str();
  t->add_option("--out", o->out);
  t->add_flag("--quiet", o->quiet);
  t->add_option("--stage-layers", o->stage_layers)->delimiter(',');
  *train = t;
  return app;
}

// Expands `text` as a config file of `train`, parses the result; false when the file is
// refused. Any failure after the file check accepted it is a broken promise.
bool expand_and_parse(const std::string& text, Options* o, CLI::App** train, std::unique_ptr<CLI::App>* app) {
  *app = make_app(o, train);
  std::vector<CLI::ConfigItem> items;
  if (!cli::parse_config_toml(text, "run.toml", &items).is_ok()) return false;
  std::vector<std::string> tokens;
  if (!cli::config_tokens(*train, items, {"train"}, 1, "run.toml", &tokens).is_ok()) return false;
  std::vector<std::string> args = {"train"};
  args.insert(args.end(), tokens.begin(), tokens.end());
  std::reverse(args.begin(), args.end());  // CLI11 takes a reversed vector
  try {
    (*app)->parse(args);
  } catch (const CLI::ParseError& e) {
    broken_promise(std::string("the file check accepted values that CLI11 refuses: ") + e.what());
  }
  return true;
}

}  // namespace
}  // namespace meshtrain::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace meshtrain::fuzz;
  Options first;
  CLI::App* train = nullptr;
  std::unique_ptr<CLI::App> app;
  if (!expand_and_parse(std::string(as_text(data, size)), &first, &train, &app)) return 0;
  const std::string resolved = meshtrain::cli::resolved_config_toml(train, {});
  Options again;
  CLI::App* train2 = nullptr;
  std::unique_ptr<CLI::App> app2;
  if (!expand_and_parse(resolved, &again, &train2, &app2))
    broken_promise("the resolved config.toml is refused:\n" + resolved);
  // A value the reader cannot give back is left out with a comment: then the rerun differs.
  if (resolved.find(": not written") != std::string::npos) return 0;
  // Compared as text, which also holds for NaN values.
  const std::string resolved_again = meshtrain::cli::resolved_config_toml(train2, {});
  if (resolved_again != resolved)
    broken_promise("the resolved config.toml gives other values:\n" + resolved + "---\n" + resolved_again);
  return 0;
}
