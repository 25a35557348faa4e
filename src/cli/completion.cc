#include "cli/completion.h"

#include <algorithm>
#include <random>
#include <span>

#include "checkpoint/model_file.h"
#include "cli/commands.h"

namespace meshtrain::cli {

Status load_for_completion(const std::string& model_path, const std::string& tokenizer_flag,
                           std::unique_ptr<model::Gpt>* gpt, data::Gpt2Tokenizer* tok) {
  std::string tokenizer_dir;
  RETURN_IF_ERROR(find_tokenizer(model_path, tokenizer_flag, &tokenizer_dir));
  RETURN_IF_ERROR(data::Gpt2Tokenizer::load(tokenizer_dir, tok));
  return checkpoint::open_model_file(model_path, 0, gpt);
}

Status check_decode_layout(const model::GptConfig& c, int tp, int pp) {
  if (tp < 1 || pp < 1) return Status::error("--tp and --pp must be >= 1");
  if (c.kv_head_count() % tp != 0)
    return Status::error("--tp " + std::to_string(tp) + " must divide the model's " +
                         std::to_string(c.kv_head_count()) + " key/value heads (the KV cache is split by them)");
  if (pp > c.layers)
    return Status::error("--pp " + std::to_string(pp) + " is more stages than the model's " + std::to_string(c.layers) +
                         " layers");
  return Status::ok();
}

Status prepare_completion(const model::Gpt& gpt, const data::Gpt2Tokenizer& tok, const CompletionRequest& r,
                          Completion* c) {
  if (r.max_tokens < 0) return Status::error("max_tokens must be >= 0");
  if (!(r.sampling.temperature >= 0)) return Status::error("temperature must be >= 0 (0 = greedy)");
  if (r.sampling.top_k < 0) return Status::error("top_k must be >= 0 (0 = no limit)");
  if (!(r.sampling.top_p > 0 && r.sampling.top_p <= 1)) return Status::error("top_p must be in (0, 1] (1 = no cut)");
  if (r.logprobs > 20) return Status::error("logprobs must be 0-20, got " + std::to_string(r.logprobs));
  if (r.prompt.empty()) return Status::error("the prompt is empty");
  c->prompt_tokens = tok.encode(r.prompt);
  const int context = gpt.config().max_seq_len;
  for (int id : c->prompt_tokens)
    if (id >= gpt.config().vocab)
      return Status::error("the prompt has token " + std::to_string(id) + ", outside the model's vocabulary of " +
                           std::to_string(gpt.config().vocab));
  // The last new token is returned but never fed back, so it needs no position.
  if ((int)c->prompt_tokens.size() + std::max(0, r.max_tokens - 1) > context)
    return Status::error("the prompt (" + std::to_string(c->prompt_tokens.size()) + " tokens) plus max_tokens " +
                         std::to_string(r.max_tokens) + " exceeds the model's context of " + std::to_string(context) +
                         " tokens");
  return Status::ok();
}

struct CompletionBatch::State {
  Member m;
  int id = 0;  // the decoder's sequence
  infer::StopStrings stops;
  std::mt19937_64 rng;  // the request's own
  bool prefilled = false;
  int next = 0;  // the last sampled token, fed at the next step
  State(Member member, int seq)
      : m(std::move(member)), id(seq), stops(m.request.stop), rng(m.request.seed) {}
  void show(const std::string& piece) {
    m.completion->text += piece;
    if (m.on_text && !piece.empty()) m.on_text(piece);
  }
};

CompletionBatch::CompletionBatch(const model::Gpt& gpt, const data::Gpt2Tokenizer& tok, infer::DecodeGroups groups)
    : gpt_(gpt), tok_(tok), decoder_(std::make_unique<infer::BatchDecoder>(gpt, groups)) {}
CompletionBatch::~CompletionBatch() = default;

void CompletionBatch::join(Member m) {
  const int max_tokens = m.request.max_tokens;
  auto state = std::make_unique<State>(std::move(m), decoder_->add());
  if (max_tokens == 0) return finish(*state);
  members_.push_back(std::move(state));
}

void CompletionBatch::finish(State& s) {
  s.show(s.stops.finish());
  s.m.completion->stopped = s.stops.stopped();
  decoder_->remove(s.id);
  if (s.m.on_done) s.m.on_done();
}

void CompletionBatch::step() {
  std::erase_if(members_, [&](const std::unique_ptr<State>& s) {
    if (!s->m.abandoned || !s->m.abandoned()) return false;
    finish(*s);
    return true;
  });
  std::vector<infer::BatchDecoder::Rows> rows;
  for (auto& s : members_) {
    rows.push_back({s->id, s->prefilled ? std::span<const int>(&s->next, 1)
                                        : std::span<const int>(s->m.completion->prompt_tokens)});
    s->prefilled = true;
  }
  if (rows.empty()) return;
  decoder_->step(rows);
  // A model's vocabulary is often padded past the tokenizer's (GPT-2's 50257 to 50304):
  // the padding rows are no text, so sampling draws only from ids the tokenizer can decode.
  const int sampled_vocab = std::min(gpt_.config().vocab, tok_.vocab_size());
  std::erase_if(members_, [&](const std::unique_ptr<State>& s) {
    const CompletionRequest& r = s->m.request;
    Completion* c = s->m.completion;
    const float* logits = decoder_->logits(s->id);
    s->next = infer::sample_token(logits, sampled_vocab, r.sampling, s->rng);
    c->tokens.push_back(s->next);
    if (r.logprobs >= 0) {
      c->logprobs.push_back(infer::token_logprob(logits, sampled_vocab, s->next));
      c->alternatives.push_back(infer::top_logprobs(logits, sampled_vocab, r.logprobs));
    }
    s->show(s->stops.feed(tok_.decode(std::span<const int>(&s->next, 1))));
    if ((int)c->tokens.size() < r.max_tokens && !s->stops.stopped()) return false;
    finish(*s);
    return true;
  });
}

void run_completion(const model::Gpt& gpt, const data::Gpt2Tokenizer& tok, const CompletionRequest& r,
                    const std::function<void(const std::string&)>& on_text, Completion* c,
                    infer::DecodeGroups groups) {
  CompletionBatch batch(gpt, tok, groups);
  batch.join({r, c, on_text, nullptr, nullptr});
  while (batch.size() > 0) batch.step();
}

std::string token_text(const data::Gpt2Tokenizer& tok, int token) {
  return tok.decode(std::span<const int>(&token, 1));
}

nlohmann::json completion_choice(const data::Gpt2Tokenizer& tok, int index, const CompletionRequest& r,
                                 const Completion& c) {
  nlohmann::json j = {{"index", index},
                      {"text", c.text},
                      {"tokens", c.tokens},
                      {"finish_reason", c.stopped ? "stop" : "length"},
                      {"logprobs", nullptr}};
  if (r.logprobs >= 0) {
    nlohmann::json tokens = nlohmann::json::array(), top = nlohmann::json::array();
    for (int t : c.tokens) tokens.push_back(token_text(tok, t));
    for (const auto& alts : c.alternatives) {
      nlohmann::json t = nlohmann::json::object();
      for (const infer::TokenLogprob& a : alts) t[token_text(tok, a.token)] = a.logprob;
      top.push_back(t);
    }
    j["logprobs"] = {{"tokens", tokens}, {"token_logprobs", c.logprobs}, {"top_logprobs", top}};
  }
  return j;
}

std::string dump_json(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace meshtrain::cli
