// One prompt's continuation, as `generate` and `serve` both run it: the checks against the
// model before any token is sampled, the sampling loop on a KV cache with the request's own
// seeded generator (so a request's text is what it gets alone), stop strings over the
// streamed text, and the OpenAI-shaped record of the result.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "core/status.h"
#include "data/tokenizer.h"
#include "infer/decoder.h"
#include "infer/sampling.h"
#include "infer/shard_weights.h"
#include "infer/streamed_weights.h"
#include "model/gpt.h"


namespace meshtrain::cli {

// The sampling a completion gets when it asks for none, the same for `generate`'s flags and
// `serve`'s request fields: one definition, so that a seed gives one text through either.
inline constexpr infer::SampleOptions kDefaultSampling{0.8f, 40, 1.0f};
inline constexpr uint64_t kDefaultSeed = 1337;

struct CompletionRequest {
  std::string prompt;
  // The prompt is no text but the start of a document: the tokenizer's own BOS, or its
  // document separator (GPT-2's <|endoftext|>); `prompt` is that token's text, for printing.
  bool document_start = false;
  int max_tokens = 16;
  infer::SampleOptions sampling = kDefaultSampling;
  uint64_t seed = kDefaultSeed;
  std::vector<std::string> stop;
  int logprobs = -1;  // -1: none; N >= 0: each token's, and the N likeliest alternatives
};

struct Completion {
  std::string text;
  std::vector<int> prompt_tokens, tokens;
  std::vector<double> logprobs;
  std::vector<std::vector<infer::TokenLogprob>> alternatives;
  bool stopped = false;  // at a stop string or the tokenizer's EOS (else at max_tokens)
};

// Where a model's weights live while it generates: in memory, or streamed from a file a
// layer at a time (ZeRO-Inference, infer/streamed_weights.h).
struct WeightPlacement {
  bool stream = false;    // --offload weights=nvme
  std::string dir;        // --offload-dir ("": the system's temporary folder)
  int read_ahead = 1;     // --offload-read-ahead: layers read ahead (0: each when reached)
  double budget_gb = 0;   // --memory-budget (0: none): weights over it are streamed
  std::string offload;    // the --offload flag as given
};
// The flags above, for generate and serve.
void add_weight_flags(CLI::App* cmd, WeightPlacement* w);

struct LoadedModel {
  std::unique_ptr<model::Gpt> gpt;
  std::unique_ptr<infer::StreamedWeights> streamed;  // null: the weights are in memory
  std::unique_ptr<infer::ShardWeights> shard;  // on tp x pp ranks: this rank's share
};

// The model at `model_path` (a run, a checkpoint, a .safetensors or llm.c file), its weights
// placed as `w` says, and its tokenizer (`tokenizer_flag`, or the one find_tokenizer finds;
// an error when the model's vocabulary is smaller than the tokenizer's), for decoding at `at`'s place in a tp x pp group: before any weight is read, an error
// unless tp divides the model's key/value heads, pp is at most its layers, and streamed
// weights run on one rank. On several ranks each holds only the rows it reads
// (infer::ShardWeights): streamed from a checkpoint folder, or cut from a weights file read
// whole first.
Status load_for_completion(const std::string& model_path, const std::string& tokenizer_flag,
                           const WeightPlacement& w, const infer::DecodeGroups& at, LoadedModel* model,
                           std::unique_ptr<data::Tokenizer>* tok);
// A line on memory for stderr: the tracked peak against the budget (the largest of the
// model group's ranks: collective over `group` when given), the peak resident set, the
// weights a rank holds, and what streaming read and waited.
std::string memory_report(const WeightPlacement& w, const LoadedModel& model, comm::Group* group = nullptr);

// The token a document starts with (what a document_start prompt is): the tokenizer's BOS
// when it has one of its own, else its document separator; -1: none.
int document_start_token(const data::Tokenizer& tok);
// The request's settings and its prompt against the model and the tokenizer: the prompt's
// tokens (in c->prompt_tokens: the tokenizer's encode_with_special, so a BOS first where the
// format adds one) inside the vocabulary, prompt plus max_tokens inside the
// context. A prompt whose bytes alone prove it over the context (each token is at most the
// tokenizer's longest in bytes) is refused before it is encoded: a megabyte of text costs
// no tokenizing. Nothing is sampled.
Status prepare_completion(const model::Gpt& gpt, const data::Tokenizer& tok, const CompletionRequest& r,
                          Completion* c);
// Completions decoded together on one model (continuous batching): a completion joins
// between steps, its prompt prefilled in the next one; each step samples one token for
// every member, from its own seeded generator; a member leaves once it is done. Its text is
// exactly what it gets alone: the decoder's rows do not depend on the rows beside them
// (infer::BatchDecoder), and nothing else is shared. Sampling draws from the ids both the
// model and the tokenizer have; a sampled EOS ends a completion (finish_reason "stop", its
// text not shown). The text shown is each new token's bytes (Tokenizer::token_bytes): a
// continuation is in the middle of its sequence, where no start-of-text rule applies.
class CompletionBatch {
 public:
  struct Member {
    CompletionRequest request;
    Completion* completion = nullptr;  // prepared (prepare_completion); filled as it runs
    // Each piece of text as soon as no stop string can begin in it (null: none).
    std::function<void(const std::string&)> on_text;
    std::function<void()> on_done;     // after the last piece (null: none)
    std::function<bool()> abandoned;   // true: leave at the next step, done (null: never)
  };
  // `groups`: the model group's tp and pp ranks (infer::DecodeGroups), every one of which
  // runs the same batch and samples the same tokens.
  CompletionBatch(const model::Gpt& gpt, const data::Tokenizer& tok, infer::DecodeGroups groups = {});
  ~CompletionBatch();
  void join(Member m);
  // One token for every member (its prompt first, when it has just joined); the finished
  // and the abandoned leave.
  void step();
  int size() const { return (int)members_.size(); }

 private:
  struct State;
  void finish(State& m);

  const model::Gpt& gpt_;
  const data::Tokenizer& tok_;
  std::unique_ptr<infer::BatchDecoder> decoder_;
  std::vector<std::unique_ptr<State>> members_;
};

// A prepared completion's continuation, alone (a batch of one).
void run_completion(const model::Gpt& gpt, const data::Tokenizer& tok, const CompletionRequest& r,
                    const std::function<void(const std::string&)>& on_text, Completion* c,
                    infer::DecodeGroups groups = {});

// A token's text for JSON (its token_bytes): a token may end inside a multi-byte character
// (byte-level BPE, byte pieces), and such bytes become U+FFFD when the JSON is written
// (dump_json).
std::string token_text(const data::Tokenizer& tok, int token);
// An OpenAI completion choice: index, text, finish_reason, and logprobs (tokens,
// token_logprobs, top_logprobs) when asked for, else null.
nlohmann::json completion_choice(const data::Tokenizer& tok, int index, const CompletionRequest& r,
                                 const Completion& c);
std::string dump_json(const nlohmann::json& j);

}  // namespace meshtrain::cli
