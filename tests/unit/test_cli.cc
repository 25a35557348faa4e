// End-to-end tests of the meshtrain command line. Each test runs the real binary as a
// subprocess in its own temporary folder: resume exactness, the metrics.jsonl contract,
// tracked memory against the parameter count, export and --init-from round trips, loading
// files shaped like Hugging Face's GPT-2 checkpoints, the errors bad input must produce,
// --help and tokenize. Every training run is a tiny model with a fixed peak and two
// threads, so the file runs in well under a minute on two cores.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.h"
#include "cli_test_util.h"
#include "multirank_test_util.h"
#include "data/token_file.h"

namespace meshtrain::test_cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Subprocesses, files, metrics.jsonl and the fixture: cli_test_util.h.
using cli_test::bits;
using cli_test::describe;
using cli_test::expect_failure;
using cli_test::kBinary;
using cli_test::kTiny;
using cli_test::kVocab;
using cli_test::lines_of;
using cli_test::Metrics;
using cli_test::read_file;
using cli_test::read_metrics;
using cli_test::run;
using cli_test::RunResult;
using cli_test::write_file;
using Cli = cli_test::CliTest;

// ---- Parameter counting, independent of the engine's code ------------------------------

// Elements of the engine's flat buffer for GPT-2 of this shape: the token embedding padded
// to a multiple of 128 rows, `positions` rows of the position embedding, per block two
// LayerNorms, QKV [3C,C]+3C, attention projection [C,C]+C, MLP [4C,C]+4C and [C,4C]+C,
// and the final LayerNorm.
int64_t flat_elements(int64_t layers, int64_t dim, int64_t positions, int64_t vocab) {
  const int64_t C = dim;
  const int64_t padded_vocab = (vocab + 127) / 128 * 128;
  const int64_t block = 2 * C + (3 * C * C + 3 * C) + (C * C + C) + 2 * C + (4 * C * C + 4 * C) +
                        (C * 4 * C + C);
  return padded_vocab * C + positions * C + layers * block + 2 * C;
}

// ---- Hand-written safetensors files shaped like Hugging Face's GPT-2 -------------------

struct RawTensor {
  std::string name;
  std::string dtype;  // "F32" or "BOOL"
  std::vector<int64_t> shape;
  std::string bytes;
};

