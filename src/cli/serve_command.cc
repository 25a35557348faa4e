// `meshtrain serve`: an OpenAI-compatible completions server over HTTP (cpp-httplib, from
// Debian's libcpp-httplib-dev). POST /v1/completions takes OpenAI's fields (prompt or a list
// of prompts, max_tokens, temperature, top_p, top_k, seed, stop, logprobs, stream) and
// answers with OpenAI's shape, or with server-sent events when stream is true; GET /health
// answers {"status": "ok"}, GET /stats the batching loop's counters. A bad request gets a 400 and a JSON error naming the field, and
// the server goes on serving. Requests are batched continuously (cli/batch_loop.h): each
// one's text is what `generate` gives for the same prompt and seed, whatever else is decoded
// beside it, on one rank or a tp x pp model group (--tp, --pp; rank 0 serves). SIGINT or
// SIGTERM stops it after the requests in progress.
#include <omp.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <thread>
#include <type_traits>

#include <httplib.h>

#include <nlohmann/json.hpp>

#include "cli/batch_loop.h"
#include "cli/commands.h"
#include "cli/launch.h"
#include "comm/mesh.h"
#include "cli/completion.h"
#include "cli/config_file.h"
#include "data/bpe.h"

namespace meshtrain::cli {

namespace {

using nlohmann::json;

struct ServeOptions {
  std::string model, tokenizer, host = "127.0.0.1";
  int port = 8000, threads = 0, max_batch = 8;
  int tp = 1, pp = 1;  // the model group's layout
  int micro_batches = 1;  // with pp: groups of sequences that follow each other
  WeightPlacement weights;
};

// Field `key` of `body`, a string or a list of strings, appended to `out`.
Status strings_of(const json& body, const char* key, std::vector<std::string>* out) {
  const json& v = body[key];
  const Status wrong = Status::error(std::string("'") + key + "' must be a string or a list of strings");
  if (v.is_string()) {
    out->push_back(v.get<std::string>());
    return Status::ok();
  }
  if (!v.is_array()) return wrong;
  for (const json& x : v) {
    if (!x.is_string()) return wrong;
    out->push_back(x.get<std::string>());
  }
  return Status::ok();
}

// A request's fields, checked by type and range, into completion requests (one per prompt).
Status parse_request(const json& body, std::vector<CompletionRequest>* out, bool* stream) {
  if (!body.is_object()) return Status::error("the request body must be a JSON object");
  std::vector<std::string> prompts;
  if (!body.contains("prompt")) return Status::error("'prompt' is required");
  RETURN_IF_ERROR(strings_of(body, "prompt", &prompts));
  if (prompts.empty()) return Status::error("'prompt' must be a string or a non-empty list of strings");
  CompletionRequest r;
  auto integer = [&](const char* key, int64_t lo, int64_t hi, auto* v) -> Status {
    if (!body.contains(key) || body[key].is_null()) return Status::ok();
    if (!body[key].is_number_integer())
      return Status::error(std::string("'") + key + "' must be an integer, got " + body[key].dump());
    const int64_t x = body[key].get<int64_t>();
    if (x < lo || x > hi)
      return Status::error(std::string("'") + key + "' must be in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                           "], got " + std::to_string(x));
    *v = static_cast<std::remove_reference_t<decltype(*v)>>(x);
    return Status::ok();
  };
  auto number = [&](const char* key, float* v) -> Status {
    if (!body.contains(key) || body[key].is_null()) return Status::ok();
    if (!body[key].is_number()) return Status::error(std::string("'") + key + "' must be a number, got " + body[key].dump());
    *v = body[key].get<float>();
    return Status::ok();
  };
  RETURN_IF_ERROR(integer("max_tokens", 0, 1 << 20, &r.max_tokens));
  RETURN_IF_ERROR(integer("top_k", 0, 1 << 30, &r.sampling.top_k));
  RETURN_IF_ERROR(integer("seed", 0, INT64_MAX, &r.seed));
  RETURN_IF_ERROR(integer("logprobs", 0, 20, &r.logprobs));
  RETURN_IF_ERROR(number("temperature", &r.sampling.temperature));
  RETURN_IF_ERROR(number("top_p", &r.sampling.top_p));
  if (body.contains("n") && body["n"] != 1) return Status::error("'n' other than 1 is not supported");
  if (body.contains("stop") && !body["stop"].is_null()) RETURN_IF_ERROR(strings_of(body, "stop", &r.stop));
  *stream = false;
  if (body.contains("stream") && !body["stream"].is_null()) {
    if (!body["stream"].is_boolean()) return Status::error("'stream' must be true or false");
    *stream = body["stream"].get<bool>();
  }
  if (*stream && prompts.size() > 1) return Status::error("'stream' takes a single prompt");
  for (const std::string& text : prompts) {
    out->push_back(r);
    out->back().prompt = text;
  }
  return Status::ok();
}

void send_error(httplib::Response& res, int status, const std::string& message) {
  res.status = status;
  res.set_content(dump_json({{"error", {{"message", message}, {"type", "invalid_request_error"}}}}), "application/json");
}

// What one completion sends back to its handler thread: pieces of text, then done.
struct Outbox {
  std::mutex mu;
  std::condition_variable ready;
  std::deque<std::string> pieces;
  bool done = false;
  std::atomic<bool> abandoned{false};  // the client went away
  CompletionRequest request;
  Completion completion;

