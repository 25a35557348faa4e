#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "checkpoint/model_file.h"
#include "cli/commands.h"
#include "cli/config_file.h"
#include "data/bpe.h"
#include "infer/decoder.h"
#include "infer/sampling.h"

namespace meshtrain::cli {

namespace {

struct GenerateOptions {
  std::string model, prompt = "<|endoftext|>", tokenizer;  // "": the run's own (find_tokenizer)
  std::string prompts_file;  // one prompt per line (instead of --prompt)
  std::vector<std::string> stop;
  int max_new_tokens = 100, top_k = 40, threads = 0;
  int logprobs = -1;  // -1: none; N >= 0: each token's, and the N most likely alternatives
  float temperature = 0.8f, top_p = 1.0f;
  uint64_t seed = 1337;
  bool json = false;
};

// The prompts to continue: --prompt, or --prompts' lines (each line one prompt; an empty
// line is an error, as an empty --prompt is).
Status read_prompts(const GenerateOptions& o, std::vector<std::string>* prompts) {
  if (o.prompts_file.empty()) {
    if (o.prompt.empty()) return Status::error("--prompt is empty");
    *prompts = {o.prompt};
    return Status::ok();
  }
  std::ifstream in(o.prompts_file);
  if (!in) return Status::error("--prompts " + o.prompts_file + ": cannot open it");
  std::string line;
  for (int n = 1; std::getline(in, line); n++) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) return Status::error("--prompts " + o.prompts_file + ": line " + std::to_string(n) + " is empty");
    prompts->push_back(line);
  }
  if (prompts->empty()) return Status::error("--prompts " + o.prompts_file + ": no prompts in it");
  return Status::ok();
}

Status check_generate_options(const GenerateOptions& o) {
  if (o.max_new_tokens < 0) return Status::error("--max-new-tokens must be >= 0");
  if (o.temperature < 0) return Status::error("--temperature must be >= 0 (0 = greedy)");
  if (o.top_k < 0) return Status::error("--top-k must be >= 0 (0 = no limit)");
  if (!(o.top_p > 0 && o.top_p <= 1)) return Status::error("--top-p must be in (0, 1] (1 = no cut)");
  if (o.logprobs > 20) return Status::error("--logprobs must be 0-20 (alternatives per token), got " + std::to_string(o.logprobs));
  if (o.logprobs >= 0 && !o.json) return Status::error("--logprobs needs --json (the log-probabilities are JSON fields)");
  if (!o.prompts_file.empty() && o.prompt != GenerateOptions{}.prompt)
    return Status::error("--prompt and --prompts both given: choose one");
  return Status::ok();
}

// One prompt's continuation: text streamed to stdout as it is sampled (unless --json), and
// its record for --json.
struct Continuation {
  std::string text;
  std::vector<int> tokens;
  std::vector<double> logprobs;
  std::vector<std::vector<infer::TokenLogprob>> alternatives;
  bool stopped = false;  // at a stop string (else at --max-new-tokens)
};

Status continue_prompt(const GenerateOptions& o, const model::Gpt& gpt, const data::Gpt2Tokenizer& tok,
                       const std::string& text, Continuation* c) {
  std::vector<int> prompt = tok.encode(text);
  const int context = gpt.config().max_seq_len;
  for (int id : prompt)
    if (id >= gpt.config().vocab)
      return Status::error("the prompt has token " + std::to_string(id) + ", outside the model's vocabulary of " +
                           std::to_string(gpt.config().vocab));
  // The last new token is printed but never fed back, so it needs no position.
  if ((int)prompt.size() + std::max(0, o.max_new_tokens - 1) > context)
    return Status::error("the prompt (" + std::to_string(prompt.size()) + " tokens) plus " + "--max-new-tokens " +
                         std::to_string(o.max_new_tokens) + " exceeds the model's context of " +
                         std::to_string(context) + " tokens");
  // A model's vocabulary is often padded past the tokenizer's (GPT-2's 50257 to 50304):
  // the padding rows are no text, so sampling draws only from ids the tokenizer can decode.
  const int sampled_vocab = std::min(gpt.config().vocab, tok.vocab_size());
  const infer::SampleOptions sampling{o.temperature, o.top_k, o.top_p};
  infer::KvCacheDecoder decoder(gpt);
  infer::StopStrings stops(o.stop);
  std::mt19937_64 rng(o.seed);  // each prompt's own: its text is what it gets alone
  auto show = [&](const std::string& piece) {
    c->text += piece;
    if (o.json) return;
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);  // stream as produced
  };
  if (!o.json) show(text), c->text.clear();
  const float* logits = decoder.append(prompt);
  for (int i = 0; i < o.max_new_tokens && !stops.stopped(); i++) {
    const int next = infer::sample_token(logits, sampled_vocab, sampling, rng);
    c->tokens.push_back(next);
    if (o.logprobs >= 0) {
      c->logprobs.push_back(infer::token_logprob(logits, sampled_vocab, next));
      c->alternatives.push_back(infer::top_logprobs(logits, sampled_vocab, o.logprobs));
    }
    show(stops.feed(tok.decode(std::span<const int>(&next, 1))));
    if (i + 1 < o.max_new_tokens && !stops.stopped()) logits = decoder.append(std::span<const int>(&next, 1));
  }
  show(stops.finish());
  c->stopped = stops.stopped();
  if (!o.json) std::printf("\n");
  return Status::ok();
}

