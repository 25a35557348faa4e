// End-to-end tests of the meshtrain command line as a practitioner uses it day to day:
// --config TOML files (keys, overrides, the run folder's config.toml, errors, the presets in
// configs/), generate (seeded, greedy, streamed, from every model format), eval against the
// training run's own validation loss, llm.c export and --init-from, plot, and the progress
// output when stdout is not a terminal. Like test_cli.cc, each test runs the real binary in
// its own temporary folder on tiny models with a fixed peak and two threads; one small run
// (and its two exports) is trained once for the whole suite.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_test_util.h"
#include "data/token_file.h"

namespace meshtrain::test_cli_practitioner {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

using cli_test::bits;
using cli_test::describe;
using cli_test::expect_failure;
using cli_test::kBinary;
using cli_test::kPid;
using cli_test::kTiny;
using cli_test::lines_of;
using cli_test::Metrics;
using cli_test::read_file;
using cli_test::read_metrics;
using cli_test::run;
using cli_test::RunResult;
using cli_test::write_file;

// The shape of the suite's base run (kTiny) and its evaluation: B rows of T tokens, M
// micro-batches of val.bin.
constexpr int kB = 2, kT = 32, kEvalBatches = 3;

// ---- Fixture ---------------------------------------------------------------------------

class CliPractitioner : public cli_test::CliTest {
 protected:
  // The Brown corpus, then a 2-step tiny run and its exports as .safetensors and llm.c .bin,
  // made once per build (cli_test::shared_once) and read by every test of the suite.
  static void SetUpTestSuite() {
    CliTest::SetUpTestSuite();
    base_ok_ = false;
    if (!prep_ok_) return;
    base_dir_ = cli_test::shared_once("practitioner_base", [](const std::string& dir) {
      const std::string base = dir + "/base";
      for (const std::string& cmd :
           {train(kTiny + " --steps 2 --lr 3e-3 --eval-batches " + std::to_string(kEvalBatches) +
                  " --quiet --out " + base),
            kBinary + " export --checkpoint " + base + " --out " + dir + "/base.safetensors",
            kBinary + " export --checkpoint " + base + " --format llmc --out " + dir + "/base.bin"}) {
        RunResult r = run(cmd);
        if (r.exit_code != 0) return cmd + "\n" + describe(r);
      }
      return std::string();
    }, &base_error_);
    base_ok_ = !base_dir_.empty();
  }
  void SetUp() override {
    CliTest::SetUp();
    if (HasFatalFailure()) return;
    ASSERT_TRUE(base_ok_) << "the suite's base run failed:\n" << base_error_;
  }

  static std::string base_run() { return base_dir_ + "/base"; }
  static std::string base_safetensors() { return base_dir_ + "/base.safetensors"; }
  static std::string base_llmc() { return base_dir_ + "/base.bin"; }

  // One thread: decoding a tiny model is serial work, and spinning OpenMP workers only
  // slow it down on a loaded machine.
  static std::string generate(const std::string& model, const std::string& args) {
    return kBinary + " generate --checkpoint " + model + " --threads 1 " + args;
  }

  // `meshtrain serve` on the base run in the background, its output in `out`.
  using Served = cli_test::Served;
  Served start_serve(const std::string& out, const std::string& args) {
    return cli_test::start_serve("--checkpoint " + base_run() + " --port 0 --threads 1 " + args, out);
  }
  // A Python client script (its argument the server's URL): `clients` threads send `requests`
  // completions each, request k with seed seed0 + k, then the same requests one at a time;
  // it prints {"alone": [k's text], "concurrent": [[client c's k's text]]}.
  void write_clients_script(const std::string& file, int clients, int requests, int seed0) {
    write_file(file, R"(import json, sys, threading, urllib.request
url, results = sys.argv[1], {}
clients, requests, seed0 = )" + std::to_string(clients) + ", " + std::to_string(requests) + ", " + std::to_string(seed0) + R"(
def ask(seed):
    body = json.dumps({"prompt": "It was", "max_tokens": 5, "temperature": 1.0, "top_k": 0, "seed": seed}).encode()
    with urllib.request.urlopen(urllib.request.Request(url + "/v1/completions", data=body)) as r:
        return json.load(r)["choices"][0]["text"]
def client(c):
    for k in range(requests):
        results[(c, k)] = ask(seed0 + k)
threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
for t in threads: t.start()
for t in threads: t.join()
print(json.dumps({"alone": [ask(seed0 + k) for k in range(requests)],
                  "concurrent": [[results[(c, k)] for k in range(requests)] for c in range(clients)]}))
)");
  }
  void stop_serve(const Served& s, const std::string& out) { cli_test::stop_serve(s, out); }