  CompletionBatch::Member member(std::shared_ptr<Outbox> self, bool stream) {
    CompletionBatch::Member m{request, &completion, nullptr, nullptr, nullptr};
    if (stream)
      m.on_text = [self](const std::string& piece) {
        std::lock_guard<std::mutex> lock(self->mu);
        self->pieces.push_back(piece);
        self->ready.notify_one();
      };
    m.on_done = [self] {
      std::lock_guard<std::mutex> lock(self->mu);
      self->done = true;
      self->ready.notify_one();
    };
    m.abandoned = [self] { return self->abandoned.load(); };
    return m;
  }
  void wait_done() {
    std::unique_lock<std::mutex> lock(mu);
    ready.wait(lock, [&] { return done; });
  }
};

class Server {
 public:
  Server(const ServeOptions& o, const model::Gpt& gpt, const data::Gpt2Tokenizer& tok, infer::DecodeGroups groups,
         comm::Group* world)
      : options_(o), gpt_(gpt), tok_(tok), loop_(gpt, tok, o.max_batch, o.threads, groups, world) {
    http_.Get("/health", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(R"({"status":"ok"})", "application/json");
    });
    http_.Get("/stats", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(dump_json(loop_.stats()), "application/json");
    });
    http_.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) { complete(req, res); });
    http_.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
      if (res.status == 404) send_error(res, 404, "no such endpoint: " + req.method + " " + req.path);
    });
  }

  Status listen() {
    const int port = options_.port == 0 ? http_.bind_to_any_port(options_.host) : options_.port;
    if (options_.port != 0 && !http_.bind_to_port(options_.host, port))
      return Status::error("cannot listen on " + options_.host + ":" + std::to_string(port) + " (in use?)");
    if (port < 0) return Status::error("cannot listen on " + options_.host);
    std::printf("serving %s on http://%s:%d (POST /v1/completions, GET /health, GET /stats; up to %d sequences decoded together)\n",
                options_.model.c_str(), options_.host.c_str(), port, options_.max_batch);
    std::fflush(stdout);
    if (!http_.listen_after_bind()) return Status::error("the server stopped with an error");
    return Status::ok();
  }
  void stop() { http_.stop(); }

 private:
  void complete(const httplib::Request& req, httplib::Response& res) {
    json body = json::parse(req.body, nullptr, /*allow_exceptions=*/false);
    if (body.is_discarded()) return send_error(res, 400, "the request body is not valid JSON");
    std::vector<CompletionRequest> requests;
    bool stream = false;
    if (Status s = parse_request(body, &requests, &stream); !s.is_ok()) return send_error(res, 400, s.message());
    std::vector<std::shared_ptr<Outbox>> boxes;
    for (size_t i = 0; i < requests.size(); i++) {
      boxes.push_back(std::make_shared<Outbox>());
      boxes[i]->request = requests[i];
      if (Status s = prepare_completion(gpt_, tok_, requests[i], &boxes[i]->completion); !s.is_ok())
        return send_error(res, 400, requests.size() > 1 ? "prompt " + std::to_string(i) + ": " + s.message() : s.message());
    }
    const int64_t id = ++next_id_;
    const int64_t created = std::chrono::duration_cast<std::chrono::seconds>(
                                std::chrono::system_clock::now().time_since_epoch()).count();
    json head = {{"id", "cmpl-" + std::to_string(id)}, {"object", "text_completion"}, {"created", created},
                 {"model", options_.model}};
    if (stream) return complete_streamed(boxes[0], head, res);
    // Every prompt joins the batch at once; the answer waits for the last.
    std::vector<CompletionBatch::Member> members;
    for (auto& box : boxes) members.push_back(box->member(box, false));
    loop_.submit(std::move(members));
    json choices = json::array();
    int64_t prompt_tokens = 0, completion_tokens = 0;
    for (size_t i = 0; i < boxes.size(); i++) {
      boxes[i]->wait_done();
      const Completion& c = boxes[i]->completion;
      choices.push_back(completion_choice(tok_, (int)i, requests[i], c));
      prompt_tokens += (int64_t)c.prompt_tokens.size();
      completion_tokens += (int64_t)c.tokens.size();
    }
    head["choices"] = choices;
    head["usage"] = {{"prompt_tokens", prompt_tokens}, {"completion_tokens", completion_tokens},
                     {"total_tokens", prompt_tokens + completion_tokens}};
    res.set_content(dump_json(head), "application/json");
  }

  // Server-sent events: one chunk per piece of text as it is sampled, the last with the
  // finish reason, then [DONE]. A client that goes away leaves the batch at its next step.
  void complete_streamed(std::shared_ptr<Outbox> box, const json& head, httplib::Response& res) {
    res.set_chunked_content_provider("text/event-stream", [this, box, head](size_t, httplib::DataSink& sink) {
      auto event = [&](const json& choice) {
        json chunk = head;
        chunk["choices"] = json::array({choice});
        const std::string text = "data: " + dump_json(chunk) + "\n\n";
        return sink.write(text.data(), text.size());
      };
      loop_.submit({box->member(box, true)});
      for (;;) {
        std::unique_lock<std::mutex> lock(box->mu);
        box->ready.wait(lock, [&] { return box->done || !box->pieces.empty(); });
        if (box->pieces.empty()) break;  // done, and everything sent
        const std::string piece = std::move(box->pieces.front());
        box->pieces.pop_front();
        lock.unlock();
        if (!event({{"index", 0}, {"text", piece}, {"logprobs", nullptr}, {"finish_reason", nullptr}})) {
          box->abandoned = true;
          return false;
        }
      }
      event({{"index", 0}, {"text", ""}, {"logprobs", nullptr},
             {"finish_reason", box->completion.stopped ? "stop" : "length"}});
      const std::string done = "data: [DONE]\n\n";
      sink.write(done.data(), done.size());
      sink.done();
      return true;
    });
  }

  ServeOptions options_;
  const model::Gpt& gpt_;
  const data::Gpt2Tokenizer& tok_;
  BatchLoop loop_;  // outlives the HTTP server's handlers: they wait on it
  httplib::Server http_;
  std::atomic<int64_t> next_id_{0};
};

