#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>

#include "cli/commands.h"
#include "cli/launch.h"
#include "comm/mesh.h"
#include "comm/strings.h"
#include "core/clock.h"
#include "cli/completion.h"
#include "cli/config_file.h"
#include "data/tokenizer.h"

namespace meshtrain::cli {

namespace {

struct GenerateOptions {
  std::string model, prompt, tokenizer;  // tokenizer "": the run's own (find_tokenizer)
  bool prompt_given = false;  // --prompt (else: the start of a document)
  std::string prompts_file;  // one prompt per line (instead of --prompt)
  std::vector<std::string> stop;
  int max_new_tokens = 100, top_k = kDefaultSampling.top_k, threads = 0;
  int batch = 8;  // --prompts decoded together
  int tp = 1, pp = 1, dp = 1;  // the ranks' layout (tp x pp a model group; dp replicas)
  int cp = 1;                  // refused unless 1 (decode_without_cp)
  int micro_batches = 1;       // with pp: groups of sequences that follow each other
  WeightPlacement weights;
  int logprobs = -1;  // -1: none; N >= 0: each token's, and the N most likely alternatives
  float temperature = kDefaultSampling.temperature, top_p = kDefaultSampling.top_p;
  uint64_t seed = kDefaultSeed;
  bool json = false;
};

// The prompts to continue: --prompt, or --prompts' lines (each line one prompt; an empty
// line is an error, as an empty --prompt is). Neither: no prompt (the start of a document).
Status read_prompts(const GenerateOptions& o, std::vector<std::string>* prompts) {
  if (o.prompts_file.empty()) {
    if (o.prompt_given && o.prompt.empty()) return Status::error("--prompt is empty");
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
  RETURN_IF_ERROR(decode_without_cp("generate", o.cp));
  if (o.max_new_tokens < 0) return Status::error("--max-new-tokens must be >= 0");
  if (o.temperature < 0) return Status::error("--temperature must be >= 0 (0 = greedy)");
  if (o.top_k < 0) return Status::error("--top-k must be >= 0 (0 = no limit)");
  if (!(o.top_p > 0 && o.top_p <= 1)) return Status::error("--top-p must be in (0, 1] (1 = no cut)");
  if (o.logprobs > 20) return Status::error("--logprobs must be 0-20 (alternatives per token), got " + std::to_string(o.logprobs));
  if (o.logprobs >= 0 && !o.json) return Status::error("--logprobs needs --json (the log-probabilities are JSON fields)");
  if (o.batch < 1) return Status::error("--batch must be >= 1 (prompts decoded together)");
  if (o.tp < 1 || o.pp < 1 || o.dp < 1) return Status::error("--tp, --pp and --dp must be >= 1");
  if (o.micro_batches < 1) return Status::error("--micro-batches must be >= 1");
  if (!o.prompts_file.empty() && o.prompt_given)
    return Status::error("--prompt and --prompts both given: choose one");
  return Status::ok();
}

// Prints `record` as it is, or keeps it for the gather at the end (data-parallel replicas).
struct Output {
  bool printer = true;            // this rank prints (world rank 0)
  std::vector<std::string>* kept = nullptr;  // dp > 1: every record of this replica, in order
  void emit(const std::string& record) const {
    if (kept) kept->push_back(record);
    else if (printer) std::fputs(record.c_str(), stdout), std::fflush(stdout);
  }
};

std::string record_of(const data::Tokenizer& tok, int index, const CompletionRequest& r, const Completion& c,
                      bool json) {
  if (!json) return r.prompt + c.text + "\n";
  nlohmann::json j = completion_choice(tok, index, r, c);
  j["prompt"] = r.prompt;
  return dump_json(j) + "\n";
}

Status generate(const GenerateOptions& o, comm::Group& world) {
  comm::MeshShape shape;  // (the options were checked before any rank started)
  RETURN_IF_ERROR(comm::resolve_mesh(world.size(), o.tp, o.pp, o.dp, &shape));
  std::vector<std::string> prompts;
  RETURN_IF_ERROR(read_prompts(o, &prompts));
  if (o.threads > 0) omp_set_num_threads(o.threads);
  std::unique_ptr<data::Tokenizer> tokenizer;
  comm::Mesh mesh(world, shape);
  const infer::DecodeGroups groups{o.tp > 1 ? &mesh.tp() : nullptr, o.pp > 1 ? &mesh.pp() : nullptr, o.micro_batches};
  LoadedModel loaded;
  RETURN_IF_ERROR(load_for_completion(o.model, o.tokenizer, o.weights, groups, &loaded, &tokenizer));
  const data::Tokenizer& tok = *tokenizer;
  const std::unique_ptr<model::Gpt>& gpt = loaded.gpt;
  const auto decoding = std::chrono::steady_clock::now();  // the model loaded
  const int n = (int)prompts.size();
  std::vector<CompletionRequest> requests;
  std::vector<Completion> done(n);
  for (int i = 0; i < n; i++) {
    const bool start = prompts[i].empty();  // no --prompt: the start of a document, shown as its token
    const int start_id = document_start_token(tok);
    requests.push_back({start && start_id >= 0 ? std::string(tok.token_bytes(start_id)) : prompts[i], start,
                        o.max_new_tokens, {o.temperature, o.top_k, o.top_p}, o.seed, o.stop, o.logprobs});
    if (Status s = prepare_completion(*gpt, tok, requests[i], &done[i]); !s.is_ok())
      return n > 1 ? s.with_context("prompt " + std::to_string(i + 1)) : s;
  }
  std::vector<std::string> kept;
  const Output out{world.rank() == 0, o.dp > 1 ? &kept : nullptr};
  // This replica's prompts: i % dp == its dp rank.
  std::vector<int> mine;
  for (int i = mesh.dp_rank(); i < n; i += o.dp) mine.push_back(i);
  if (n == 1 && !o.json) {  // one prompt: its text as it is produced
    auto stream = [&](const std::string& piece) { out.emit(piece); };
    out.emit(requests[0].prompt);
    run_completion(*gpt, tok, requests[0], stream, &done[0], groups);
    out.emit("\n");
  } else {
    // Up to --batch decoded together, the next joining as one finishes, each printed whole,
    // in the file's order, once it and those before it are done.
    CompletionBatch batch(*gpt, tok, groups);
    std::vector<char> finished(n, 0);
    size_t joined = 0, printed = 0;
    while (printed < mine.size()) {
      while (joined < mine.size() && batch.size() < o.batch) {
        const int i = mine[joined++];
        batch.join({requests[i], &done[i], nullptr, [&finished, i] { finished[i] = 1; }, nullptr});
      }
      batch.step();
      for (; printed < mine.size() && finished[mine[printed]]; printed++)
        out.emit(record_of(tok, mine[printed], requests[mine[printed]], done[mine[printed]], o.json));
    }
  }
  if (loaded.streamed || o.weights.budget_gb > 0) {  // the same on every rank
    const double seconds = seconds_since(decoding);
    const std::string memory = memory_report(o.weights, loaded, &world);
    int64_t tokens = 0;
    for (int i : mine) tokens += (int64_t)done[i].tokens.size();
    if (world.rank() == 0)
      std::fprintf(stderr, "%s; decoding: %lld tokens in %.3f s (%.1f tokens/s)\n", memory.c_str(), (long long)tokens,
                   seconds, tokens / std::max(seconds, 1e-9));
  }
  if (o.dp == 1) return Status::ok();
  // Replicas' records to world rank 0, printed in the prompts' order: prompt i is record
  // i / dp of replica i % dp (a replica's first rank; its other ranks send nothing).
  const bool speaks = mesh.tp_rank() == 0 && mesh.pp_rank() == 0;
  const std::vector<std::string> all = comm::gather_strings(world, speaks ? nlohmann::json(kept).dump() : "");
  if (world.rank() != 0) return Status::ok();
  std::vector<std::vector<std::string>> by_replica(o.dp);
  for (int r = 0; r < world.size(); r++) {
    const comm::MeshCoord at = comm::Mesh::coordinates(r, shape);
    if (at.tp == 0 && at.pp == 0) by_replica[at.dp] = nlohmann::json::parse(all[r]).get<std::vector<std::string>>();
  }
  for (int i = 0; i < n; i++) std::fputs(by_replica[i % o.dp][i / o.dp].c_str(), stdout);
  return Status::ok();
}

}  // namespace

Command add_generate_command(CLI::App& app) {
  auto o = std::make_shared<GenerateOptions>();
  auto* cmd = app.add_subcommand("generate", "Sample text from a model (KV cache, streamed)");
  add_config_option(cmd);
  cmd->add_option("--checkpoint", o->model,
                  "Run folder, checkpoint folder, .safetensors or llm.c .bin")->required();
  cmd->add_option("--prompt", o->prompt,
                  "Text to continue (default: the start of a document, the tokenizer's BOS or GPT-2's "
                  "<|endoftext|>)")
      ->each([o](const std::string&) { o->prompt_given = true; });
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
                  "Tokenizer folder or file: tokenizer.json, tokenizer.model (SentencePiece), *.tiktoken, "
                  "encoder.json + vocab.bpe (default: a Hugging Face folder's own, the run's tokenizer/ copy, "
                  "then its data folder's)");
  cmd->add_option("--threads", o->threads, "OpenMP threads (0 = all cores; per rank)");
  add_weight_flags(cmd, &o->weights);
  cmd->add_option("--tp", o->tp, "Tensor-parallel ranks per model (split by key/value heads; same text)")
      ->capture_default_str();
  cmd->add_option("--pp", o->pp, "Pipeline stages per model (split by layers; same text)")->capture_default_str();
  cmd->add_option("--micro-batches", o->micro_batches,
                  "With --pp: a step's sequences go through the stages in this many groups (1 measured fastest "
                  "on 2 cores)")
      ->capture_default_str();
  cmd->add_option("--dp", o->dp, "Model replicas, each continuing its share of --prompts")->capture_default_str();
  cmd->add_option("--cp", o->cp, "Context parallelism: training only (decoding refuses --cp > 1)")->capture_default_str();
  return {cmd, [o] {
            if (Status s = check_generate_options(*o); !s.is_ok()) return fail(s);
            return run_on_ranks(o->tp * o->pp * o->dp, o->threads, [o](comm::Group& world) { return generate(*o, world); });
          }};
}

}  // namespace meshtrain::cli
