#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <random>

#include "checkpoint/model_file.h"
#include "cli/commands.h"
#include "cli/config_file.h"
#include "data/bpe.h"
#include "infer/decoder.h"

namespace meshtrain::cli {

namespace {

struct GenerateOptions {
  std::string model, prompt = "<|endoftext|>", tokenizer;  // "": the run's own (find_tokenizer)
  int max_new_tokens = 100, top_k = 40, threads = 0;
  float temperature = 0.8f;
  uint64_t seed = 1337;
};

Status generate(const GenerateOptions& o) {
  if (o.max_new_tokens < 0) return Status::error("--max-new-tokens must be >= 0");
  if (o.temperature < 0) return Status::error("--temperature must be >= 0 (0 = greedy)");
  if (o.top_k < 0) return Status::error("--top-k must be >= 0 (0 = no limit)");
  if (o.threads > 0) omp_set_num_threads(o.threads);
  std::string tokenizer_dir;
  RETURN_IF_ERROR(find_tokenizer(o.model, o.tokenizer, &tokenizer_dir));
  data::Gpt2Tokenizer tok;
  RETURN_IF_ERROR(data::Gpt2Tokenizer::load(tokenizer_dir, &tok));
  std::unique_ptr<model::Gpt> gpt;
  RETURN_IF_ERROR(checkpoint::open_model_file(o.model, 0, &gpt));
  std::vector<int> prompt = tok.encode(o.prompt);
  const int context = gpt->config().max_seq_len;
  if (prompt.empty()) return Status::error("--prompt is empty");
  for (int id : prompt)
    if (id >= gpt->config().vocab)
      return Status::error("the prompt has token " + std::to_string(id) +
                           ", outside the model's vocabulary of " + std::to_string(gpt->config().vocab));
  // The last new token is printed but never fed back, so it needs no position.
  if ((int)prompt.size() + std::max(0, o.max_new_tokens - 1) > context)
    return Status::error("the prompt (" + std::to_string(prompt.size()) + " tokens) plus " +
                         "--max-new-tokens " + std::to_string(o.max_new_tokens) +
                         " exceeds the model's context of " + std::to_string(context) + " tokens");
  // A model's vocabulary is often padded past the tokenizer's (GPT-2's 50257 to 50304):
  // the padding rows are no text, so sampling draws only from ids the tokenizer can decode.
  const int sampled_vocab = std::min(gpt->config().vocab, tok.vocab_size());
  infer::KvCacheDecoder decoder(*gpt);
  std::mt19937_64 rng(o.seed);
  std::fwrite(o.prompt.data(), 1, o.prompt.size(), stdout);
  std::fflush(stdout);
  const float* logits = decoder.append(prompt);
  for (int i = 0; i < o.max_new_tokens; i++) {
    int next = infer::sample_token(logits, sampled_vocab, {o.temperature, o.top_k}, rng);
    std::string piece = tok.decode(std::span<const int>(&next, 1));
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);  // stream as produced
    if (i + 1 < o.max_new_tokens) logits = decoder.append(std::span<const int>(&next, 1));
  }
  std::printf("\n");
  return Status::ok();
}

}  // namespace

Command add_generate_command(CLI::App& app) {
  auto o = std::make_shared<GenerateOptions>();
  auto* cmd = app.add_subcommand("generate", "Sample text from a model (KV cache, streamed)");
  add_config_option(cmd);
  cmd->add_option("--checkpoint", o->model,
                  "Run folder, checkpoint folder, .safetensors or llm.c .bin")->required();
  cmd->add_option("--prompt", o->prompt, "Text to continue")->capture_default_str();
  cmd->add_option("--max-new-tokens", o->max_new_tokens, "Tokens to generate")->capture_default_str();
  cmd->add_option("--temperature", o->temperature, "Softmax temperature (0 = greedy)")
      ->capture_default_str();
  cmd->add_option("--top-k", o->top_k, "Sample among the K most likely tokens (0 = all)")
      ->capture_default_str();
  cmd->add_option("--seed", o->seed, "Sampling seed (same seed, same text)")->capture_default_str();
  cmd->add_option("--tokenizer", o->tokenizer,
                  "Folder with encoder.json and vocab.bpe (default: the run's tokenizer/ copy, then its "
                  "data folder's)");
  cmd->add_option("--threads", o->threads, "OpenMP threads (0 = all cores)");
  return {cmd, [o] {
            Status s = generate(*o);
            return s.is_ok() ? 0 : fail(s);
          }};
}

}  // namespace meshtrain::cli