// SIGINT and SIGTERM write a byte to a pipe, whichever thread they land on (OpenMP's
// workers included), and one thread reading it stops the server: nothing runs inside the
// handler but a write.
int stop_pipe[2] = {-1, -1};
extern "C" void on_stop_signal(int) {
  const char stop = 1;
  (void)!::write(stop_pipe[1], &stop, 1);
}

// On every rank of the job. Rank 0 serves HTTP and runs the batching loop; the other ranks
// of a tp x pp model group follow its plans.
Status serve(const ServeOptions& o, comm::Group& world) {
  if (o.port < 0 || o.port > 65535) return Status::error("--port must be 0-65535 (0: any free port)");
  if (o.max_batch < 1) return Status::error("--max-batch must be >= 1 (sequences decoded together)");
  comm::MeshShape shape;
  RETURN_IF_ERROR(comm::resolve_mesh(world.size(), o.tp, o.pp, 1, &shape));
  if (o.threads > 0) omp_set_num_threads(o.threads);
  data::Gpt2Tokenizer tok;
  comm::Mesh mesh(world, shape);
  const infer::DecodeGroups groups{o.tp > 1 ? &mesh.tp() : nullptr, o.pp > 1 ? &mesh.pp() : nullptr, o.micro_batches};
  LoadedModel loaded;
  RETURN_IF_ERROR(load_for_completion(o.model, o.tokenizer, o.weights, groups, &loaded, &tok));
  const std::unique_ptr<model::Gpt>& gpt = loaded.gpt;
  // After the last step, on every rank (collective): the memory line.
  const bool report = loaded.streamed || o.weights.budget_gb > 0;
  auto report_memory = [&] {
    const std::string line = memory_report(o.weights, loaded, &world);
    if (world.rank() == 0) std::fprintf(stderr, "%s\n", line.c_str());
  };
  if (::pipe(stop_pipe) != 0) return Status::error("serve: cannot make a pipe for the stop signals");
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  action.sa_flags = SA_RESTART;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  if (world.rank() != 0) {  // a signal here only fills the pipe: rank 0's stop plan ends it
    follow_batch_loop(*gpt, tok, groups, world);
    if (report) report_memory();
    return Status::ok();
  }
  Status s = Status::ok();
  {  // the server's batching loop ends with it, and the followers with their stop plan
    Server server(o, *gpt, tok, groups, world.size() > 1 ? &world : nullptr);
    std::thread stopper([&] {
      char why = 0;
      while (::read(stop_pipe[0], &why, 1) < 0 && errno == EINTR) {}
      if (why == 1) server.stop();
    });
    s = server.listen();
    const char ended = 0;  // the server may have stopped by itself: end the reader
    (void)!::write(stop_pipe[1], &ended, 1);
    stopper.join();
  }
  ::close(stop_pipe[0]);
  ::close(stop_pipe[1]);
  if (report) report_memory();
  if (s.is_ok()) std::printf("stopped\n"), std::fflush(stdout);
  return s;
}

}  // namespace