  static inline std::string base_dir_;
  static inline bool base_ok_ = false;
  static inline std::string base_error_;
};

json read_json(const std::string& path) {
  json j = json::parse(read_file(path), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) ADD_FAILURE() << path << " is not JSON";
  return j;
}

// Step and validation records of two runs have the same bits.
void expect_same_metrics(const Metrics& a, const Metrics& b) {
  ASSERT_EQ(a.steps.size(), b.steps.size());
  for (size_t i = 0; i < a.steps.size(); i++) {
    EXPECT_EQ(a.steps[i]["step"], b.steps[i]["step"]);
    for (const char* key : {"loss", "grad_norm", "lr"})
      EXPECT_EQ(bits(a.steps[i][key]), bits(b.steps[i][key]))
          << key << " at step " << i + 1 << ": " << a.steps[i][key] << " vs " << b.steps[i][key];
    EXPECT_EQ(a.steps[i]["tokens"], b.steps[i]["tokens"]);
  }
  ASSERT_EQ(a.evals.size(), b.evals.size());
  for (size_t i = 0; i < a.evals.size(); i++) {
    EXPECT_EQ(a.evals[i]["step"], b.evals[i]["step"]);
    EXPECT_EQ(bits(a.evals[i]["val_loss"]), bits(b.evals[i]["val_loss"]));
  }
}

// The `key = value` lines of a flat TOML file (comments and blank lines skipped, quotes
// of string values removed).
std::vector<std::pair<std::string, std::string>> toml_entries(const std::string& path) {
  std::vector<std::pair<std::string, std::string>> out;
  auto trim = [](std::string s) {
    const auto b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t\r");
    return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
  };
  for (const auto& line : lines_of(read_file(path))) {
    const std::string t = trim(line);
    if (t.empty() || t[0] == '#') continue;
    const auto eq = t.find('=');
    if (eq == std::string::npos) continue;
    std::string value = trim(t.substr(eq + 1));
    if (const auto hash = value.find(" #"); hash != std::string::npos) value = trim(value.substr(0, hash));
    if (value.size() >= 2 && value.front() == '"' && value.back() == '"')
      value = value.substr(1, value.size() - 2);
    out.emplace_back(trim(t.substr(0, eq)), value);
  }
  return out;
}

std::string underscores(std::string key) {
  std::replace(key.begin(), key.end(), '-', '_');
  return key;
}

// ---- 1. Config files -------------------------------------------------------------------

TEST_F(CliPractitioner, ConfigFileKeysApplyAndFlagsWin) {
  // Keys with underscores and with dashes, a comment, a flag set to true.
  write_file(path("run.toml"),
             "# a tiny run\n"
             "model = \"tiny\"\n"
             "micro_batch = 2\n"
             "seq-len = 32\n"
             "vocab = 50257\n"
             "steps = 3\n"
             "lr = 2e-3\n"
             "warmup_steps = 1\n"
             "eval-batches = 1\n"
             "quiet = true\n");
  RunResult r = run(train("--config " + path("run.toml") + " --out " + path("A")));
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_EQ(r.out, "") << "quiet = true in the file";
  json a = read_json(path("A/config.json"));
  EXPECT_EQ(a["model"], "tiny");
  EXPECT_EQ(a["micro_batch"], 2);
  EXPECT_EQ(a["seq_len"], 32);
  EXPECT_EQ(a["steps"], 3);
  EXPECT_FLOAT_EQ(a["lr"].get<float>(), 2e-3f);
  EXPECT_EQ(a["warmup_steps"], 1);
  EXPECT_EQ(a["eval_batches"], 1);
  Metrics ma = read_metrics(path("A/metrics.jsonl"));
  ASSERT_EQ(ma.steps.size(), 3u);
  EXPECT_EQ(ma.steps[2]["tokens"], 3 * 2 * 32);
  // warmup 1: step 1 runs at the full peak LR of the file.
  EXPECT_FLOAT_EQ(ma.steps[0]["lr"].get<float>(), 2e-3f);

  // Flags on the command line win over the file, before or after --config, with a space
  // or with '='.
  r = run(train("--micro-batch 1 --config " + path("run.toml") +
                " --steps=2 --lr 1e-3 --out " + path("B")));
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  json b = read_json(path("B/config.json"));
  EXPECT_EQ(b["micro_batch"], 1);
  EXPECT_EQ(b["steps"], 2);
  EXPECT_FLOAT_EQ(b["lr"].get<float>(), 1e-3f);
  EXPECT_EQ(b["seq_len"], 32) << "keys not overridden still come from the file";
  EXPECT_EQ(b["warmup_steps"], 1);
  Metrics mb = read_metrics(path("B/metrics.jsonl"));
  ASSERT_EQ(mb.steps.size(), 2u);
  EXPECT_EQ(mb.steps[1]["tokens"], 2 * 1 * 32);
  EXPECT_FLOAT_EQ(mb.steps[0]["lr"].get<float>(), 1e-3f);

  // --config=FILE works too.
  r = run(train("--config=" + path("run.toml") + " --steps 1 --out " + path("C")));
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_EQ(read_json(path("C/config.json"))["seq_len"], 32);
}

TEST_F(CliPractitioner, RunFolderConfigTomlReproducesTheRun) {
  RunResult r = run(train(kTiny + " --steps 3 --lr 2e-3 --warmup-steps 1 --seed 7"
                                  " --eval-every 2 --eval-batches 2 --quiet --out " + path("A")));
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  const std::string toml = read_file(path("A/config.toml"));
  for (const char* line : {"micro-batch = 2\n", "seq-len = 32\n", "seed = 7\n", "steps = 3\n",
                           "threads = 2\n", "peak-gflops = 100\n"})
    EXPECT_NE(toml.find(line), std::string::npos) << line << " in\n" << toml;
  EXPECT_NE(toml.find("data = \"" + corpus_ + "\"\n"), std::string::npos) << toml;

  // Nothing but the file and a new run folder: the data, shape, seed, schedule, threads
  // and peak all come from config.toml.
  r = run(kBinary + " train --config " + path("A/config.toml") + " --quiet --out " + path("B"));
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  Metrics ma = read_metrics(path("A/metrics.jsonl"));
  Metrics mb = read_metrics(path("B/metrics.jsonl"));
  ASSERT_EQ(ma.steps.size(), 3u);
  ASSERT_EQ(ma.evals.size(), 2u);
  expect_same_metrics(ma, mb);

  // B's config.toml and config.json are A's but for the run folder.
  std::string expected = toml;
  const std::string out_a = "out = \"" + path("A") + "\"", out_b = "out = \"" + path("B") + "\"";
  ASSERT_NE(expected.find(out_a), std::string::npos) << toml;
  expected.replace(expected.find(out_a), out_a.size(), out_b);
  EXPECT_EQ(read_file(path("B/config.toml")), expected);
  json ja = read_json(path("A/config.json")), jb = read_json(path("B/config.json"));
  EXPECT_EQ(jb["out"], path("B"));
  ja.erase("out");
  jb.erase("out");
  EXPECT_EQ(ja, jb);
}

TEST_F(CliPractitioner, ConfigFileErrorsAreNamed) {
  const std::string toml = path("run.toml");
  auto with = [&](const std::string& text) {
    write_file(toml, "model = \"tiny\"\nseq-len = 32\n" + text);
    return run(train("--config " + toml + " --steps 1 --out " + path("never")));
  };
  expect_failure(with("stpes = 3\n"),
                 {"unknown key 'stpes'", toml, "did you mean 'steps'?"});
  expect_failure(with("lr_min = 1e-4\n"), {"unknown key 'lr_min'", "did you mean 'min-lr'?"});
  expect_failure(with("warmpu-steps = 4\n"), {"unknown key 'warmpu-steps'", "'warmup-steps'"});
  // Nothing close: no suggestion.
  RunResult r = with("colour = \"red\"\n");
  expect_failure(r, {"unknown key 'colour'"});
  EXPECT_EQ(r.err.find("did you mean"), std::string::npos) << r.err;
  // A value of the wrong type names the key and the value.
  expect_failure(with("lr = \"abc\"\n"), {"lr", "abc"});
  expect_failure(with("micro_batch = 2.5\n"), {"micro-batch", "2.5"});
  expect_failure(with("quiet = 1\n"), {"quiet", "true or false"});
  // A syntax error names the line and the column, and shows the line; an unterminated
  // string is not blamed on a '#' that is not there.
  r = with("out = \"runs/abc\n");
  expect_failure(r, {"cannot parse " + toml + " (line 3, column", "in: out = \"runs/abc"});
  EXPECT_EQ(r.err.find('#'), std::string::npos) << r.err;
  expect_failure(with("steps = 3\nsteps = 4\n"), {"(line 4, column", "steps"});
  // A '#' inside quotes is part of the value: the file reads on to the next key.
  expect_failure(with("out = \"" + path("never#1") + "\"\nstpes = 3\n"), {"unknown key 'stpes'"});
  // Sections are refused rather than silently flattened.
  expect_failure(with("[optimizer]\nlr = 1e-3\n"), {"sections", "lr"});
  expect_failure(with("optimizer.lr = 1e-3\n"), {"sections"});
  // A missing file is named.
  expect_failure(run(train("--config " + path("absent.toml") + " --steps 1")),
                 {path("absent.toml"), "not found"});
  // None of them trained or created the run folder.
  EXPECT_FALSE(fs::exists(path("never")));
}

TEST_F(CliPractitioner, PresetConfigsAreAccepted) {
  const fs::path configs = fs::path(MESHTRAIN_SOURCE_DIR) / "configs";
  std::vector<fs::path> files;
  if (fs::is_directory(configs))
    for (const auto& e : fs::directory_iterator(configs))
      if (e.path().extension() == ".toml") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  ASSERT_TRUE(std::count(files.begin(), files.end(), configs / "tiny.toml"))
      << "no configs/tiny.toml in " << configs;

  // Fewer tokens than any preset's global batch.
  std::vector<data::Token> tokens;
  ASSERT_TRUE(data::read_token_file(corpus_ + "/train.bin", &tokens).is_ok());
  tokens.resize(100);
  fs::create_directories(path("few"));
  ASSERT_TRUE(data::write_token_file(path("few/train.bin"), tokens).is_ok());

  for (const fs::path& file : files) {
    SCOPED_TRACE(file.string());
    const std::string stem = file.stem().string();
    if (stem == "tiny") {
      // Trains: 2 steps, one evaluation batch.
      const std::string out = path("run_" + stem);
      RunResult r = run(train("--config " + file.string() + " --steps 2 --eval-batches 1"
                              " --quiet --out " + out));
      ASSERT_EQ(r.exit_code, 0) << describe(r);
      Metrics m = read_metrics(out + "/metrics.jsonl");
      ASSERT_EQ(m.steps.size(), 2u);
      EXPECT_TRUE(std::isfinite(m.steps[1]["loss"].get<double>()));
      EXPECT_EQ(m.evals.size(), 1u);
      // Every key of the file reached the run's resolved options.
      json config = read_json(out + "/config.json");
      for (const auto& [key, value] : toml_entries(file.string())) {
        const std::string k = underscores(key);
        if (k == "steps" || k == "eval_batches" || !config.contains(k)) continue;
        if (config[k].is_string())
          EXPECT_EQ(config[k].get<std::string>(), value) << key;
        else
          EXPECT_FLOAT_EQ(config[k].get<float>(), std::stof(value)) << key;
      }
      continue;
    }
    // The big presets: the data check comes before the model is allocated, so too little
    // data proves the file parsed and the model resolved, without the memory of a run.
    const std::string out = path("run_" + stem);
    RunResult r = run(train("--config " + file.string() + " --steps 1 --out " + out,
                            path("few")));
    expect_failure(r, {"100 tokens", "fewer than one global batch"});
    EXPECT_EQ(r.err.find("unknown key"), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(out)) << "the failed run created its folder";
  }
}

// A key with no value ("lr =", or lr = "") is taken as 0 today: the run trains silently
// with --lr 0 and config.toml records "lr = ". Disabled until expand_config_args() rejects
// empty values (see the report).
TEST_F(CliPractitioner, ConfigKeyWithoutValueIsRejected) {
  for (const std::string line : {"lr =\n", "lr = \"\"\n"}) {
    write_file(path("run.toml"), "model = \"tiny\"\nseq-len = 32\nmicro-batch = 2\n" + line);
    expect_failure(run(train("--config " + path("run.toml") + " --steps 1 --quiet")),
                   {"lr", path("run.toml")});
  }
}

// "config" and "help" in a config file get "unknown key 'config' (did you mean 'config'?)".
// Disabled until unknown_key() leaves out the names it refuses (see the report).
TEST_F(CliPractitioner, ConfigKeyConfigIsRefusedWithoutSelfSuggestion) {
  write_file(path("run.toml"), "config = \"other.toml\"\n");
  RunResult r = run(train(kTiny + " --config " + path("run.toml") + " --steps 1 --quiet"));
  expect_failure(r, {"config"});
  EXPECT_EQ(r.err.find("did you mean 'config'"), std::string::npos) << r.err;
}

// `bench step --config F` looks the keys up among `bench`'s options, not `step`'s, so every
// key is "unknown". Disabled until expand_config_args() descends into nested subcommands
// (see the report).
TEST_F(CliPractitioner, BenchStepAcceptsConfig) {
  write_file(path("bench.toml"),
             "model = \"tiny\"\nseq-len = 16\nmicro-batch = 1\nwarmup = 0\nsteps = 1\n");
  RunResult r = run(kBinary + " bench step --config " + path("bench.toml") +
                    " --peak-gflops 100 --threads 2");
  EXPECT_EQ(r.exit_code, 0) << describe(r);
}

// ---- 2. generate -----------------------------------------------------------------------

TEST_F(CliPractitioner, GenerateIsSeededGreedyAndStreamed) {
  const std::string prompt = "The jury said";
  const std::string sample = "--prompt '" + prompt + "' --max-new-tokens 12 --temperature 1 --top-k 0";
  RunResult a = run(generate(base_run(), sample + " --seed 1"));
  ASSERT_EQ(a.exit_code, 0) << describe(a);
  // Streamed: the prompt first, then the continuation, then a newline.
  EXPECT_TRUE(a.out.starts_with(prompt)) << a.out;
  EXPECT_GT(a.out.size(), prompt.size() + 1) << a.out;
  EXPECT_TRUE(a.out.ends_with("\n")) << a.out;
  RunResult again = run(generate(base_run(), sample + " --seed 1"));
  EXPECT_EQ(again.out, a.out) << "same seed, other text";
  RunResult other = run(generate(base_run(), sample + " --seed 2"));
  ASSERT_EQ(other.exit_code, 0) << describe(other);
  EXPECT_NE(other.out, a.out) << "another seed at temperature 1 gave the same text";

  // Greedy ignores the seed and equals top-k 1 sampling.
  const std::string greedy = "--prompt '" + prompt + "' --max-new-tokens 12 --temperature 0";
  RunResult g1 = run(generate(base_run(), greedy + " --seed 1"));
  ASSERT_EQ(g1.exit_code, 0) << describe(g1);
  EXPECT_TRUE(g1.out.starts_with(prompt)) << g1.out;
  RunResult g2 = run(generate(base_run(), greedy + " --seed 2"));
  EXPECT_EQ(g2.out, g1.out);
  RunResult k1 = run(generate(base_run(), "--prompt '" + prompt +
                                              "' --max-new-tokens 12 --temperature 1 --top-k 1"));
  EXPECT_EQ(k1.out, g1.out) << "top-k 1 is not the greedy choice";
}

TEST_F(CliPractitioner, GenerateErrorsAreNamed) {
  // The base model has 32 positions; 40 words are 40 tokens.
  std::string long_prompt;
  for (int i = 0; i < 40; i++) long_prompt += " the";
  RunResult r = run(generate(base_run(), "--prompt '" + long_prompt + "' --max-new-tokens 1"));
  expect_failure(r, {"context", "32"});
  EXPECT_EQ(r.out, "") << "nothing is streamed before the check";
  // Prompt plus new tokens past the context.
  expect_failure(run(generate(base_run(), "--prompt 'Hello' --max-new-tokens 40")), {"context"});

  expect_failure(run(generate(path("nowhere"), "--prompt hi")),
                 {path("nowhere"), "no checkpoint found"});
  write_file(path("junk.bin"), std::string(3000, '\x7f'));
  expect_failure(run(generate(path("junk.bin"), "--prompt hi")), {path("junk.bin")});
  expect_failure(run(generate(base_run(), "--prompt hi --temperature -1")), {"--temperature"});
}

// A file of prompts of different lengths, as JSON lines, decoded together: each prompt's
// continuation is the one it gets alone with the same seed (top-p sampling); each token has
// its log-probability and its most likely alternatives; a stop string ends the text before
// it, and a prompt that stops early leaves the batch for the next to join.
TEST_F(CliPractitioner, GeneratePromptsFileJsonLogprobsAndStop) {
  const std::vector<std::string> prompts = {"It was", "The jury said that the city", "He"};
  std::string file;
  for (const std::string& p : prompts) file += p + "\n";
  write_file(path("prompts.txt"), file);
  const std::string flags = " --max-new-tokens 8 --temperature 0.9 --top-k 0 --top-p 0.9 --seed 3 --json";
  RunResult all = run(generate(base_run(), "--prompts " + path("prompts.txt") + flags + " --logprobs 2"));
  ASSERT_EQ(all.exit_code, 0) << describe(all);
  const std::vector<std::string> lines = lines_of(all.out);
  ASSERT_EQ(lines.size(), prompts.size()) << all.out;
  for (size_t i = 0; i < prompts.size(); i++) {
    SCOPED_TRACE(prompts[i]);
    const json j = json::parse(lines[i]);
    EXPECT_EQ(j["index"], (int)i);
    EXPECT_EQ(j["prompt"], prompts[i]);
    EXPECT_EQ(j["finish_reason"], "length");
    ASSERT_EQ(j["tokens"].size(), 8u);
    RunResult alone = run(generate(base_run(), "--prompt '" + prompts[i] + "'" + flags));
    ASSERT_EQ(alone.exit_code, 0) << describe(alone);
    const json a = json::parse(alone.out);
    EXPECT_EQ(a["text"], j["text"]);
    EXPECT_EQ(a["tokens"], j["tokens"]);
    EXPECT_TRUE(a["logprobs"].is_null());
    const json& lp = j["logprobs"];
    ASSERT_EQ(lp["token_logprobs"].size(), 8u);
    ASSERT_EQ(lp["top_logprobs"].size(), 8u);
    for (size_t t = 0; t < 8; t++) {
      const double mine = lp["token_logprobs"][t].get<double>();
      EXPECT_LE(mine, 0.0);
      ASSERT_EQ(lp["top_logprobs"][t].size(), 2u);
      double best = -1e300;
      for (const auto& [piece, v] : lp["top_logprobs"][t].items()) best = std::max(best, v.get<double>());
      EXPECT_LE(mine, best + 1e-12) << "token " << t << ": the most likely alternative is at least as likely";
    }
  }
  // A stop string from the first continuation's middle: the text ends before it.
  const json first = json::parse(lines[0]);
  const std::string text = first["text"];
  ASSERT_GE(text.size(), 4u);
  size_t at = text.size() / 2;  // two plain characters that a shell passes as they are
  auto plain = [](char ch) { return ch >= 0x20 && ch < 0x7f && std::string("'\"$`\\").find(ch) == std::string::npos; };
  while (at + 2 < text.size() && !(plain(text[at]) && plain(text[at + 1]))) at++;
  const std::string stop = text.substr(at, 2);
  write_file(path("stop.txt"), stop);
  RunResult stopped = run(generate(base_run(), "--prompt 'It was'" + flags + " --stop \"$(cat " + path("stop.txt") + ")\""));
  ASSERT_EQ(stopped.exit_code, 0) << describe(stopped);
  const json st = json::parse(stopped.out);
  EXPECT_EQ(st["text"], text.substr(0, text.find(stop))) << "stop " << json(stop).dump();
  EXPECT_EQ(st["finish_reason"], "stop");

  // Two at a time with that stop string: the first prompt leaves the batch at its stop and
  // the third joins in its place between steps. Each line is still its prompt's text alone.
  const std::string with_stop = flags + " --stop \"$(cat " + path("stop.txt") + ")\"";
  RunResult paired = run(generate(base_run(), "--prompts " + path("prompts.txt") + with_stop + " --batch 2"));
  ASSERT_EQ(paired.exit_code, 0) << describe(paired);
  ASSERT_EQ(lines_of(paired.out).size(), prompts.size()) << paired.out;
  for (size_t i = 0; i < prompts.size(); i++) {
    RunResult alone = run(generate(base_run(), "--prompt '" + prompts[i] + "'" + with_stop));
    ASSERT_EQ(alone.exit_code, 0) << describe(alone);
    const json a = json::parse(alone.out), b = json::parse(lines_of(paired.out)[i]);
    EXPECT_EQ(a["text"], b["text"]) << prompts[i];
    EXPECT_EQ(a["finish_reason"], b["finish_reason"]) << prompts[i];
  }
  EXPECT_EQ(json::parse(lines_of(paired.out)[0])["finish_reason"], "stop");
  expect_failure(run(generate(base_run(), "--prompts " + path("prompts.txt") + " --batch 0")), {"--batch must be >= 1"});

  write_file(path("gap.txt"), "one\n\nthree\n");
  expect_failure(run(generate(base_run(), "--prompts " + path("gap.txt"))), {"line 2 is empty"});
  expect_failure(run(generate(base_run(), "--prompts " + path("none.txt"))), {path("none.txt"), "cannot open"});
  expect_failure(run(generate(base_run(), "--prompt hi --top-p 0")), {"--top-p must be in (0, 1]"});
  expect_failure(run(generate(base_run(), "--prompt hi --logprobs 2")), {"--logprobs needs --json"});
}

// generate on tensor-, pipeline- and data-parallel layouts (generate starts its ranks under
// mpirun itself): the same text as one rank, for a file of prompts (dp replicas each taking
// a share, printed in the file's order) and for one streamed prompt. Layouts the model cannot
// take are refused on every rank before any token.
TEST_F(CliPractitioner, GenerateOnAnyLayoutPrintsOneRanksText) {
  write_file(path("layout_prompts.txt"), "It was\nThe jury said that the city\nHe\n");
  const std::string flags = "--prompts " + path("layout_prompts.txt") +
                            " --max-new-tokens 8 --temperature 0.9 --top-k 0 --seed 3 --json";
  RunResult one = run(generate(base_run(), flags));
  ASSERT_EQ(one.exit_code, 0) << describe(one);
  ASSERT_EQ(lines_of(one.out).size(), 3u) << one.out;
  for (const std::string layout : {"--tp 2", "--pp 2 --micro-batches 2", "--tp 2 --pp 2", "--dp 3", "--dp 2 --tp 2"}) {
    RunResult r = run(generate(base_run(), flags + " " + layout));
    ASSERT_EQ(r.exit_code, 0) << layout << ": " << describe(r);
    EXPECT_EQ(r.out, one.out) << layout;
  }
  const std::string single = "--prompt 'It was' --max-new-tokens 6 --seed 2";
  RunResult alone = run(generate(base_run(), single));
  RunResult split = run(generate(base_run(), single + " --tp 2 --pp 2"));
  ASSERT_EQ(split.exit_code, 0) << describe(split);
  EXPECT_EQ(split.out, alone.out);
  // Each rank holds only its share of the weights: under a budget the whole model exceeds,
  // from a checkpoint (streamed in pieces) or a single weights file (cut after reading).
  RunResult reported = run(generate(base_run(), flags + " --tp 2 --pp 2 --memory-budget 100"));
  ASSERT_EQ(reported.exit_code, 0) << describe(reported);
  double held = 0, whole = 0;
  const size_t at = reported.err.find("weights held: ");
  ASSERT_NE(at, std::string::npos) << reported.err;
  ASSERT_EQ(std::sscanf(reported.err.c_str() + at, "weights held: %lf MB on the fullest rank, of %lf MB", &held, &whole), 2)
      << reported.err;
  // The tiny model is 97% embedding, which (tied to the head) the first stage and the last
  // both need: each rank holds its tp half of it, and a quarter of the layers.
  EXPECT_LT(held, 0.55 * whole) << reported.err;
  const std::string budget = " --memory-budget " + std::to_string((held + 0.1 * (whole - held)) / 1000);
  for (const std::string& model : {base_run(), base_safetensors()}) {
    RunResult shared = run(generate(model, flags + " --tp 2 --pp 2" + budget));
    ASSERT_EQ(shared.exit_code, 0) << model << ": " << describe(shared);
    EXPECT_EQ(shared.out, one.out) << model;
  }
  expect_failure(run(generate(base_run(), flags + " --tp 2 --pp 2 --memory-budget " + std::to_string(held / 2000))),
                 {"a rank's share of the weights", "exceeds --memory-budget", "more --tp or --pp"});
  expect_failure(run(generate(base_run(), "--prompt hi --tp 3")), {"--tp 3 must divide the model's 4 key/value heads"});
  expect_failure(run(generate(base_run(), "--prompt hi --pp 3")), {"--pp 3 is more stages than the model's 2 layers"});
}

// ZeRO-Inference through the CLI: generate with its layers streamed from a file (reading 0
// and 2 layers ahead) prints the in-memory model's text, and says what it read; so does
// serve. What streaming cannot take is refused before any token.
TEST_F(CliPractitioner, GenerateStreamsWeightsFromAFileWithTheSameText) {
  write_file(path("stream_prompts.txt"), "It was\nThe jury said that the city\n");
  const std::string flags = "--prompts " + path("stream_prompts.txt") +
                            " --max-new-tokens 6 --temperature 0.9 --top-k 0 --seed 3 --json";
  RunResult in_memory = run(generate(base_run(), flags));
  ASSERT_EQ(in_memory.exit_code, 0) << describe(in_memory);
  for (const std::string ahead : {"0", "2"}) {
    RunResult streamed = run(generate(base_run(), flags + " --offload weights=nvme --offload-dir " + path("") +
                                                      " --offload-read-ahead " + ahead));
    ASSERT_EQ(streamed.exit_code, 0) << describe(streamed);
    EXPECT_EQ(streamed.out, in_memory.out) << "read ahead " << ahead;
    // 6 steps of the 2 layers, and what was read ahead past the last (the other layer).
    EXPECT_NE(streamed.err.find("streamed weights: " + std::to_string(12 + std::min(1, std::stoi(ahead))) + " layers read"),
              std::string::npos)
        << streamed.err;
    EXPECT_NE(streamed.err.find("read-ahead " + ahead), std::string::npos) << streamed.err;
  }
  expect_failure(run(generate(base_run(), flags + " --offload weights=cpu")), {"--offload takes weights=nvme"});
  expect_failure(run(generate(base_run(), flags + " --memory-budget 0.001")),
                 {"--memory-budget 0.001 GB", "less than streaming the weights needs", "stay in memory"});
  expect_failure(run(generate(base_run(), flags + " --offload weights=nvme --tp 2")), {"run on one rank"});
  expect_failure(run(generate(base_safetensors(), flags + " --offload weights=nvme")),
                 {base_safetensors(), "single weights file"});
  const Served served = start_serve(path("serve_streamed.out"), "--offload weights=nvme");
  ASSERT_FALSE(served.url.empty()) << read_file(path("serve_streamed.out"));
  write_file(path("streamed_body.json"),
             "{\"prompt\": \"It was\", \"max_tokens\": 6, \"temperature\": 0.9, \"top_k\": 0, \"seed\": 3}");
  RunResult reply = run("curl -s " + served.url + "/v1/completions -d @" + path("streamed_body.json"));
  EXPECT_EQ(json::parse(reply.out)["choices"][0]["text"], json::parse(lines_of(in_memory.out)[0])["text"]) << reply.out;
  stop_serve(served, path("serve_streamed.out"));
  EXPECT_NE(read_file(path("serve_streamed.out")).find("streamed weights: "), std::string::npos);
}

// `meshtrain serve` on the base run: a completion is generate's text for the same prompt,
// seed and settings (one prompt, a list decoded together, streamed as server-sent events);
// concurrent clients, batched continuously, each get their own text; bad requests get a 400 naming the problem and the server goes on;
// SIGTERM stops it.
TEST_F(CliPractitioner, ServeAnswersAsGenerateDoesAndSurvivesBadRequests) {
  const Served served = start_serve(path("serve.out"), "");
  ASSERT_FALSE(served.url.empty()) << read_file(path("serve.out"));
  const std::string &url = served.url, out = path("serve.out");
  auto post = [&](const std::string& body) {
    write_file(path("body.json"), body);
    return run("curl -s -w '\\n%{http_code}' " + url + "/v1/completions -d @" + path("body.json"));
  };
  auto status_of = [](const RunResult& r) { return lines_of(r.out).back(); };
  auto json_of = [](const RunResult& r) { return json::parse(lines_of(r.out).front()); };

  RunResult health = run("curl -s " + url + "/health");
  EXPECT_EQ(json::parse(health.out)["status"], "ok") << health.out;
  const std::string settings = "\"max_tokens\": 6, \"temperature\": 0.9, \"top_k\": 0, \"seed\": 4";
  RunResult one = post("{\"prompt\": \"It was\", " + settings + ", \"logprobs\": 1}");
  ASSERT_EQ(status_of(one), "200") << one.out;
  const json reply = json_of(one);
  EXPECT_EQ(reply["object"], "text_completion");
  EXPECT_EQ(reply["usage"]["completion_tokens"], 6);
  RunResult alone = run(generate(base_run(), "--prompt 'It was' --max-new-tokens 6 --temperature 0.9 --top-k 0 --seed 4 --json"));
  ASSERT_EQ(alone.exit_code, 0) << describe(alone);
  const json expected = json::parse(alone.out);
  EXPECT_EQ(reply["choices"][0]["text"], expected["text"]);
  EXPECT_EQ(reply["choices"][0]["logprobs"]["token_logprobs"].size(), 6u);

  // A list of prompts: each choice as it is alone.
  RunResult two = post("{\"prompt\": [\"He\", \"It was\"], " + settings + "}");
  ASSERT_EQ(status_of(two), "200") << two.out;
  EXPECT_EQ(json_of(two)["choices"][1]["text"], expected["text"]);
  EXPECT_EQ(json_of(two)["choices"][1]["index"], 1);
  // The list's prompts were decoded together: they joined the batch in one step.
  const json stats = json::parse(run("curl -s " + url + "/stats").out);
  EXPECT_EQ(stats["largest_batch"], 2) << stats.dump();
  EXPECT_EQ(stats["joined"], 3) << stats.dump();
  EXPECT_EQ(stats["running"], 0) << stats.dump();

  // Streamed: the events' pieces make the same text, then [DONE].
  write_file(path("stream.json"), "{\"prompt\": \"It was\", " + settings + ", \"stream\": true}");
  RunResult streamed = run("curl -sN " + url + "/v1/completions -d @" + path("stream.json"));
  std::string text, finish;
  bool done = false;
  for (const std::string& line : lines_of(streamed.out)) {
    if (!line.starts_with("data: ")) continue;
    if (line == "data: [DONE]") {
      done = true;
      continue;
    }
    const json chunk = json::parse(line.substr(6));
    text += chunk["choices"][0]["text"].get<std::string>();
    if (!chunk["choices"][0]["finish_reason"].is_null()) finish = chunk["choices"][0]["finish_reason"];
  }
  EXPECT_TRUE(done) << streamed.out;
  EXPECT_EQ(text, expected["text"].get<std::string>());
  EXPECT_EQ(finish, "length");

  // Concurrent clients: 4 threads x 3 requests, each request's text its own.
  write_clients_script(path("clients.py"), 4, 3, 10);
  RunResult clients = run("python3 " + path("clients.py") + " " + url);
  ASSERT_EQ(clients.exit_code, 0) << describe(clients);
  const json many = json::parse(clients.out);
  for (int c = 0; c < 4; c++) EXPECT_EQ(many["concurrent"][c], many["alone"]) << "client " << c;
  EXPECT_EQ(json::parse(run("curl -s " + url + "/stats").out)["joined"], 3 + 1 + 12 + 3);
  EXPECT_NE(many["alone"][0], many["alone"][1]) << "other seeds, other text";

  // Bad requests: a 400 and the reason; the server goes on.
  struct Bad {
    std::string body, reason;
  };
  std::string long_prompt;
  for (int i = 0; i < 40; i++) long_prompt += " the";
  for (const Bad& b : {Bad{"{bad", "not valid JSON"}, Bad{"{\"prompt\": \"hi\", \"max_tokens\": \"x\"}", "'max_tokens' must be an integer"},
                       Bad{"{\"max_tokens\": 3}", "'prompt' is required"},
                       Bad{"{\"prompt\": \"hi\", \"max_tokens\": 100}", "context of 32 tokens"},
                       Bad{"{\"prompt\": \"" + long_prompt + "\", \"max_tokens\": 1}", "context of 32 tokens"},
                       Bad{"{\"prompt\": \"hi\", \"top_p\": 0}", "top_p must be in (0, 1]"},
                       Bad{"{\"prompt\": \"hi\", \"stream\": 1}", "'stream' must be true or false"}}) {
    SCOPED_TRACE(b.body);
    RunResult r = post(b.body);
    EXPECT_EQ(status_of(r), "400") << r.out;
    EXPECT_NE(r.out.find(b.reason), std::string::npos) << r.out;
  }
  EXPECT_EQ(json::parse(run("curl -s " + url + "/health").out)["status"], "ok");

  stop_serve(served, out);
}

// serve on a tp 2 x pp 2 model group (started under mpirun by serve itself; rank 0 serves and
// broadcasts each step's plan): a list decoded together, a stream and concurrent clients get
// one rank's text, and SIGTERM stops every rank.
TEST_F(CliPractitioner, ServeOnTensorAndPipelineRanksAnswersAsOneRank) {
  const std::string out = path("serve_tp.out");
  const Served served = start_serve(out, "--tp 2 --pp 2");
  ASSERT_FALSE(served.url.empty()) << read_file(out);
  const std::string settings = "\"max_tokens\": 6, \"temperature\": 0.9, \"top_k\": 0, \"seed\": 4";
  write_file(path("tp_body.json"), "{\"prompt\": [\"He\", \"It was\"], " + settings + "}");
  RunResult two = run("curl -s " + served.url + "/v1/completions -d @" + path("tp_body.json"));
  write_file(path("tp_prompts.txt"), "He\nIt was\n");
  RunResult alone = run(generate(base_run(), "--prompts " + path("tp_prompts.txt") +
                                                 " --max-new-tokens 6 --temperature 0.9 --top-k 0 --seed 4 --json"));
  ASSERT_EQ(alone.exit_code, 0) << describe(alone);
  const json reply = json::parse(two.out);
  for (int i = 0; i < 2; i++)
    EXPECT_EQ(reply["choices"][i]["text"], json::parse(lines_of(alone.out)[i])["text"]) << two.out;
  write_file(path("tp_stream.json"), "{\"prompt\": \"It was\", " + settings + ", \"stream\": true}");
  std::string text;
  for (const std::string& line : lines_of(run("curl -sN " + served.url + "/v1/completions -d @" + path("tp_stream.json")).out))
    if (line.starts_with("data: {")) text += json::parse(line.substr(6))["choices"][0]["text"].get<std::string>();
  EXPECT_EQ(text, json::parse(lines_of(alone.out)[1])["text"].get<std::string>());
  write_clients_script(path("tp_clients.py"), 3, 2, 20);
  RunResult clients = run("python3 " + path("tp_clients.py") + " " + served.url);
  ASSERT_EQ(clients.exit_code, 0) << describe(clients);
  const json many = json::parse(clients.out);
  for (int c = 0; c < 3; c++) EXPECT_EQ(many["concurrent"][c], many["alone"]) << "client " << c;
  stop_serve(served, out);
  // ([s]: the pattern must not match the shell that runs pgrep.)
  EXPECT_EQ(run("pgrep -f '[s]erve --checkpoint " + base_run() + " --port 0 --threads 1 --tp 2'").exit_code, 1)
      << "every rank ended";
}

TEST_F(CliPractitioner, GenerateAgreesAcrossRunSafetensorsAndLlmc) {
  for (const std::string args : {"--temperature 1 --top-k 0 --seed 5", "--temperature 0"}) {
    SCOPED_TRACE(args);
    const std::string flags = "--prompt 'It was' --max-new-tokens 10 " + args;
    RunResult from_run = run(generate(base_run(), flags));
    ASSERT_EQ(from_run.exit_code, 0) << describe(from_run);
    RunResult from_st = run(generate(base_safetensors(), flags));
    ASSERT_EQ(from_st.exit_code, 0) << describe(from_st);
    RunResult from_bin = run(generate(base_llmc(), flags));
    ASSERT_EQ(from_bin.exit_code, 0) << describe(from_bin);
    EXPECT_EQ(from_st.out, from_run.out);
    EXPECT_EQ(from_bin.out, from_run.out);
  }
}

// export writes the tokenizer where the format has a place for it: a Hugging Face folder
// (config.json, vocab.json and merges.txt beside model.safetensors), and llm.c's tokenizer
// table beside the .bin. The folder is a model source of its own, tokenizer included.
TEST_F(CliPractitioner, ExportsCarryTheTokenizer) {
  const std::string hf = path("hf");
  RunResult r = run(kBinary + " export --checkpoint " + base_run() + " --out " + hf);
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_TRUE(read_file(hf + "/model.safetensors") == read_file(base_safetensors()));
  EXPECT_TRUE(read_file(hf + "/vocab.json") == read_file(base_run() + "/tokenizer/encoder.json"));
  EXPECT_TRUE(read_file(hf + "/merges.txt") == read_file(base_run() + "/tokenizer/vocab.bpe"));
  const json config = read_json(hf + "/config.json");
  const json shape = read_json(base_run() + "/config.json")["resolved_model"];
  EXPECT_EQ(config["model_type"], "gpt2");
  EXPECT_EQ(config["architectures"][0], "GPT2LMHeadModel");
  EXPECT_EQ(config["n_layer"], shape["layers"]);
  EXPECT_EQ(config["n_head"], shape["heads"]);
  EXPECT_EQ(config["n_embd"], shape["dim"]);
  EXPECT_EQ(config["n_positions"], shape["max_seq_len"]);
  EXPECT_EQ(config["vocab_size"], shape["vocab"]);
  // Moved anywhere, the folder samples what the run samples, with its own tokenizer.
  const std::string moved = path("elsewhere/model");
  fs::create_directories(path("elsewhere"));
  fs::rename(hf, moved);
  const std::string args = "--prompt 'It was' --max-new-tokens 8 --seed 9";
  const RunResult from_run = run(generate(base_run(), args)), from_folder = run(generate(moved, args));
  ASSERT_EQ(from_folder.exit_code, 0) << describe(from_folder);
  EXPECT_EQ(from_folder.out, from_run.out);
  // The config's head count is the folder's: a contradicting --heads is refused by name.
  expect_failure(run(train("--init-from " + moved + " --heads 1 --steps 1 --quiet --out " + path("x"))),
                 {"meshtrain: error:", "4 heads", "--heads 1"});

  // llm.c: <stem>_tokenizer.bin, a 256-int header (magic, version 2, vocabulary, end of
  // text), then each token as a length byte and its bytes, to the end of the file.
  r = run(kBinary + " export --checkpoint " + base_run() + " --format llmc --out " + path("m.bin"));
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  const std::string bytes = read_file(path("m_tokenizer.bin"));
  ASSERT_GE(bytes.size(), 1024u);
  int32_t h[256];
  std::memcpy(h, bytes.data(), sizeof(h));
  EXPECT_EQ(h[0], 20240328);
  EXPECT_EQ(h[1], 2);
  EXPECT_EQ(h[2], 50257);
  EXPECT_EQ(h[3], 50256);
  std::vector<std::string> pieces;
  for (size_t at = 1024; at < bytes.size();) {
    const size_t n = (unsigned char)bytes[at];
    ASSERT_GT(n, 0u);
    ASSERT_LE(at + 1 + n, bytes.size());
    pieces.push_back(bytes.substr(at + 1, n));
    at += 1 + n;
  }
  ASSERT_EQ(pieces.size(), 50257u);
  EXPECT_EQ(pieces[50256], "<|endoftext|>");
  EXPECT_EQ(pieces[464], "The");     // GPT-2's id for "The"
  EXPECT_EQ(pieces[198], "\n");
}

// A Llama run exports as a Hugging Face Llama folder (LlamaConfig, HF names) that is a model
// source of its own: it samples what the run samples, and --init-from it at lr 0 gives the
// run's loss bit for bit. llm.c's format (GPT-2 only) refuses it by name; a config.json
// with parts meshtrain lacks is refused by name.
TEST_F(CliPractitioner, LlamaExportsAsAHuggingFaceFolder) {
  const std::string run_dir = path("llama");
  RunResult r = run(train("--model llama-tiny --seq-len 32 --micro-batch 2 --steps 2 --lr 3e-3 --quiet --out " +
                          run_dir));
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  const std::string hf = path("llama-hf");
  r = run(kBinary + " export --checkpoint " + run_dir + " --out " + hf);
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  const json config = read_json(hf + "/config.json");
  EXPECT_EQ(config["model_type"], "llama");
  EXPECT_EQ(config["architectures"][0], "LlamaForCausalLM");
  EXPECT_EQ(config["num_key_value_heads"], 2);
  EXPECT_EQ(config["intermediate_size"], 192);
  EXPECT_EQ(config["tie_word_embeddings"], false);
  const std::string args = "--prompt 'It was' --max-new-tokens 8 --seed 4";
  const RunResult from_run = run(generate(run_dir, args)), from_folder = run(generate(hf, args));
  ASSERT_EQ(from_folder.exit_code, 0) << describe(from_folder);
  EXPECT_EQ(from_folder.out, from_run.out);
  // The same in shards (Hugging Face's layout past --max-shard-gb), read back the same.
  const std::string sharded = path("llama-sharded");
  r = run(kBinary + " export --checkpoint " + run_dir + " --out " + sharded + " --max-shard-gb 0.00004");
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_NE(r.out.find("model.safetensors.index.json"), std::string::npos) << r.out;
  std::set<std::string> shards;
  const json index = read_json(sharded + "/model.safetensors.index.json");
  for (const auto& [name, file] : index["weight_map"].items()) shards.insert(file.get<std::string>());
  EXPECT_GT(shards.size(), 1u);
  for (const std::string& f : shards) EXPECT_TRUE(fs::exists(sharded + "/" + f)) << f;
  EXPECT_FALSE(fs::exists(sharded + "/model.safetensors"));
  const RunResult from_shards = run(generate(sharded, args));
  ASSERT_EQ(from_shards.exit_code, 0) << describe(from_shards);
  EXPECT_EQ(from_shards.out, from_run.out);
  const std::string once = " --seq-len 32 --micro-batch 2 --steps 1 --lr 0 --quiet --out ";
  const RunResult a = run(train("--init-from " + run_dir + once + path("from_run")));
  const RunResult b = run(train("--init-from " + hf + once + path("from_folder")));
  ASSERT_EQ(a.exit_code, 0) << describe(a);
  ASSERT_EQ(b.exit_code, 0) << describe(b);
  const Metrics ma = read_metrics(path("from_run") + "/metrics.jsonl"), mb = read_metrics(path("from_folder") + "/metrics.jsonl");
  ASSERT_EQ(ma.steps.size(), 1u);
  ASSERT_EQ(mb.steps.size(), 1u);
  EXPECT_EQ(bits(ma.steps[0]["loss"]), bits(mb.steps[0]["loss"]));
  EXPECT_EQ(read_json(path("from_folder") + "/config.json")["resolved_model"]["arch"], "llama");

  expect_failure(run(kBinary + " export --checkpoint " + run_dir + " --format llmc --out " + path("l.bin")),
                 {"meshtrain: error:", "llm.c's model file holds GPT-2 models only", "--format hf"});
  json biased = config;
  biased["attention_bias"] = true;
  write_file(hf + "/config.json", biased.dump());
  expect_failure(run(generate(hf, args)), {"meshtrain: error:", "attention_bias", "no biases"});
  json scaled = config;
  scaled["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4}};
  write_file(hf + "/config.json", scaled.dump());
  expect_failure(run(generate(hf, args)), {"meshtrain: error:", "'yarn' is not supported"});
}

// ---- 3. eval ---------------------------------------------------------------------------

struct EvalLine {
  std::string split, loss_text;
  double loss = NAN, perplexity = NAN;
  long long tokens = -1;
};

// "val loss 10.7778 | perplexity 47946.57 | 192 tokens of PATH"
EvalLine parse_eval(const std::string& out) {
  EvalLine e;
  char split[16] = {0};
  if (std::sscanf(out.c_str(), "%15s loss %lf | perplexity %lf | %lld tokens", split, &e.loss,
                  &e.perplexity, &e.tokens) != 4)
    ADD_FAILURE() << "unexpected eval output: " << out;
  e.split = split;
  const auto at = out.find(" loss "), end = out.find(" |");
  if (at != std::string::npos && end != std::string::npos) e.loss_text = out.substr(at + 6, end - at - 6);
  return e;
}

TEST_F(CliPractitioner, EvalMatchesTheRunsValidationLoss) {
  const std::string flags = " --data " + corpus_ + " --split val --micro-batch " +
                            std::to_string(kB) + " --seq-len " + std::to_string(kT) +
                            " --batches " + std::to_string(kEvalBatches) + " --threads 2";
  RunResult r = run(kBinary + " eval --checkpoint " + base_run() + flags);
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_NE(r.out.find("loss"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("perplexity"), std::string::npos) << r.out;
  EvalLine e = parse_eval(r.out);
  EXPECT_EQ(e.split, "val");
  EXPECT_EQ(e.tokens, (long long)kEvalBatches * kB * kT);

  // perplexity = exp(loss): the loss is printed to 4 decimals (so exp of it is off by up to
  // a factor e^0.00005) and the perplexity to 2.
  const double expected = std::exp(e.loss);
  EXPECT_NEAR(e.perplexity, expected, expected * (std::exp(5.01e-5) - 1) + 0.0051)
      << r.out;

  // The training run evaluated the same micro-batches of val.bin at its last step.
  Metrics m = read_metrics(base_run() + "/metrics.jsonl");
  ASSERT_FALSE(m.evals.empty());
  char want[32];
  std::snprintf(want, sizeof want, "%.4f", m.evals.back()["val_loss"].get<double>());
  EXPECT_EQ(e.loss_text, want) << "eval: " << r.out << "metrics: " << m.evals.back().dump();

  // The same model from its exports, to the printed digit.
  for (const std::string& file : {base_safetensors(), base_llmc()}) {
    RunResult x = run(kBinary + " eval --checkpoint " + file + flags);
    ASSERT_EQ(x.exit_code, 0) << describe(x);
    EXPECT_EQ(x.out, r.out) << file;
  }

  // The training split, and the model's own positions when --seq-len is left out.
  RunResult t = run(kBinary + " eval --checkpoint " + base_run() + " --data " + corpus_ +
                    " --split train --micro-batch 1 --batches 2 --threads 1");
  ASSERT_EQ(t.exit_code, 0) << describe(t);
  EvalLine et = parse_eval(t.out);
  EXPECT_EQ(et.split, "train");
  EXPECT_EQ(et.tokens, 2 * 1 * kT);
  EXPECT_TRUE(std::isfinite(et.loss));

  expect_failure(run(kBinary + " eval --checkpoint " + base_run() + " --data " + corpus_ +
                     " --seq-len 64 --threads 1"),
                 {"--seq-len 64", "32"});
  expect_failure(run(kBinary + " eval --checkpoint " + path("nowhere") + " --data " + corpus_),
                 {path("nowhere")});
}

// ---- 4. llm.c export and --init-from ---------------------------------------------------

TEST_F(CliPractitioner, LlmcExportLoadsLikeTheSafetensorsExport) {
  // The header: magic, version 3, then the shape with llm.c's padded vocabulary.
  const std::string bytes = read_file(base_llmc());
  ASSERT_GE(bytes.size(), 1024u);
  int32_t h[256];
  std::memcpy(h, bytes.data(), sizeof h);
  EXPECT_EQ(h[0], 20240326) << "magic";
  EXPECT_EQ(h[1], 3) << "version";
  EXPECT_EQ(h[2], kT) << "max_seq_len";
  EXPECT_EQ(h[3], 50257) << "vocab";
  EXPECT_EQ(h[4], 2) << "layers";
  EXPECT_EQ(h[5], 4) << "heads";
  EXPECT_EQ(h[6], 64) << "channels";
  EXPECT_EQ(h[7], 50304) << "padded vocab";
  EXPECT_EQ(std::count(h + 8, h + 256, 0), 248) << "unused header ints are zero";
  // Then exactly the fp32 parameters: wte (padded), wpe, 12C^2+13C per layer, final LN.
  const int64_t C = 64, L = 2, Vp = 50304;
  EXPECT_EQ((int64_t)bytes.size(), 1024 + 4 * (Vp * C + kT * C + L * (12 * C * C + 13 * C) + 2 * C));

  // One step at --lr 0 from each export (and from the run folder itself): the same
  // weights give the same loss and gradient norm, bit for bit.
  const std::string flags = " --seq-len 32 --micro-batch 2 --steps 1 --lr 0 --quiet";
  Metrics m[3];
  const std::string sources[3] = {base_llmc(), base_safetensors(), base_run()};
  for (int i = 0; i < 3; i++) {
    const std::string out = path("I" + std::to_string(i));
    RunResult r = run(train("--init-from " + sources[i] + flags + " --out " + out));
    ASSERT_EQ(r.exit_code, 0) << describe(r);
    m[i] = read_metrics(out + "/metrics.jsonl");
    ASSERT_EQ(m[i].steps.size(), 1u) << sources[i];
  }
  EXPECT_EQ(bits(m[0].steps[0]["loss"]), bits(m[1].steps[0]["loss"]))
      << ".bin " << m[0].steps[0]["loss"] << " vs .safetensors " << m[1].steps[0]["loss"];
  EXPECT_EQ(bits(m[0].steps[0]["grad_norm"]), bits(m[1].steps[0]["grad_norm"]));
  EXPECT_EQ(bits(m[0].steps[0]["loss"]), bits(m[2].steps[0]["loss"]));
  EXPECT_EQ(read_json(path("I0/config.json"))["resolved_model"],
            read_json(path("I1/config.json"))["resolved_model"]);

  // --lr 0 kept the weights: exporting the new run gives the same .bin byte for byte.
  RunResult r = run(kBinary + " export --checkpoint " + path("I0") + " --format llmc --out " +
                    path("again.bin"));
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_TRUE(read_file(path("again.bin")) == bytes) << "export llmc -> init-from -> export changed";
}

// ---- 5. plot ---------------------------------------------------------------------------

TEST_F(CliPractitioner, PlotNamesEveryRun) {
  // Two run folders (their metrics and options; the checkpoints are not plotted).
  for (const char* name : {"alpha_run", "beta_run"}) {
    fs::create_directories(path(name));
    for (const char* file : {"metrics.jsonl", "config.json", "config.toml"})
      fs::copy_file(base_run() + "/" + file, path(name) + "/" + file);
  }
  RunResult r = run(kBinary + " plot " + path("alpha_run") + " " + path("beta_run") + " --out " +
                    path("cmp.svg"));
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  const std::string svg = read_file(path("cmp.svg"));
  ASSERT_FALSE(svg.empty()) << "no " << path("cmp.svg");
  EXPECT_NE(svg.find("<svg"), std::string::npos);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_NE(svg.find("alpha_run"), std::string::npos) << "legend lacks alpha_run";
  EXPECT_NE(svg.find("beta_run"), std::string::npos) << "legend lacks beta_run";

  if (run("command -v rsvg-convert").exit_code == 0) {
    const std::string png = read_file(path("cmp.png"));
    EXPECT_TRUE(png.starts_with("\x89PNG")) << "no PNG beside the SVG: " << r.out;
  } else {
    EXPECT_NE(r.out.find("no PNG"), std::string::npos) << r.out;
  }

  expect_failure(run(kBinary + " plot " + path("alpha_run") + " " + path("missing_run") +
                     " --out " + path("bad.svg")),
                 {path("missing_run"), "does not exist"});
  fs::create_directories(path("empty_run"));
  expect_failure(run(kBinary + " plot " + path("empty_run") + " --out " + path("bad.svg")),
                 {"metrics.jsonl", path("empty_run")});
  EXPECT_FALSE(fs::exists(path("bad.svg")));
}

// ---- 6. Progress output ----------------------------------------------------------------

TEST_F(CliPractitioner, ProgressIsOnePlainLinePerStepWhenNotATerminal) {
  RunResult r = run(train(kTiny + " --steps 3 --eval-every 2 --eval-batches 1"));
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_EQ(r.out.find('\r'), std::string::npos) << "carriage return in piped output";
  EXPECT_EQ(r.out.find('\x1b'), std::string::npos) << "escape sequence in piped output";
  std::vector<std::string> steps, evals;
  for (const auto& line : lines_of(r.out)) {
    if (line.starts_with("model:") || line.starts_with("machine:")) continue;  // the run header
    if (line.starts_with("done: steps 1-3 in ")) continue;                      // the run's end (no --out)
    // A quiet AMX machine can run this tiny step above the --peak-gflops 100 the test gives,
    // and the run then says it raised the peak: a note, not a progress line.
    if (line.starts_with("note: this step ran above")) continue;
    ASSERT_TRUE(line.starts_with("step")) << "'" << line << "' in\n" << r.out;
    (line.find("val loss") != std::string::npos ? evals : steps).push_back(line);
  }
  ASSERT_EQ(steps.size(), 3u) << r.out;
  for (int k = 1; k <= 3; k++)
    EXPECT_TRUE(steps[k - 1].starts_with("step     " + std::to_string(k) + "/3 | loss "))
        << steps[k - 1];
  ASSERT_EQ(evals.size(), 2u) << r.out;
  EXPECT_TRUE(evals[0].starts_with("step     2 | val loss ")) << evals[0];
  EXPECT_TRUE(evals[1].starts_with("step     3 | val loss ")) << evals[1];
}

}  // namespace
}  // namespace meshtrain::test_cli_practitioner

// ---- Self-describing runs and honest figures -------------------------------------------

namespace meshtrain::test_cli_practitioner {
namespace {

// prep keeps the tokenizer with the tokens, train keeps it with the run, and generate given
// a run uses that copy: a run folder copied anywhere samples the same text, and a changed
// copy is caught by its manifest rather than silently decoding with other ids.
TEST_F(CliPractitioner, ARunFolderIsEnoughToSampleFrom) {
  const json config = read_json(base_run() + "/config.json");
  EXPECT_EQ(config["data_path"], fs::absolute(corpus_).lexically_normal().string());
  EXPECT_EQ(config["tokenizer"], "tokenizer");
  for (const char* f : {"encoder.json", "vocab.bpe"}) {
    EXPECT_TRUE(fs::exists(corpus_ + "/tokenizer/" + f)) << f;
    EXPECT_EQ(read_file(base_run() + "/tokenizer/" + f), read_file(corpus_ + "/tokenizer/" + f)) << f;
  }
  EXPECT_EQ(read_json(base_run() + "/tokenizer/manifest.json")["files"],
            read_json(corpus_ + "/tokenizer/manifest.json")["files"]);
  const std::string moved = path("moved_run");
  fs::copy(base_run(), moved, fs::copy_options::recursive);
  const std::string args = "--prompt \"The jury\" --max-new-tokens 8 --seed 3";
  const RunResult original = run(generate(base_run(), args));
  const RunResult copy = run(generate(moved, args));
  ASSERT_EQ(original.exit_code, 0) << describe(original);
  ASSERT_EQ(copy.exit_code, 0) << describe(copy);
  EXPECT_EQ(copy.out, original.out);
  write_file(moved + "/tokenizer/encoder.json", read_file(moved + "/tokenizer/encoder.json") + " ");
  expect_failure(run(generate(moved, args)), {"meshtrain: error:", moved + "/tokenizer/encoder.json", "manifest"});
}

// eval given a run reads the data folder the run trained on, and refuses a data folder whose
// tokenizer differs from the run's.
TEST_F(CliPractitioner, EvalUsesTheRunsDataAndItsTokenizer) {
  const std::string flags = " --batches 2 --micro-batch 2 --seq-len 32 --threads 1";
  const RunResult own = run(kBinary + " eval --checkpoint " + base_run() + flags);
  ASSERT_EQ(own.exit_code, 0) << describe(own);
  EXPECT_NE(own.out.find(fs::absolute(corpus_).lexically_normal().string() + "/val.bin"), std::string::npos)
      << own.out;
  // Another tokenizer: the same files with one byte more (still valid JSON), so the tokens
  // decode the same but the copies' checksums differ.
  const std::string other_tok = path("other_tokenizer");
  fs::create_directories(other_tok);
  write_file(other_tok + "/encoder.json", read_file(corpus_ + "/tokenizer/encoder.json") + "\n");
  write_file(other_tok + "/vocab.bpe", read_file(corpus_ + "/tokenizer/vocab.bpe"));
  write_file(path("text.txt"), "The jury said it did find that many of the laws were outmoded. " +
                                   std::string(2000, 'a'));
  const RunResult prep = run(kBinary + " prep --input " + path("text.txt") + " --tokenizer " + other_tok +
                             " --val-fraction 0.5 --out " + path("other_data"));
  ASSERT_EQ(prep.exit_code, 0) << describe(prep);
  expect_failure(run(kBinary + " eval --checkpoint " + base_run() + " --data " + path("other_data") + flags),
                 {"meshtrain: error:", "another tokenizer"});
}

// MFU is at most 1 even when the peak is far too low (here a user's --peak-gflops): the step
// that beat it raises it and says so.
TEST_F(CliPractitioner, MfuNeverReadsAboveOne) {
  const std::string out = path("run");
  const RunResult r = run(kBinary + " train --data " + corpus_ + " " + kTiny +
                          " --steps 3 --threads 2 --peak-gflops 0.001 --quiet --out " + out);
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  const Metrics m = read_metrics(out + "/metrics.jsonl");
  ASSERT_EQ(m.steps.size(), 3u);
  EXPECT_TRUE(m.steps[0].value("peak_raised", false)) << m.steps[0];
  for (const json& s : m.steps) {
    EXPECT_LE(s["mfu"].get<double>(), 1.0) << s;
    EXPECT_GT(s["mfu"].get<double>(), 0.0) << s;
    EXPECT_GT(s["peak_gflops"].get<double>(), 0.001) << s;
  }
  const json config = read_json(out + "/config.json");
  for (const char* p : {"fp32", "bf16", "fp16"})
    EXPECT_FALSE(config["machine"]["kernels"][p]["gemm"].get<std::string>().empty()) << p;
  EXPECT_FALSE(config["machine"]["cpu"].get<std::string>().empty());
}

}  // namespace
}  // namespace meshtrain::test_cli_practitioner
