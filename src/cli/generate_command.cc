#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <random>

#include "cli/commands.h"
#include "cli/completion.h"
#include "cli/config_file.h"
#include "data/bpe.h"

namespace meshtrain::cli {

namespace {

struct GenerateOptions {
  std::string model, prompt = "<|endoftext|>", tokenizer;  // "": the run's own (find_tokenizer)
  std::string prompts_file;  // one prompt per line (instead of --prompt)
  std::vector<std::string> stop;
  int max_new_tokens = 100, top_k = 40, threads = 0;
  int batch = 8;  // --prompts decoded together
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
  if (o.batch < 1) return Status::error("--batch must be >= 1 (prompts decoded together)");
  if (!o.prompts_file.empty() && o.prompt != GenerateOptions{}.prompt)
    return Status::error("--prompt and --prompts both given: choose one");
  return Status::ok();
}

// One prompt: its text streamed as it is sampled.
void generate_one(const model::Gpt& gpt, const data::Gpt2Tokenizer& tok, const CompletionRequest& r, Completion* c,
                  bool json) {
  if (json) {
    run_completion(gpt, tok, r, nullptr, c);
    return;
  }
  auto stream = [](const std::string& piece) {
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);  // as produced
  };
  stream(r.prompt);
  run_completion(gpt, tok, r, stream, c);
  std::printf("\n");
}

void print_completion(const data::Gpt2Tokenizer& tok, int index, const CompletionRequest& r, const Completion& c,
                      bool json) {
  if (!json) {
    std::printf("%s%s\n", r.prompt.c_str(), c.text.c_str());
    return;
  }
  nlohmann::json j = completion_choice(tok, index, r, c);
  j["prompt"] = r.prompt;
  std::printf("%s\n", dump_json(j).c_str());
}

Status generate(const GenerateOptions& o) {
  RETURN_IF_ERROR(check_generate_options(o));
  std::vector<std::string> prompts;
  RETURN_IF_ERROR(read_prompts(o, &prompts));
  if (o.threads > 0) omp_set_num_threads(o.threads);
  data::Gpt2Tokenizer tok;
  std::unique_ptr<model::Gpt> gpt;
  RETURN_IF_ERROR(load_for_completion(o.model, o.tokenizer, &gpt, &tok));
  const int n = (int)prompts.size();
  std::vector<CompletionRequest> requests;
  std::vector<Completion> done(n);
  for (int i = 0; i < n; i++) {
    requests.push_back({prompts[i], o.max_new_tokens, {o.temperature, o.top_k, o.top_p}, o.seed, o.stop, o.logprobs});
    if (Status s = prepare_completion(*gpt, tok, requests[i], &done[i]); !s.is_ok())
      return n > 1 ? s.with_context("prompt " + std::to_string(i + 1)) : s;
  }
  if (n == 1) {
    generate_one(*gpt, tok, requests[0], &done[0], o.json);
    if (o.json) print_completion(tok, 0, requests[0], done[0], true);
    return Status::ok();
  }
  // Several: up to --batch of them decoded together, the next joining as one finishes, each
  // printed whole, in the file's order, once it and those before it are done.
  CompletionBatch batch(*gpt, tok);
  std::vector<char> finished(n, 0);
  int joined = 0, printed = 0;
  while (printed < n) {
    while (joined < n && batch.size() < o.batch) {
      const int i = joined++;
      batch.join({requests[i], &done[i], nullptr, [&finished, i] { finished[i] = 1; }, nullptr});
    }
    batch.step();
    for (; printed < n && finished[printed]; printed++) print_completion(tok, printed, requests[printed], done[printed], o.json);
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
  cmd->add_option("--prompts", o->prompts_file,
                  "A file of prompts, one per line, each continued as if alone (printed whole, in order)");
  cmd->add_option("--batch", o->batch,
                  "With --prompts: how many are decoded together (the text is the same at any size)")
      ->capture_default_str();
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