Command add_serve_command(CLI::App& app) {
  auto o = std::make_shared<ServeOptions>();
  auto* cmd = app.add_subcommand("serve", "An OpenAI-compatible completions server (POST /v1/completions, GET /health)");
  add_config_option(cmd);
  cmd->add_option("--checkpoint", o->model, "Run folder, checkpoint folder, .safetensors or llm.c .bin")->required();
  cmd->add_option("--port", o->port, "TCP port (0: any free port; the startup line names it)")->capture_default_str();
  cmd->add_option("--host", o->host, "Address to listen on")->capture_default_str();
  cmd->add_option("--tokenizer", o->tokenizer, "Folder with encoder.json and vocab.bpe (default: the run's)");
  cmd->add_option("--threads", o->threads, "OpenMP threads (0 = all cores)");
  cmd->add_option("--max-batch", o->max_batch,
                  "Sequences decoded together (continuous batching; 1: one at a time). Texts do not depend on it")
      ->capture_default_str();
  add_weight_flags(cmd, &o->weights);
  cmd->add_option("--tp", o->tp, "Tensor-parallel ranks (split by key/value heads; same text)")->capture_default_str();
  cmd->add_option("--pp", o->pp, "Pipeline stages (split by layers; same text)")->capture_default_str();
  cmd->add_option("--micro-batches", o->micro_batches,
                  "With --pp: a step's sequences go through the stages in this many groups (1 measured fastest "
                  "on 2 cores)")
      ->capture_default_str();
  return {cmd, [o] {
            if (o->tp < 1 || o->pp < 1) return fail(Status::error("--tp and --pp must be >= 1"));
            if (o->micro_batches < 1) return fail(Status::error("--micro-batches must be >= 1"));
            return run_on_ranks(o->tp * o->pp, o->threads, [o](comm::Group& world) { return serve(*o, world); });
          }};
}

}  // namespace meshtrain::cli