// The safetensors layout written independently of src/checkpoint: u64 header length, the
// JSON header padded with spaces to a multiple of 8, the data in the order given.
std::string safetensors_bytes(const std::vector<RawTensor>& tensors, const json& metadata) {
  json header = json::object();
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    header[t.name] = {{"dtype", t.dtype},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  if (!metadata.is_null()) header["__metadata__"] = metadata;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t n = text.size();
  std::string out(reinterpret_cast<const char*>(&n), 8);
  out += text;
  for (const auto& t : tensors) out += t.bytes;
  return out;
}

struct HfOptions {
  int layers = 2, dim = 128, positions = 64, vocab = kVocab;
  std::string prefix;         // "" or "transformer."
  bool bool_mask = false;     // attn.bias as BOOL (newer transformers) instead of F32
  bool masked_bias = false;   // also the old attn.masked_bias scalar buffers
  bool lm_head = false;       // the tied head stored as well
};

// Exactly the tensors of a Hugging Face GPT-2 checkpoint (Conv1D weights [in, out],
// unpadded vocabulary, causal-mask buffers [1, 1, P, P]). Values are deterministic and
// the same for every option set, so variants load the same model.
std::vector<RawTensor> hf_gpt2_tensors(const HfOptions& o) {
  std::mt19937 rng(20240520);
  const int64_t C = o.dim, P = o.positions, V = o.vocab;
  auto floats = [&](const std::string& name, std::vector<int64_t> shape, float scale, float base) {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    std::vector<float> v((size_t)n);
    for (auto& x : v) x = base + scale * ((float)(rng() >> 8) / (float)(1u << 24) - 0.5f);
    std::string bytes(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
    return RawTensor{o.prefix + name, "F32", std::move(shape), std::move(bytes)};
  };
  auto mask = [&](const std::string& name) {
    std::vector<int64_t> shape = {1, 1, P, P};
    std::string bytes;
    for (int64_t i = 0; i < P; i++)
      for (int64_t j = 0; j < P; j++) {
        if (o.bool_mask) {
          bytes.push_back(j <= i ? 1 : 0);
        } else {
          float f = j <= i ? 1.0f : 0.0f;
          bytes.append(reinterpret_cast<const char*>(&f), 4);
        }
      }
    return RawTensor{o.prefix + name, o.bool_mask ? "BOOL" : "F32", shape, bytes};
  };
  std::vector<RawTensor> t;
  t.push_back(floats("wte.weight", {V, C}, 0.04f, 0));
  t.push_back(floats("wpe.weight", {P, C}, 0.02f, 0));
  for (int l = 0; l < o.layers; l++) {
    const std::string h = "h." + std::to_string(l) + ".";
    t.push_back(floats(h + "ln_1.weight", {C}, 0.1f, 1));
    t.push_back(floats(h + "ln_1.bias", {C}, 0.1f, 0));
    t.push_back(mask(h + "attn.bias"));
    if (o.masked_bias) {
      float minus = -1e4f;
      t.push_back({o.prefix + h + "attn.masked_bias", "F32", {},
                   std::string(reinterpret_cast<const char*>(&minus), 4)});
    }
    t.push_back(floats(h + "attn.c_attn.weight", {C, 3 * C}, 0.04f, 0));
    t.push_back(floats(h + "attn.c_attn.bias", {3 * C}, 0.02f, 0));
    t.push_back(floats(h + "attn.c_proj.weight", {C, C}, 0.02f, 0));
    t.push_back(floats(h + "attn.c_proj.bias", {C}, 0.02f, 0));
    t.push_back(floats(h + "ln_2.weight", {C}, 0.1f, 1));
    t.push_back(floats(h + "ln_2.bias", {C}, 0.1f, 0));
    t.push_back(floats(h + "mlp.c_fc.weight", {C, 4 * C}, 0.04f, 0));
    t.push_back(floats(h + "mlp.c_fc.bias", {4 * C}, 0.02f, 0));
    t.push_back(floats(h + "mlp.c_proj.weight", {4 * C, C}, 0.02f, 0));
    t.push_back(floats(h + "mlp.c_proj.bias", {C}, 0.02f, 0));
  }
  t.push_back(floats("ln_f.weight", {C}, 0.1f, 1));
  t.push_back(floats("ln_f.bias", {C}, 0.1f, 0));
  if (o.lm_head) {
    RawTensor head = t[0];
    head.name = "lm_head.weight";  // HF stores the head at the top level
    t.push_back(head);
  }
  return t;
}

RawTensor* find_tensor(std::vector<RawTensor>& tensors, const std::string& name) {
  for (auto& t : tensors)
    if (t.name == name) return &t;
  ADD_FAILURE() << "no tensor " << name;
  return &tensors[0];
}

// ---- 1. Resume -------------------------------------------------------------------------

TEST_F(Cli, ResumeIsBitwiseExact) {
  const std::string flags = kTiny + " --steps 8 --save-every 4 --keep-checkpoints 0";
  RunResult a = run(train(flags + " --quiet --out " + path("A")));
  ASSERT_EQ(a.exit_code, 0) << describe(a);
  RunResult b = run(train(flags + " --quiet --out " + path("B")));
  ASSERT_EQ(b.exit_code, 0) << describe(b);

  // Make B look like a run killed during step 7: no step-8 checkpoint, metrics.jsonl with
  // steps 1-6 and half of step 7's line.
  fs::remove_all(path("B/checkpoints/step_00000008"));
  ASSERT_TRUE(fs::exists(path("B/checkpoints/step_00000004/index.json")));
  std::string kept;
  for (const auto& line : lines_of(read_file(path("B/metrics.jsonl")))) {
    json j = json::parse(line);
    if (j.contains("val_loss")) continue;
    if (j["step"] <= 6) kept += line + "\n";
    if (j["step"] == 7) kept += line.substr(0, line.size() / 2);
  }
  write_file(path("B/metrics.jsonl"), kept);

  RunResult r = run(train(flags + " --out " + path("B") + " --resume"));
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_NE(r.out.find("resumed at step 4 from a checkpoint written at tp 1, pp 1, dp 1"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("step     4/8"), std::string::npos) << "step 4 ran again:\n" << r.out;
  EXPECT_NE(r.out.find("step     5/8"), std::string::npos) << r.out;

  // Every step once, in order, and the same bits as the uninterrupted run.
  Metrics ma = read_metrics(path("A/metrics.jsonl"));
  Metrics mb = read_metrics(path("B/metrics.jsonl"));
  ASSERT_EQ(ma.steps.size(), 8u);
  ASSERT_EQ(mb.steps.size(), 8u) << read_file(path("B/metrics.jsonl"));
  for (int s = 1; s <= 8; s++) {
    const json& x = ma.steps[s - 1];
    const json& y = mb.steps[s - 1];
    ASSERT_EQ(y["step"], s);
    for (const char* key : {"loss", "grad_norm", "lr"})
      EXPECT_EQ(bits(x[key]), bits(y[key])) << key << " at step " << s << ": " << x[key].dump()
                                             << " vs " << y[key].dump();
    EXPECT_EQ(x["tokens"], y["tokens"]);
  }
  ASSERT_EQ(ma.evals.size(), 1u);
  ASSERT_EQ(mb.evals.size(), 1u) << "the interrupted run never evaluated; the resumed one once";
  EXPECT_EQ(mb.evals[0]["step"], 8);
  EXPECT_EQ(bits(ma.evals[0]["val_loss"]), bits(mb.evals[0]["val_loss"]));

  // The final weights and moments are byte for byte the same.
  for (const char* file : {"shard_00000.bin"}) {
    const std::string fa = read_file(path("A/checkpoints/step_00000008/") + file);
    const std::string fb = read_file(path("B/checkpoints/step_00000008/") + file);
    EXPECT_FALSE(fa.empty());
    EXPECT_TRUE(fa == fb) << file << " differs after resume";
  }
}

// A checkpoint resumes at another precision: its parameters are the fp32 master weights and
// its moments fp32, so an fp32 run continues in bf16 or fp16 (a fresh loss scaler), and a
// bf16 run in fp32. Steps 5-8 stay within the bf16 tracking tolerance of the fp32 run
// (0.006, test_precision.cc's Bf16TracksFp32).
TEST_F(Cli, ResumeAtAnotherPrecision) {
  const std::string flags = kTiny + " --steps 8 --save-every 4 --keep-checkpoints 0 --quiet";
  ASSERT_EQ(run(train(flags + " --out " + path("fp32"))).exit_code, 0);
  ASSERT_EQ(run(train(flags + " --precision bf16 --out " + path("bf16"))).exit_code, 0);
  const Metrics reference = read_metrics(path("fp32/metrics.jsonl"));
  ASSERT_EQ(reference.steps.size(), 8u);
  for (const auto& [from, to] : {std::pair{"fp32", "bf16"}, {"fp32", "fp16"}, {"bf16", "fp32"}}) {
    SCOPED_TRACE(std::string(from) + " resumed at " + to);
    const std::string dir = path(std::string(from) + "_to_" + to);
    multirank_test::copy_interrupted_run(path(from), dir, 4, 8);
    RunResult r = run(train(flags + " --precision " + to + " --out " + dir + " --resume"));
    ASSERT_EQ(r.exit_code, 0) << describe(r);
    const Metrics m = read_metrics(dir + "/metrics.jsonl");
    ASSERT_EQ(m.steps.size(), 8u);
    for (int s = 5; s <= 8; s++)
      EXPECT_NEAR(m.steps[s - 1]["loss"].get<double>(), reference.steps[s - 1]["loss"].get<double>(), 0.006)
          << "step " << s;
  }
}

// The disk filling up during a checkpoint save: the run's folder is on a 60 MiB tmpfs,
// room for one checkpoint of the tiny model (~39 MB) but not two. The step-4 save fails
// with the device's error, names the step-2 checkpoint as intact and frees its staged
// folder; a --resume continues from step 2. Needs root (mount); skipped without it.
TEST_F(Cli, DiskFullDuringASaveKeepsThePreviousCheckpoint) {
  const std::string disk = path("disk");
  fs::create_directories(disk);
  if (std::system(("mount -t tmpfs -o size=60m tmpfs " + disk + " 2>/dev/null").c_str()) != 0)
    GTEST_SKIP() << "cannot mount a tmpfs here (not root?)";
  struct Unmount {
    std::string dir;
    ~Unmount() { (void)std::system(("umount " + dir).c_str()); }
  } unmount{disk};
  const std::string flags = kTiny + " --save-every 2 --keep-checkpoints 1 --out " + disk + "/run";
  const std::string intact = "the newest complete checkpoint, " + disk + "/run/checkpoints/step_00000002, is intact";
  RunResult r = run(train(flags + " --steps 4 --quiet"));
  expect_failure(r, {"checkpoint of step 4 not saved", "No space left on device", intact});
  EXPECT_FALSE(fs::exists(disk + "/run/checkpoints/step_00000004.tmp")) << "the staged folder is removed";
  // The disk is still too full for a second checkpoint: the resumed run trains step 3, and
  // its final save fails the same way.
  RunResult resumed = run(train(flags + " --steps 3 --resume"));
  EXPECT_NE(resumed.out.find("resumed at step 2"), std::string::npos) << describe(resumed);
  EXPECT_NE(resumed.out.find("step     3/3"), std::string::npos) << describe(resumed);
  EXPECT_NE(resumed.err.find("checkpoint of step 3 not saved"), std::string::npos) << describe(resumed);
  EXPECT_NE(resumed.err.find(intact), std::string::npos) << describe(resumed);
}

// --async-save: a job killed with SIGKILL (every rank at once, as a machine that loses
// power) while a save is being written leaves the newest committed checkpoint valid:
// --resume continues from it (a checkpoint written asynchronously), bit for bit as the
// uninterrupted run. (The files equal synchronous saves byte for byte: checked by hand,
// docs/cluster.md; the resume checks what matters of them.)
TEST_F(Cli, AsyncSaveSurvivesAKillDuringTheWrite) {
  const std::string flags = kTiny + " --dp 2 --zero 1 --steps 8 --save-every 2 --keep-checkpoints 0 --quiet";
  RunResult async = run(train(flags + " --async-save --out " + path("async")));
  ASSERT_EQ(async.exit_code, 0) << describe(async);
  const std::string out = path("killed");
  std::thread job([&] { (void)run(train(flags + " --async-save --out " + out)); });
  // Killed once the step-4 or step-6 save is staged (its shards being written or committed).
  auto staged = [&] {
    std::error_code ec;
    for (int s = 4; s <= 6; s += 2) {
      char name[40];
      std::snprintf(name, sizeof name, "/checkpoints/step_%08d.tmp", s);
      if (fs::exists(out + name, ec)) return true;
    }
    return false;
  };
  bool seen = false;
  for (int i = 0; i < 3000 && !(seen = staged()); i++) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  int killed = 0;
  for (int rank = 0; rank < 2; rank++) {
    const json beat = json::parse(read_file(out + "/heartbeat/rank_0000" + std::to_string(rank) + ".json"), nullptr, false);
    const int64_t pid = beat.is_object() ? beat.value("pid", (int64_t)0) : 0;
    if (pid > 0 && ::kill((pid_t)pid, SIGKILL) == 0) killed++;  // never kill(0): our own process group
  }
  job.join();
  ASSERT_TRUE(seen) << "no save was staged";
  ASSERT_EQ(killed, 2) << "the ranks' heartbeats named no live process";
  RunResult resumed = run(train(flags + " --async-save --out " + out + " --resume"));
  ASSERT_EQ(resumed.exit_code, 0) << describe(resumed);
  const Metrics want = read_metrics(path("async/metrics.jsonl")), got = read_metrics(out + "/metrics.jsonl");
  ASSERT_EQ(got.steps.size(), want.steps.size()) << read_file(out + "/metrics.jsonl");
  for (size_t i = 0; i < want.steps.size(); i++)
    EXPECT_EQ(bits(got.steps[i]["loss"]), bits(want.steps[i]["loss"])) << "step " << i + 1;
}

// --on-nonfinite stop: a NaN put into block 1's gradient at step 3 (--debug-nonfinite-step)
// stops the run before that step's update, on both ranks of a dp 2 ZeRO-2 job, with a
// message naming the step, the unit and the newest checkpoint (step 2's, which stays the
// newest: nothing is saved after the report).
TEST_F(Cli, NonFiniteGradientStopsNamingStepAndUnit) {
  const std::string out = path("stop");
  RunResult r = run(train(kTiny + " --dp 2 --zero 2 --steps 5 --save-every 2 --keep-checkpoints 0 "
                                  "--debug-nonfinite-step 3 --debug-nonfinite-unit 2 --quiet --out " + out));
  EXPECT_NE(r.exit_code, 0) << describe(r);
  for (const std::string& part : std::vector<std::string>{"step 3: the loss is ", "not finite: the gradient of block 1",
                                 "stopped before the update (--on-nonfinite stop",
                                 "the newest checkpoint is " + out + "/checkpoints/step_00000002"})
    EXPECT_EQ(multirank_test::count_of(r.err, part), 2u) << part << " once per rank\n" << describe(r);
  EXPECT_FALSE(fs::exists(out + "/checkpoints/step_00000003"));
  EXPECT_EQ(read_metrics(out + "/metrics.jsonl").steps.size(), 2u);
}

// --on-nonfinite skip: the step is reported (metrics.jsonl "nonfinite", "step_skipped") and
// leaves the weights and moments alone. Steps 1-3 match the run without a NaN bit for bit
// (step 3's forward ran before the NaN), step 4 differs (no update at step 3). The skipped
// count goes into the checkpoint: resumed after step 4, steps 5-6 are bit for bit those of
// the uninterrupted run (AdamW's t counts the applied steps only).
TEST_F(Cli, NonFiniteStepsAreSkippedAndResumeExactly) {
  const std::string flags = kTiny + " --steps 6 --save-every 4 --keep-checkpoints 0 --quiet";
  const std::string nan = " --on-nonfinite skip --debug-nonfinite-step 3 --debug-nonfinite-unit 1";
  ASSERT_EQ(run(train(flags + " --out " + path("plain"))).exit_code, 0);
  RunResult skipped = run(train(flags + nan + " --out " + path("skip")));
  ASSERT_EQ(skipped.exit_code, 0) << describe(skipped);
  const Metrics plain = read_metrics(path("plain/metrics.jsonl")), skip = read_metrics(path("skip/metrics.jsonl"));
  ASSERT_EQ(skip.steps.size(), 6u);
  for (int s = 1; s <= 3; s++) EXPECT_EQ(skip.steps[s - 1]["loss"], plain.steps[s - 1]["loss"]) << "step " << s;
  EXPECT_NE(skip.steps[3]["loss"], plain.steps[3]["loss"]) << "step 3's update was applied";
  EXPECT_EQ(skip.steps[2]["step_skipped"], true);
  EXPECT_NE(skip.steps[2]["nonfinite"].get<std::string>().find("the gradient of block 0"), std::string::npos)
      << skip.steps[2].dump();
  EXPECT_FALSE(skip.steps[3].contains("nonfinite"));
  EXPECT_EQ(json::parse(read_file(path("skip/checkpoints/step_00000004/index.json")))["train_state"]["nonfinite_skipped"], 1);

  multirank_test::copy_interrupted_run(path("skip"), path("resumed"), 4, 6);
  RunResult resumed = run(train(flags + nan + " --out " + path("resumed") + " --resume"));
  ASSERT_EQ(resumed.exit_code, 0) << describe(resumed);
  const Metrics again = read_metrics(path("resumed/metrics.jsonl"));
  ASSERT_EQ(again.steps.size(), 6u);
  for (int s = 5; s <= 6; s++) EXPECT_EQ(again.steps[s - 1]["loss"], skip.steps[s - 1]["loss"]) << "step " << s;
}

TEST_F(Cli, ResumeRejectsAnotherShapeAndAFinishedRun) {
  RunResult r = run(train(kTiny + " --steps 2 --quiet --out " + path("K")));
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  ASSERT_TRUE(fs::exists(path("K/checkpoints/step_00000002/index.json")));
  const std::string metrics_before = read_file(path("K/metrics.jsonl"));

  // Only the fields that differ, each named by its flag: not the derived MLP width.
  RunResult wider = run(train(kTiny + " --steps 4 --dim 96 --out " + path("K") + " --resume"));
  expect_failure(wider, {"another shape", "\n  --dim 96 differs from the checkpoint's 64"});
  for (const char* other : {"ffn", "layers", "{"}) EXPECT_EQ(wider.err.find(other), std::string::npos) << wider.err;
  RunResult deeper = run(train(kTiny + " --steps 4 --layers 3 --heads 2 --out " + path("K") + " --resume"));
  expect_failure(deeper,
                 {"\n  --layers 3 differs from the checkpoint's 2\n  --heads 2 differs from the checkpoint's 4"});
  EXPECT_EQ(deeper.err.find("kv_heads"), std::string::npos) << deeper.err;
  // --seq-len sets the position rows of a fresh model, so it is part of the shape too.
  expect_failure(run(train("--model tiny --seq-len 16 --micro-batch 2 --vocab 50257 --steps 4"
                           " --out " + path("K") + " --resume")),
                 {"--seq-len 16 differs from the checkpoint's 32"});
  // Another architecture: --arch, and the parts that come with it, by their record names.
  expect_failure(run(train(kTiny + " --arch llama --steps 4 --out " + path("K") + " --resume")),
                 {"--arch llama differs from the checkpoint's gpt2",
                  "norm rmsnorm differs from the checkpoint's layernorm"});
  expect_failure(run(train(kTiny + " --steps 2 --out " + path("K") + " --resume")),
                 {"step 2", "--steps 2"});
  // A failed resume leaves the run's history alone.
  EXPECT_EQ(read_file(path("K/metrics.jsonl")), metrics_before);
}

// ---- 2. metrics.jsonl ------------------------------------------------------------------

TEST_F(Cli, MetricsHaveEveryKeyAndTheLossFalls) {
  RunResult r = run(train(kTiny + " --steps 30 --lr 3e-3 --eval-every 2 --eval-batches 2 --quiet"
                                  " --out " + path("M")));
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_EQ(r.out, "") << "--quiet prints nothing";
  Metrics m = read_metrics(path("M/metrics.jsonl"));
  ASSERT_EQ(m.steps.size(), 30u);
  for (int s = 1; s <= 30; s++) {
    const json& j = m.steps[s - 1];
    for (const char* key :
         {"step", "loss", "lr", "grad_norm", "tokens", "step_ms", "tokens_per_s", "mfu", "mem"})
      ASSERT_TRUE(j.contains(key)) << key << " missing in " << j.dump();
    EXPECT_EQ(j["step"], s);
    EXPECT_TRUE(j["step"].is_number_integer());
    EXPECT_TRUE(j["tokens"].is_number_integer());
    EXPECT_EQ(j["tokens"].get<int64_t>(), (int64_t)s * 2 * 32);
    EXPECT_TRUE(std::isfinite(j["loss"].get<double>()));
    EXPECT_GT(j["lr"].get<double>(), 0);
    EXPECT_GT(j["grad_norm"].get<double>(), 0);
    EXPECT_GT(j["step_ms"].get<double>(), 0);
    EXPECT_GT(j["tokens_per_s"].get<double>(), 0);
    EXPECT_GT(j["mfu"].get<double>(), 0);
    const json& mem = j["mem"];
    ASSERT_TRUE(mem.is_object());
    for (const char* key :
         {"params", "grads", "optim", "activations", "workspace", "comm", "total"}) {
      ASSERT_TRUE(mem.contains(key)) << key << " missing in " << mem.dump();
      EXPECT_TRUE(mem[key].is_number_integer()) << mem.dump();
      EXPECT_GE(mem[key].get<int64_t>(), 0);
    }
    EXPECT_GE(mem["total"].get<int64_t>(), mem["params"].get<int64_t>() +
                                               mem["grads"].get<int64_t>() +
                                               mem["optim"].get<int64_t>() +
                                               mem["activations"].get<int64_t>());
  }
  // The schedule: peak LR at step 1 (no warmup), cosine decay after.
  EXPECT_FLOAT_EQ((float)m.steps[0]["lr"].get<double>(), 3e-3f);
  EXPECT_LT(m.steps[29]["lr"].get<double>(), m.steps[1]["lr"].get<double>());

  ASSERT_EQ(m.evals.size(), 15u);
  for (size_t i = 0; i < m.evals.size(); i++) {
    const json& j = m.evals[i];
    EXPECT_EQ(j["step"], 2 * (int)(i + 1)) << j.dump();
    EXPECT_TRUE(std::isfinite(j["val_loss"].get<double>()));
    EXPECT_EQ(j["tokens"].get<int64_t>(), j["step"].get<int64_t>() * 64);
  }

  auto mean_loss = [&](int from, int to) {
    double s = 0;
    for (int i = from; i < to; i++) s += m.steps[i]["loss"].get<double>();
    return s / (to - from);
  };
  const double first = mean_loss(0, 3), last = mean_loss(27, 30);
  EXPECT_LT(last, first - 1.0) << "first 3 steps " << first << ", last 3 " << last;
  EXPECT_LT(m.evals.back()["val_loss"].get<double>(), m.evals.front()["val_loss"].get<double>());
}

// ---- 3. Tracked memory -----------------------------------------------------------------

TEST_F(Cli, ParamGradOptimPeaksAreFourBytesPerElement) {
  struct Shape {
    std::string flags;
    int layers, dim, positions;
  };
  const std::vector<Shape> shapes = {
      {kTiny, 2, 64, 32},
      {"--model tiny --layers 1 --heads 3 --dim 96 --seq-len 16 --micro-batch 1 --vocab 50257", 1,
       96, 16},
  };
  for (size_t i = 0; i < shapes.size(); i++) {
    const Shape& s = shapes[i];
    const std::string out = path("mem" + std::to_string(i));
    RunResult r = run(train(s.flags + " --steps 2 --quiet --out " + out));
    ASSERT_EQ(r.exit_code, 0) << describe(r);
    const int64_t n = flat_elements(s.layers, s.dim, s.positions, kVocab);
    Metrics m = read_metrics(out + "/metrics.jsonl");
    ASSERT_EQ(m.steps.size(), 2u);
    for (const json& j : m.steps) {
      EXPECT_EQ(j["mem"]["params"].get<int64_t>(), 4 * n) << s.flags;
      EXPECT_EQ(j["mem"]["grads"].get<int64_t>(), 4 * n) << s.flags;
      EXPECT_EQ(j["mem"]["optim"].get<int64_t>(), 8 * n) << s.flags;
    }
    // The (single-rank) checkpoint shard holds the flat buffer, then m, then v.
    EXPECT_EQ((int64_t)fs::file_size(out + "/checkpoints/step_00000002/shard_00000.bin"), 12 * n);
  }
}

// ---- 4. export and --init-from ---------------------------------------------------------

TEST_F(Cli, ExportAndInitFromRoundTrip) {
  // Three windows of G*T = 64 tokens: step 4 of a resumed run reads window 0 again, the
  // window step 1 of a run started from the export reads.
  std::vector<data::Token> tokens;
  ASSERT_TRUE(data::read_token_file(corpus_ + "/train.bin", &tokens).is_ok());
  tokens.resize(3 * 64 + 1);
  const std::string data = path("data3");
  fs::create_directories(data);
  ASSERT_TRUE(data::write_token_file(data + "/train.bin", tokens).is_ok());

  RunResult r = run(train(kTiny + " --steps 3 --quiet --out " + path("R"), data));
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  const std::string st = path("R/m.safetensors");
  r = run(kBinary + " export --checkpoint " + path("R") + " --out " + st);
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_NE(r.out.find("step_00000003"), std::string::npos) << r.out;

  // The header: HF names, [in, out] Conv1D weights, the unpadded vocabulary.
  checkpoint::SafetensorsFile f;
  auto s = checkpoint::SafetensorsFile::open(st, &f);
  ASSERT_TRUE(s.is_ok()) << s.message();
  const int64_t C = 64, P = 32, V = kVocab;
  const std::map<std::string, std::vector<int64_t>> want = {
      {"wte.weight", {V, C}},
      {"wpe.weight", {P, C}},
      {"h.0.ln_1.weight", {C}},
      {"h.0.ln_1.bias", {C}},
      {"h.0.attn.c_attn.weight", {C, 3 * C}},
      {"h.0.attn.c_attn.bias", {3 * C}},
      {"h.0.attn.c_proj.weight", {C, C}},
      {"h.0.attn.c_proj.bias", {C}},
      {"h.0.ln_2.weight", {C}},
      {"h.0.ln_2.bias", {C}},
      {"h.0.mlp.c_fc.weight", {C, 4 * C}},
      {"h.0.mlp.c_fc.bias", {4 * C}},
      {"h.1.mlp.c_proj.weight", {4 * C, C}},
      {"h.1.mlp.c_proj.bias", {C}},
      {"ln_f.weight", {C}},
      {"ln_f.bias", {C}},
  };
  for (const auto& [name, shape] : want) {
    const checkpoint::TensorInfo* t = f.find(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(t->shape, shape) << name;
    EXPECT_EQ(t->dtype, "F32") << name;
  }
  EXPECT_EQ(f.tensors().size(), 2u + 12u * 2 + 2u);
  EXPECT_EQ(f.find("h.2.ln_1.weight"), nullptr);
  EXPECT_EQ(f.metadata().at("n_head"), "4");
  EXPECT_EQ(f.metadata().at("n_layer"), "2");

  // The values: the checkpoint's flat buffer, Conv1D weights transposed, padding dropped.
  // A single-rank checkpoint shard starts with the whole flat parameter buffer.
  const std::string params = read_file(path("R/checkpoints/step_00000003/shard_00000.bin"))
                                 .substr(0, 4 * flat_elements(2, C, P, V));
  ASSERT_EQ((int64_t)params.size(), 4 * flat_elements(2, C, P, V));
  const float* flat = reinterpret_cast<const float*>(params.data());
  std::vector<float> wte((size_t)(V * C));
  ASSERT_TRUE(f.read_float("wte.weight", wte.data(), wte.size()).is_ok());
  EXPECT_EQ(std::memcmp(wte.data(), flat, wte.size() * 4), 0) << "wte.weight";
  const int64_t padded_vocab = (V + 127) / 128 * 128;
  const float* qkv = flat + padded_vocab * C + P * C + 2 * C;  // h.0 after ln_1: [3C, C]
  std::vector<float> c_attn((size_t)(C * 3 * C));
  ASSERT_TRUE(f.read_float("h.0.attn.c_attn.weight", c_attn.data(), c_attn.size()).is_ok());
  int mismatches = 0;
  for (int64_t i = 0; i < C; i++)
    for (int64_t o = 0; o < 3 * C; o++)
      mismatches += std::bit_cast<uint32_t>(c_attn[i * 3 * C + o]) !=
                    std::bit_cast<uint32_t>(qkv[o * C + i]);
  EXPECT_EQ(mismatches, 0) << "h.0.attn.c_attn.weight is not the transposed engine weight";

  // The trained model's loss on window 0, as a resumed run computes it at step 4.
  r = run(train(kTiny + " --steps 4 --quiet --out " + path("R") + " --resume", data));
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  Metrics resumed = read_metrics(path("R/metrics.jsonl"));
  ASSERT_EQ(resumed.steps.size(), 4u);
  const json fresh_loss = resumed.steps[0]["loss"];  // the random init on window 0
  const json trained_loss = resumed.steps[3]["loss"];

  // Starting from the export gives that loss at step 1, every time; --lr 0 keeps the weights.
  const std::string init = " --init-from " + st + " --seq-len 32 --micro-batch 2 --steps 1 --lr 0";
  json init_loss[2];
  for (int i = 0; i < 2; i++) {
    const std::string out = path("I" + std::to_string(i));
    r = run(train(init + " --out " + out, data));
    ASSERT_EQ(r.exit_code, 0) << describe(r);
    EXPECT_NE(r.out.find("2 layers, 4 heads, dim 64, vocab 50257"), std::string::npos) << r.out;
    Metrics m = read_metrics(out + "/metrics.jsonl");
    ASSERT_EQ(m.steps.size(), 1u);
    init_loss[i] = m.steps[0]["loss"];
  }
  EXPECT_EQ(bits(init_loss[0]), bits(init_loss[1]));
  EXPECT_EQ(bits(init_loss[0]), bits(trained_loss))
      << "init-from " << init_loss[0] << ", trained model " << trained_loss;
  EXPECT_NE(bits(init_loss[0]), bits(fresh_loss));

  r = run(kBinary + " export --checkpoint " + path("I0") + " --out " + path("again.safetensors"));
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_TRUE(read_file(path("again.safetensors")) == read_file(st))
      << "export -> init-from -> (lr 0) -> export changed the file";

  // A flag that contradicts the file is an error, not a silent override.
  expect_failure(run(train(init + " --dim 128", data)), {"--dim 128", "conflicts", "64"});
  expect_failure(run(train(init + " --heads 8", data)), {"4 heads", "--heads 8"});
}

// ---- 5. Files shaped like Hugging Face's GPT-2 -----------------------------------------

TEST_F(Cli, HuggingFaceShapedFilesLoad) {
  const std::string flags = " --seq-len 32 --micro-batch 2 --steps 1 --lr 0";
  HfOptions plain;  // "h.0...." names, F32 masks, no metadata at all
  const std::string file1 = path("hf.safetensors");
  write_file(file1, safetensors_bytes(hf_gpt2_tensors(plain), json()));
  HfOptions prefixed;
  prefixed.prefix = "transformer.";
  prefixed.bool_mask = prefixed.masked_bias = prefixed.lm_head = true;
  const std::string file2 = path("hf_prefixed.safetensors");
  write_file(file2, safetensors_bytes(hf_gpt2_tensors(prefixed), {{"format", "pt"}}));

  json loss[2];
  const std::string files[2] = {file1, file2};
  for (int i = 0; i < 2; i++) {
    const std::string out = path("H" + std::to_string(i));
    RunResult r = run(train("--init-from " + files[i] + flags + " --out " + out));
    ASSERT_EQ(r.exit_code, 0) << describe(r);
    // No n_head in the file: heads = C / 64.
    EXPECT_NE(r.out.find("model: gpt2 | 2 layers, 2 heads, dim 128, vocab 50257"), std::string::npos)
        << r.out;
    json config = json::parse(read_file(out + "/config.json"));
    EXPECT_EQ(config["resolved_model"]["heads"], 2);
    EXPECT_EQ(config["resolved_model"]["max_seq_len"], 64);
    EXPECT_EQ(config["resolved_model"]["seq_len"], 32);
    Metrics m = read_metrics(out + "/metrics.jsonl");
    ASSERT_EQ(m.steps.size(), 1u);
    loss[i] = m.steps[0]["loss"];
    EXPECT_TRUE(std::isfinite(loss[i].get<double>()));
  }
  EXPECT_EQ(bits(loss[0]), bits(loss[1])) << "prefix, BOOL masks or lm_head changed the model";

  // Without --seq-len, T is the file's 64 positions.
  RunResult r = run(train("--init-from " + file1 + " --micro-batch 1 --steps 1 --quiet"));
  EXPECT_EQ(r.exit_code, 0) << describe(r);

  // Broken variants, each with a message naming the problem.
  auto broken = [&](const std::string& name, auto&& edit) {
    auto tensors = hf_gpt2_tensors(plain);
    edit(tensors);
    const std::string p = path(name + ".safetensors");
    write_file(p, safetensors_bytes(tensors, json()));
    return run(train("--init-from " + p + flags));
  };
  expect_failure(broken("renamed", [](auto& t) {
                   find_tensor(t, "h.1.attn.c_attn.weight")->name = "h.1.attn.c_atn.weight";
                 }),
                 {"h.1.attn.c_attn.weight"});
  expect_failure(broken("extra", [](auto& t) {
                   RawTensor x = *find_tensor(t, "h.0.mlp.c_fc.bias");
                   x.name = "h.0.mlp.c_fc.bais";
                   t.push_back(x);
                 }),
                 {"unexpected tensor", "h.0.mlp.c_fc.bais"});
  expect_failure(broken("transposed", [](auto& t) {
                   find_tensor(t, "h.0.mlp.c_fc.weight")->shape = {4 * 128, 128};
                 }),
                 {"h.0.mlp.c_fc.weight", "[512, 128]", "[128, 512]"});
  expect_failure(broken("missing_wpe", [](auto& t) {
                   find_tensor(t, "wpe.weight")->name = "wpe.weights";
                 }),
                 {"wpe.weight"});
  expect_failure(broken("short_bias", [](auto& t) {
                   find_tensor(t, "ln_f.bias")->shape = {127};
                   find_tensor(t, "ln_f.bias")->bytes.resize(127 * 4);
                 }),
                 {"ln_f.bias", "[127]", "[128]"});

  std::string bytes = read_file(file1);
  write_file(path("truncated.safetensors"), bytes.substr(0, bytes.size() - 1000));
  expect_failure(run(train("--init-from " + path("truncated.safetensors") + flags)),
                 {"truncated.safetensors", "truncated"});
  write_file(path("stub.safetensors"), bytes.substr(0, 5));
  expect_failure(run(train("--init-from " + path("stub.safetensors") + flags)), {"truncated"});
  expect_failure(run(train("--init-from " + path("absent.safetensors") + flags)),
                 {"absent.safetensors"});
}

// A misspelt LayerNorm weight name makes the file look shorter: the layer count is probed
// through h.{i}.ln_1.weight. Today the error then blames a correctly named tensor of the
// "extra" block (h.1.ln_1.bias, "not a GPT-2 parameter name"), or for block 0 reports
// "--layers must be >= 1, got 0". Disabled until infer_hf_config counts blocks from every
// h.{i}.* name and the unknown-name check runs first (see the report).
TEST_F(Cli, MisspeltLayerNormNameIsNamed) {
  for (const std::string block : {"h.1.", "h.0."}) {
    auto tensors = hf_gpt2_tensors(HfOptions{});
    // Last in the data section, as sorted HF layouts put it after other tensors of the block.
    RawTensor misspelt = *find_tensor(tensors, block + "ln_1.weight");
    std::erase_if(tensors, [&](const RawTensor& t) { return t.name == block + "ln_1.weight"; });
    misspelt.name = block + "ln1.weight";
    tensors.push_back(misspelt);
    write_file(path("bad.safetensors"), safetensors_bytes(tensors, json()));
    expect_failure(run(train("--init-from " + path("bad.safetensors") +
                             " --seq-len 32 --micro-batch 2 --steps 1")),
                   {block + "ln1.weight"});
  }
}

// ---- 6. Bad input ----------------------------------------------------------------------

TEST_F(Cli, MissingDataIsNamed) {
  expect_failure(run(train(kTiny + " --steps 1", path("nowhere"))),
                 {"--data", "data folder " + path("nowhere") + " does not exist"});
  fs::create_directories(path("empty"));
  expect_failure(run(train(kTiny + " --steps 1", path("empty"))),
                 {path("empty") + " has no training shards", "manifest.json", "train.bin"});
  // A corpus shorter than one batch.
  std::vector<data::Token> few = {1, 2, 3};
  ASSERT_TRUE(data::write_token_file(path("empty/train.bin"), few).is_ok());
  expect_failure(run(train(kTiny + " --steps 1", path("empty"))), {"3 tokens", "fewer than"});
}

// A vocabulary past 16 bits (Llama 3's is 128,256): its token file is written with 32-bit
// ids, the model trains on it, and one whose vocabulary an id exceeds is refused naming it.
TEST_F(Cli, AVocabularyPast65536TrainsOnWideTokenFiles) {
  std::vector<data::Token> tokens(600);
  for (size_t i = 0; i < tokens.size(); i++) tokens[i] = (data::Token)(i * 7919 % 70001);
  tokens[300] = 70000;  // the largest id
  const std::string data = path("wide");
  fs::create_directories(data);
  ASSERT_TRUE(data::write_token_file(data + "/train.bin", tokens).is_ok());
  EXPECT_EQ(fs::file_size(data + "/train.bin"), data::kTokenFileHeaderBytes + 4 * tokens.size());
  const std::string small = "--model tiny --layers 1 --heads 2 --dim 16 --seq-len 16 --micro-batch 2 --steps 2 ";
  RunResult r = run(train(small + "--vocab 70001 --out " + path("run"), data));
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  const Metrics m = read_metrics(path("run") + "/metrics.jsonl");
  ASSERT_EQ(m.steps.size(), 2u);
  EXPECT_TRUE(std::isfinite(m.steps.back()["loss"].get<double>()));
  expect_failure(run(train(small + "--vocab 60000 --out " + path("never"), data)),
                 {"token id 70000", "vocabulary of 60000"});
  // Ids that fit 16 bits stay in llm.c's format.
  tokens.assign(600, 50000);
  ASSERT_TRUE(data::write_token_file(data + "/small.bin", tokens).is_ok());
  EXPECT_EQ(fs::file_size(data + "/small.bin"), data::kTokenFileHeaderBytes + 2 * tokens.size());
  std::vector<data::Token> back;
  ASSERT_TRUE(data::read_token_file(data + "/small.bin", &back).is_ok());
  EXPECT_EQ(back, tokens);
}

TEST_F(Cli, BadModelShapesAreNamed) {
  expect_failure(run(train(kTiny + " --heads 3 --steps 1")),
                 {"--heads 3 does not divide --dim 64"});
  expect_failure(run(train("--model huge --steps 1")), {"huge", "tiny"});
  // Brown's tokenizer has more ids than the model (a token file's ids past the vocabulary:
  // AVocabularyPast65536TrainsOnWideTokenFiles).
  expect_failure(run(train("--model tiny --seq-len 32 --micro-batch 2 --vocab 100 --steps 1")),
                 {"the model's vocabulary of 100 is smaller than the 50257 ids of the data's tokenizer"});
  expect_failure(run(train("--model tiny --seq-len 32 --micro-batch 2 --vocab 20000000 --steps 1")),
                 {"--vocab must be in [2, 16777216]", "20000000"});
  // A flag given twice is refused rather than silently resolved.
  expect_failure(run(train(kTiny + " --vocab 50257 --steps 1")), {"--vocab"});

  HfOptions o;  // 64 positions
  write_file(path("p64.safetensors"), safetensors_bytes(hf_gpt2_tensors(o), json()));
  expect_failure(run(train("--init-from " + path("p64.safetensors") +
                           " --seq-len 128 --micro-batch 1 --steps 1")),
                 {"--seq-len 128", "64 position"});
}

// 0 means "the preset's" for the shape flags, but a negative value is silently treated the
// same way today (--layers -1 trains the preset's 2 layers). Disabled until resolve_model()
// rejects negative shape flags (see the report).
TEST_F(Cli, NegativeShapeFlagsAreRejected) {
  expect_failure(run(train(kTiny + " --layers -1 --steps 1")), {"--layers", "-1"});
  expect_failure(run(train(kTiny + " --heads -4 --steps 1")), {"--heads", "-4"});
  expect_failure(run(train(kTiny + " --dim -64 --steps 1")), {"--dim", "-64"});
  expect_failure(run(train("--model tiny --seq-len -32 --micro-batch 2 --steps 1")), {"--seq-len"});
}

TEST_F(Cli, BadFlagsAreNamed) {
  expect_failure(run(train(kTiny + " --steps 1 --bogus-flag 3")), {"unknown flag --bogus-flag for meshtrain train"});
  // A misspelt flag or command is named with the nearest known one.
  expect_failure(run(train(kTiny + " --step 1")), {"unknown flag --step", "did you mean '--steps'?"});
  expect_failure(run(kBinary + " trian --steps 1"), {"unknown command 'trian'", "did you mean 'train'?"});
  expect_failure(run(kBinary + " bench tokenz"), {"unknown command 'tokenz' for meshtrain bench", "'tokenize'"});
  expect_failure(run(kBinary + " bench stpe --steps 1"), {"unknown command 'stpe' for meshtrain bench", "'step'"});
  // With its value, before other flags; nested.
  expect_failure(run(train("--step 10 " + kTiny)), {"unknown flag --step for meshtrain train", "'--steps'"});
  expect_failure(run(kBinary + " bench step --stesp 2"),
                 {"unknown flag --stesp for meshtrain bench step", "'--steps'"});
  // A flag of another command says which.
  expect_failure(run(kBinary + " prep --steps 3"),
                 {"unknown flag --steps for meshtrain prep (a flag of meshtrain train, meshtrain bench step",
                  "see meshtrain prep --help"});
  // A value that starts with "--" is a value, not a flag.
  expect_failure(run(kBinary + " tokenize --tokenizer --nowhere"), {"--nowhere", "does not exist"});
  expect_failure(run(train(kTiny + " --steps 1 --lr fast")), {"--lr", "fast"});
  expect_failure(run(train("--model tiny --seq-len 32 --micro-batch -2 --steps 1")),
                 {"--micro-batch must be >= 1, got -2"});
  expect_failure(run(train("--model tiny --seq-len 32 --micro-batch=-2 --steps 1")),
                 {"--micro-batch must be >= 1, got -2"});
  expect_failure(run(train(kTiny + " --steps 0")), {"--steps must be >= 1"});
  expect_failure(run(train(kTiny + " --steps 1 --beta2 1")), {"--beta1 and --beta2"});
  expect_failure(run(train(kTiny + " --steps 1 --save-every 1")), {"--save-every needs --out"});
  expect_failure(run(kBinary), {"subcommand"});
  expect_failure(run(kBinary + " fly"), {"unknown command 'fly' for meshtrain", "meshtrain --help"});
}

TEST_F(Cli, ResumeWithoutCheckpointIsNamed) {
  expect_failure(run(train(kTiny + " --steps 2 --resume")), {"--resume needs --out"});
  expect_failure(run(train(kTiny + " --steps 2 --resume --out " + path("fresh"))),
                 {"no checkpoint found", path("fresh")});
  // The failed resume did not start a run there.
  EXPECT_FALSE(fs::exists(path("fresh/metrics.jsonl")));
}

TEST_F(Cli, CorruptCheckpointIsNamed) {
  RunResult r = run(train(kTiny + " --steps 2 --quiet --out " + path("K")));
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  const std::string ckpt = path("K/checkpoints/step_00000002");
  const std::string good = read_file(ckpt + "/shard_00000.bin");
  const std::string resume = train(kTiny + " --steps 4 --out " + path("K") + " --resume");
  const std::string export_cmd =
      kBinary + " export --checkpoint " + path("K") + " --out " + path("x.safetensors");

  std::string flipped = good;
  for (size_t i = 1000; i < 1004; i++) flipped[i] = (char)~flipped[i];
  write_file(ckpt + "/shard_00000.bin", flipped);
  expect_failure(run(resume), {"shard_00000.bin", "checksum"});
  expect_failure(run(export_cmd), {"shard_00000.bin", "checksum"});
  EXPECT_FALSE(fs::exists(path("x.safetensors")));

  write_file(ckpt + "/shard_00000.bin", good.substr(0, good.size() - 64));
  expect_failure(run(resume), {"shard_00000.bin", "truncated"});
  write_file(ckpt + "/shard_00000.bin", good.substr(0, good.size() / 2));
  expect_failure(run(resume), {"shard_00000.bin", "truncated"});

  write_file(ckpt + "/shard_00000.bin", good);
  const std::string index = read_file(ckpt + "/index.json");
  write_file(ckpt + "/index.json", index.substr(0, index.size() / 2));
  expect_failure(run(resume), {"index.json", "corrupt"});

  expect_failure(run(kBinary + " export --checkpoint " + path("nothing") + " --out " +
                     path("y.safetensors")),
                 {"no checkpoint found", path("nothing")});

  // Restored, it resumes.
  write_file(ckpt + "/index.json", index);
  r = run(resume);
  EXPECT_EQ(r.exit_code, 0) << describe(r);
}

TEST_F(Cli, PrepAndTokenizeErrorsAreNamed) {
  expect_failure(run(kBinary + " prep --brown --tokenizer " + path("no_tokenizer") + " --out " +
                     path("o")),
                 {path("no_tokenizer"), "does not exist"});
  EXPECT_FALSE(fs::exists(path("o/train.bin")));
  expect_failure(run(kBinary + " prep --out " + path("o")), {"--brown", "--input"});
  expect_failure(run(kBinary + " prep --input " + path("missing.txt") + " --out " + path("o")),
                 {"missing.txt"});

  RunResult r = run("echo 15496 50257 | " + kBinary + " tokenize --decode");
  expect_failure(r, {"50257", "outside the vocabulary"});
  EXPECT_EQ(r.out, "");
  expect_failure(run("echo -1 | " + kBinary + " tokenize --decode"),
                 {"-1", "outside the vocabulary"});
  expect_failure(run("echo 15496 world | " + kBinary + " tokenize --decode"),
                 {"integer token ids", "'world'"});
  expect_failure(run("echo 99999999999 | " + kBinary + " tokenize --decode"), {"99999999999"});
  expect_failure(run("echo hi | " + kBinary + " tokenize --tokenizer " + path("none")),
                 {"does not exist"});
}

// std::stoi accepts a numeric prefix, so "12abc" and "1.5" decode as 12 and 1 (see report).
TEST_F(Cli, DecodeRejectsTrailingGarbage) {
  expect_failure(run("echo 12abc | " + kBinary + " tokenize --decode"), {"'12abc'"});
  expect_failure(run("echo 1.5 | " + kBinary + " tokenize --decode"), {"'1.5'"});
}

// ---- 7. --help -------------------------------------------------------------------------

TEST_F(Cli, HelpListsSubcommandsAndEveryTrainFlag) {
  RunResult top = run(kBinary + " --help");
  EXPECT_EQ(top.exit_code, 0) << describe(top);
  for (const char* sub : {"prep", "tokenize", "train", "export", "bench"})
    EXPECT_NE(top.out.find(sub), std::string::npos) << sub << " in\n" << top.out;

  RunResult help = run(kBinary + " train --help");
  EXPECT_EQ(help.exit_code, 0) << describe(help);
  for (const char* flag :
       {"--lr", "--min-lr", "--warmup-steps", "--weight-decay", "--beta1", "--beta2", "--eps",
        "--grad-clip", "--micro-batch", "--grad-accum", "--steps", "--seed", "--threads",
        "--layers", "--heads", "--dim", "--seq-len", "--vocab", "--model", "--init-from",
        "--out", "--eval-every", "--save-every", "--resume", "--data", "--eval-batches",
        "--keep-checkpoints", "--peak-gflops", "--quiet"}) {
    // As a whole word: "--lr " or "--lr\n", not the start of "--lr-something".
    const std::string text = help.out;
    bool found = false;
    for (size_t at = text.find(flag); at != std::string::npos; at = text.find(flag, at + 1)) {
      char next = at + std::strlen(flag) < text.size() ? text[at + std::strlen(flag)] : ' ';
      if (next == ' ' || next == '=' || next == '\n' || next == ',') found = true;
    }
    EXPECT_TRUE(found) << flag << " in\n" << text;
  }
  for (const char* sub : {"prep", "tokenize", "export"}) {
    RunResult r = run(kBinary + " " + sub + " --help");
    EXPECT_EQ(r.exit_code, 0) << describe(r);
    EXPECT_NE(r.out.find("--"), std::string::npos) << r.out;
  }
}

// ---- 8. tokenize -----------------------------------------------------------------------

TEST_F(Cli, TokenizeRoundTrip) {
  RunResult r = run("printf 'Hello world' | " + kBinary + " tokenize");
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_EQ(r.out, "15496 995\n");
  r = run("echo 15496 995 | " + kBinary + " tokenize --decode");
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_EQ(r.out, "Hello world");
  // A trailing newline is a token of its own.
  r = run("echo 'Hello world' | " + kBinary + " tokenize");
  EXPECT_EQ(r.out, "15496 995 198\n");
  // Bytes that are not valid UTF-8 on their own survive the round trip.
  r = run("printf 'caf\\303\\251 \\360\\237\\230\\200' | " + kBinary + " tokenize | " + kBinary +
          " tokenize --decode");
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_EQ(r.out, "caf\xc3\xa9 \xf0\x9f\x98\x80");
}

}  // namespace
}  // namespace meshtrain::test_cli
