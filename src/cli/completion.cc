#include "cli/completion.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <random>
#include <span>

#include "checkpoint/model_file.h"
#include "cli/commands.h"

namespace meshtrain::cli {

void add_weight_flags(CLI::App* cmd, WeightPlacement* w) {
  cmd->add_option("--offload", w->offload,
                  "weights=nvme: stream the layers' weights from a file as they are reached (ZeRO-Inference)");
  cmd->add_option("--offload-dir", w->dir, "Folder for the streamed weights' file (default: the temporary folder)");
  cmd->add_option("--offload-read-ahead", w->read_ahead, "Layers read ahead of the one computing (0: none)")
      ->capture_default_str();
  cmd->add_option("--memory-budget", w->budget_gb,
                  "GB for this process's buffers: weights over it are streamed from a file (0: no limit)");
}

namespace {

constexpr double kMB = 1e6, kGB = 1e9;  // as train's --memory-budget counts

// The placement's flags against the model (`held`: the parameters this rank holds, the
// whole model on one rank): whether it streams, and whether it fits.
Status place_weights(const model::ParamLayout& layout, int64_t held, int ranks, WeightPlacement* w) {
  if (!w->offload.empty() && w->offload != "weights=nvme")
    return Status::error("--offload takes weights=nvme for generation (the layers stream from a file), got '" +
                         w->offload + "'");
  if (w->read_ahead < 0) return Status::error("--offload-read-ahead must be >= 0 layers");
  if (w->budget_gb < 0) return Status::error("--memory-budget must be >= 0 GB (0: no limit)");
  w->stream = !w->offload.empty();
  const double budget = w->budget_gb * kGB, weights = (double)held * sizeof(float);
  if (budget <= 0) return Status::ok();
  if (ranks > 1 && weights > budget) {
    char why[300];
    std::snprintf(why, sizeof why,
                  "a rank's share of the weights (%.1f MB of %.1f MB) exceeds --memory-budget %.4g GB, and streamed "
                  "weights run on one rank: use more --tp or --pp ranks",
                  weights / kMB, (double)layout.total() * sizeof(float) / kMB, w->budget_gb);
    return Status::error(why);
  }
  if (!w->stream && weights > budget) {
    std::fprintf(stderr, "meshtrain: the weights (%.1f MB) exceed --memory-budget %.3g GB: streaming them from a file\n",
                 weights / kMB, w->budget_gb);
    w->stream = true;
  }
  if (!w->stream) return Status::ok();
  // What streaming holds: the resident units, the layer buffers, and while loading the
  // checkpoint reader's piece (4 MiB). The KV caches and activations come on top (reported).
  const double resident = (double)infer::StreamedWeights::resident_bytes(layout),
               buffers = (double)infer::StreamedWeights::buffer_bytes(layout, w->read_ahead), loading = 4 * kMB;
  if (resident + buffers + loading <= budget) return Status::ok();
  char why[400];
  std::snprintf(why, sizeof why,
                "--memory-budget %.4g GB (%.1f MB) is less than streaming the weights needs: %.1f MB for the embedding "
                "and final norm, which stay in memory, %.1f MB for %d layer buffers (--offload-read-ahead %d) and "
                "%.1f MB to load them",
                w->budget_gb, budget / kMB, resident / kMB, buffers / kMB, w->read_ahead + 1, w->read_ahead, loading / kMB);
  return Status::error(why);
}

// Whether the model can be decoded on tp x pp ranks.
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

}  // namespace

// This rank's share of the weights at `path`, into out->shard: a checkpoint streamed in
// pieces, or a single weights file read whole and then cut.
Status load_shard(const std::string& path, std::vector<infer::FlatRange> rows, std::unique_ptr<model::Gpt> gpt,
                  LoadedModel* out) {
  out->shard = std::make_unique<infer::ShardWeights>(gpt->layout(), std::move(rows));
  infer::ShardWeights& shard = *out->shard;
  std::string resolved;
  RETURN_IF_ERROR(checkpoint::resolve_model_path(path, &resolved));
  if (std::filesystem::is_directory(resolved)) {  // a checkpoint: the rank's rows of each piece
    RETURN_IF_ERROR(checkpoint::stream_model_weights(
        path, gpt->config(), [&](size_t at, size_t n, const float* values) { return shard.write(at, n, values); }));
  } else {
    std::unique_ptr<model::Gpt> whole;
    RETURN_IF_ERROR(checkpoint::open_model_file(path, 0, &whole, model::Gpt::LocalState::kParamsOnly));
    RETURN_IF_ERROR(shard.write(0, whole->layout().total(), whole->params()));
  }
  gpt->set_param_store(&shard);
  out->gpt = std::move(gpt);
  return Status::ok();
}

Status load_for_completion(const std::string& model_path, const std::string& tokenizer_flag,
                           const WeightPlacement& placement, const infer::DecodeGroups& at, LoadedModel* out,
                           std::unique_ptr<data::Tokenizer>* tok) {
  const int tp = at.tp_size(), pp = at.stages();
  RETURN_IF_ERROR(load_model_tokenizer(model_path, tokenizer_flag, tok));
  model::GptConfig config;
  RETURN_IF_ERROR(checkpoint::model_file_config(model_path, 0, &config));
  RETURN_IF_ERROR(check_tokenizer_fits_model(**tok, config.vocab).with_context(model_path));
  // The layout first, with no buffer: where the weights go depends on their size.
  auto gpt = std::make_unique<model::Gpt>(config, model::Gpt::LocalState::kNone);
  RETURN_IF_ERROR(check_decode_layout(config, tp, pp));
  if (!placement.offload.empty() && tp * pp > 1)
    return Status::error("streamed weights (--offload weights=nvme) run on one rank: drop --tp and --pp (each of "
                         "their ranks holds only its share of the weights)");
  std::vector<infer::FlatRange> rows;
  int64_t held = (int64_t)gpt->layout().total();
  if (tp * pp > 1) {
    rows = infer::weights_read(*gpt, at);
    held = 0;
    for (const infer::FlatRange& r : rows) held += (int64_t)r.count;
  }
  WeightPlacement w = placement;
  RETURN_IF_ERROR(place_weights(gpt->layout(), held, tp * pp, &w));
  if (tp * pp > 1) return load_shard(model_path, std::move(rows), std::move(gpt), out);
  if (!w.stream) {
    out->gpt.reset();
    return checkpoint::open_model_file(model_path, 0, &out->gpt, model::Gpt::LocalState::kParamsOnly);
  }
  std::error_code ec;
  const std::string dir = w.dir.empty() ? std::filesystem::temp_directory_path(ec).string() : w.dir;
  RETURN_IF_ERROR(infer::StreamedWeights::create(gpt->layout(), dir, w.read_ahead, &out->streamed));
  infer::StreamedWeights& streamed = *out->streamed;
  RETURN_IF_ERROR(checkpoint::stream_model_weights(
      model_path, config, [&](size_t at, size_t n, const float* values) { return streamed.write(at, n, values); }));
  RETURN_IF_ERROR(streamed.finish_writes());
  gpt->set_param_store(&streamed);
  out->gpt = std::move(gpt);
  return Status::ok();
}

std::string memory_report(const WeightPlacement& w, const LoadedModel& model, comm::Group* group) {
  const MemStats m = MemoryTracker::instance().stats();
  double peaks[2] = {(double)m.total_peak, (double)peak_rss_bytes()};
  const bool ranks = group && group->size() > 1;
  if (ranks) group->all_reduce_f64(peaks, 2, comm::ReduceOp::kMax);
  char line[512];
  char budget[64] = "";
  if (w.budget_gb > 0) std::snprintf(budget, sizeof budget, " (--memory-budget %.1f MB)", w.budget_gb * kGB / kMB);
  std::snprintf(line, sizeof line, "memory: peak %.1f MB tracked%s, peak resident set %.1f MB%s", peaks[0] / kMB,
                budget, peaks[1] / kMB, ranks ? " (the largest of the ranks)" : "");
  std::string out = line;
  if (model.shard) {
    double held = (double)model.shard->held();
    if (ranks) group->all_reduce_f64(&held, 1, comm::ReduceOp::kMax);
    std::snprintf(line, sizeof line, "; weights held: %.1f MB on the fullest rank, of %.1f MB", held * 4 / kMB,
                  (double)model.shard->whole() * 4 / kMB);
    out += line;
  }
  if (model.streamed) {
    const infer::StreamedWeights::Stats s = model.streamed->stats();
    std::snprintf(line, sizeof line,
                  "; streamed weights: %lld layers read, %.1f MB in %.3f s, %.3f s waited (read-ahead %d, %s)",
                  (long long)s.layers_read, s.bytes_read / kMB, s.read_s, s.wait_s, model.streamed->read_ahead(),
                  model.streamed->direct_io() ? "O_DIRECT" : "page cache: no O_DIRECT here");
    out += line;
  }
  return out;
}

int document_start_token(const data::Tokenizer& tok) {
  const data::TokenizerInfo& info = tok.info();
  return info.bos_id >= 0 && info.bos_id != info.eos_id ? info.bos_id : tok.document_separator();
}

Status prepare_completion(const model::Gpt& gpt, const data::Tokenizer& tok, const CompletionRequest& r,
                          Completion* c) {
  if (r.max_tokens < 0) return Status::error("max_tokens must be >= 0");
  if (!(r.sampling.temperature >= 0)) return Status::error("temperature must be >= 0 (0 = greedy)");
  if (r.sampling.top_k < 0) return Status::error("top_k must be >= 0 (0 = no limit)");
  if (!(r.sampling.top_p > 0 && r.sampling.top_p <= 1)) return Status::error("top_p must be in (0, 1] (1 = no cut)");
  if (r.logprobs > 20) return Status::error("logprobs must be 0-20, got " + std::to_string(r.logprobs));
  if (r.prompt.empty()) return Status::error("the prompt is empty");
  const int context = gpt.config().max_seq_len;
  // The bound holds where every byte of the text is encoded; SentencePiece's normalizer may
  // drop some (runs of spaces), so its prompts are counted by encoding them.
  const int longest = tok.info().longest_token_bytes;
  const int64_t fewest_tokens = ((int64_t)r.prompt.size() + longest - 1) / longest;
  if (!r.document_start && tok.info().format != "sentencepiece" &&
      fewest_tokens + std::max(0, r.max_tokens - 1) > context)
    return Status::error("the prompt (" + std::to_string(r.prompt.size()) + " bytes, so at least " +
                         std::to_string(fewest_tokens) + " tokens) plus max_tokens " + std::to_string(r.max_tokens) +
                         " exceeds the model's context of " + std::to_string(context) + " tokens");
  if (r.document_start) {
    const int start = document_start_token(tok);
    if (start < 0) return Status::error("the tokenizer has no BOS or end-of-text token to start a document: give a prompt");
    c->prompt_tokens = {start};
  } else {
    c->prompt_tokens = tok.encode_with_special(r.prompt);
  }
  if (c->prompt_tokens.empty()) return Status::error("the prompt encodes to no tokens");
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
  bool eos = false;  // the last sampled token is the tokenizer's EOS
  State(Member member, int seq)
      : m(std::move(member)), id(seq), stops(m.request.stop), rng(m.request.seed) {}
  void show(const std::string& piece) {
    m.completion->text += piece;
    if (m.on_text && !piece.empty()) m.on_text(piece);
  }
};

CompletionBatch::CompletionBatch(const model::Gpt& gpt, const data::Tokenizer& tok, infer::DecodeGroups groups)
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
  s.m.completion->stopped = s.stops.stopped() || s.eos;
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
    // The end of the text: not shown, and the completion stopped (as at a stop string).
    s->eos = s->next == tok_.info().eos_id;
    if (!s->eos) s->show(s->stops.feed(std::string(tok_.token_bytes(s->next))));
    if ((int)c->tokens.size() < r.max_tokens && !s->stops.stopped() && !s->eos) return false;
    finish(*s);
    return true;
  });
}

void run_completion(const model::Gpt& gpt, const data::Tokenizer& tok, const CompletionRequest& r,
                    const std::function<void(const std::string&)>& on_text, Completion* c,
                    infer::DecodeGroups groups) {
  CompletionBatch batch(gpt, tok, groups);
  batch.join({r, c, on_text, nullptr, nullptr});
  while (batch.size() > 0) batch.step();
}

std::string token_text(const data::Tokenizer& tok, int token) { return std::string(tok.token_bytes(token)); }

nlohmann::json completion_choice(const data::Tokenizer& tok, int index, const CompletionRequest& r,
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