// The --json record of prompt `index`, in the shape of an OpenAI completion choice.
nlohmann::json continuation_json(const GenerateOptions& o, const data::Gpt2Tokenizer& tok, int index,
                                 const std::string& prompt, const Continuation& c) {
  nlohmann::json j = {{"index", index}, {"prompt", prompt}, {"text", c.text}, {"tokens", c.tokens},
                      {"finish_reason", c.stopped ? "stop" : "length"}};
  if (o.logprobs >= 0) {
    nlohmann::json top = nlohmann::json::array();
    for (const auto& alts : c.alternatives) {
      nlohmann::json t = nlohmann::json::object();
      for (const infer::TokenLogprob& a : alts) t[tok.decode(std::span<const int>(&a.token, 1))] = a.logprob;
      top.push_back(t);
    }
    j["logprobs"] = {{"token_logprobs", c.logprobs}, {"top_logprobs", top}};
  }
  return j;
}

Status generate(const GenerateOptions& o) {
  RETURN_IF_ERROR(check_generate_options(o));
  std::vector<std::string> prompts;
  RETURN_IF_ERROR(read_prompts(o, &prompts));
  if (o.threads > 0) omp_set_num_threads(o.threads);
  std::string tokenizer_dir;
  RETURN_IF_ERROR(find_tokenizer(o.model, o.tokenizer, &tokenizer_dir));
  data::Gpt2Tokenizer tok;
  RETURN_IF_ERROR(data::Gpt2Tokenizer::load(tokenizer_dir, &tok));
  std::unique_ptr<model::Gpt> gpt;
  RETURN_IF_ERROR(checkpoint::open_model_file(o.model, 0, &gpt));
  for (size_t i = 0; i < prompts.size(); i++) {
    Continuation c;
    Status s = continue_prompt(o, *gpt, tok, prompts[i], &c);
    if (!s.is_ok()) return prompts.size() > 1 ? s.with_context("prompt " + std::to_string(i + 1)) : s;
    // A token may end inside a multi-byte character (byte-level BPE): such bytes print as
    // U+FFFD in JSON, which has no raw bytes.
    if (o.json)
      std::printf("%s\n", continuation_json(o, tok, (int)i, prompts[i], c)
                              .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
                              .c_str());
  }
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
  cmd->add_option("--top-p", o->top_p,
                  "Nucleus sampling: the smallest set of most likely tokens whose probability reaches P (1 = all)")
      ->capture_default_str();
  cmd->add_option("--stop", o->stop, "Stop before this text (repeatable; it is not printed)");
  cmd->add_option("--prompts", o->prompts_file, "A file of prompts, one per line, each continued on its own");
  cmd->add_flag("--json", o->json,
                "One JSON line per prompt: text, tokens, finish_reason (stop or length), and with --logprobs "
                "their log-probabilities");
  cmd->add_option("--logprobs", o->logprobs,
                  "With --json: each token's log-probability under the model, and the N most likely "
                  "alternatives (0-20)");
  cmd->add_option("--seed", o->seed, "Sampling seed (same seed, same text; each prompt starts from it)")
      ->capture_default_str();
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
