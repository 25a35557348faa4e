// `meshtrain serve`: an OpenAI-compatible completions server over HTTP, on the project's
// own epoll server (net/http_server.h: slow or idle clients cost no thread, and every limit
// answers with a status). POST /v1/completions takes OpenAI's fields (cli/serve_request.h:
// an unknown one is a 400 naming it) and answers with OpenAI's shape, or with server-sent
// events when stream is true; GET /health gives the queue, GET /stats the batching loop's
// counters, GET /metrics Prometheus's text. A bad request gets a 400 and a JSON error naming
// the field, and the server goes on serving. Requests are batched continuously
// (cli/batch_loop.h): each one's text is what `generate` gives for the same prompt and
// seed, whatever else is decoded beside it, on one rank or a tp x pp model group (--tp,
// --pp; rank 0 serves). A client that hangs up leaves the batch at the next step. SIGINT or
// SIGTERM stops it after the requests in progress.
#include <malloc.h>
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

#include <nlohmann/json.hpp>

#include "cli/batch_loop.h"
#include "cli/commands.h"
#include "cli/launch.h"
#include "cli/serve_metrics.h"
#include "cli/serve_request.h"
#include "comm/mesh.h"
#include "cli/completion.h"
#include "cli/config_file.h"
#include "data/tokenizer.h"
#include "net/http_server.h"

namespace meshtrain::cli {

namespace {

using nlohmann::json;

struct ServeOptions {
  std::string model, tokenizer, host = "127.0.0.1";
  int port = 8000, threads = 0, max_batch = 8;
  int tp = 1, pp = 1;  // the model group's layout
  int cp = 1;          // refused unless 1 (decode_without_cp)
  int micro_batches = 1;  // with pp: groups of sequences that follow each other
  WeightPlacement weights;
  net::ServerLimits limits;
};

constexpr auto kPollClient = std::chrono::milliseconds(50);  // how often a waiting handler looks for a hang-up

// A request body at least this large is followed by malloc_trim: its pieces (the body, the
// parsed JSON, the prompt) go back to the system, not only to malloc's free lists.
constexpr size_t kTrimAfterBytes = 64 * 1024;

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
  // Waits for the completion; a client that hangs up meanwhile makes it leave the batch at
  // the next step (its answer is then not sent).
  void wait_done(const net::Exchange& client) {
    std::unique_lock<std::mutex> lock(mu);
    while (!ready.wait_for(lock, kPollClient, [&] { return done; }))
      if (!abandoned && client.client_gone()) abandoned = true;
  }
};

// A JSON error as OpenAI sends it; returns the status for the request's record.
int send_error(net::Exchange& ex, int status, const std::string& message) {
  ex.respond(status, "application/json", net::error_json(message));
  return status;
}

class Server {
 public:
  Server(const ServeOptions& o, const model::Gpt& gpt, const data::Tokenizer& tok, infer::DecodeGroups groups,
         comm::Group* world)
      : options_(o), gpt_(gpt), tok_(tok), loop_(gpt, tok, o.max_batch, o.threads, groups, world),
        http_(o.limits, [this](net::Exchange& ex) { handle(ex); }) {}

  Status listen() {
    RETURN_IF_ERROR(http_.listen(options_.host, options_.port));
    std::printf("serving %s on http://%s:%d (POST /v1/completions, GET /health, GET /stats, GET /metrics; up to %d "
                "sequences decoded together)\n",
                options_.model.c_str(), options_.host.c_str(), http_.port(), options_.max_batch);
    std::fflush(stdout);
    http_.run();
    return Status::ok();
  }
  void stop() { http_.stop(); }

 private:
  // Every request: routed, then counted with its status and latency.
  void handle(net::Exchange& ex) {
    const auto start = std::chrono::steady_clock::now();
    const net::HttpRequest& req = ex.request();
    const bool completion = req.path == "/v1/completions";
    const int status = route(ex);
    metrics_.request(status, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
                     completion);
    if (req.body.size() >= kTrimAfterBytes) malloc_trim(0);
  }

  int route(net::Exchange& ex) {
    const net::HttpRequest& req = ex.request();
    const bool get = req.method == "GET" || req.method == "HEAD";
    if (req.path == "/v1/completions") return req.method == "POST" ? complete(ex) : send_error(ex, 405, "use POST for /v1/completions");
    if (req.path == "/health" && get) return json_reply(ex, health());
    if (req.path == "/stats" && get) return json_reply(ex, loop_.stats());
    if (req.path == "/metrics" && get) {
      ex.respond(200, "text/plain; version=0.0.4", metrics_.prometheus(loop_.stats(), http_.stats()));
      return 200;
    }
    return send_error(ex, 404, "no such endpoint: " + req.method + " " + req.path);
  }

  int json_reply(net::Exchange& ex, const json& j) {
    ex.respond(200, "application/json", dump_json(j));
    return 200;
  }

  // The queue as a client or a load balancer wants it: the sequences decoding and waiting,
  // the requests waiting for a handler, the open connections.
  json health() {
    const json loop = loop_.stats();
    const net::ServerStats http = http_.stats();
    return {{"status", "ok"},         {"running", loop["running"]},     {"waiting", loop["waiting"]},
            {"queued", http.queued},  {"in_flight", http.in_flight},    {"connections", http.connections},
            {"max_batch", options_.max_batch}};
  }

  int complete(net::Exchange& ex) {
    json body = json::parse(ex.request().body, nullptr, /*allow_exceptions=*/false);
    if (body.is_discarded()) return send_error(ex, 400, "the request body is not valid JSON");
    std::vector<CompletionRequest> requests;
    bool stream = false;
    if (Status s = parse_completion_body(body, &requests, &stream); !s.is_ok()) return send_error(ex, 400, s.message());
    body = json();  // the prompts are in `requests` now
    std::vector<std::shared_ptr<Outbox>> boxes;
    for (size_t i = 0; i < requests.size(); i++) {
      boxes.push_back(std::make_shared<Outbox>());
      boxes[i]->request = requests[i];
      if (Status s = prepare_completion(gpt_, tok_, requests[i], &boxes[i]->completion); !s.is_ok())
        return send_error(ex, 400, requests.size() > 1 ? "prompt " + std::to_string(i) + ": " + s.message() : s.message());
    }
    const int64_t id = ++next_id_;
    const int64_t created = std::chrono::duration_cast<std::chrono::seconds>(
                                std::chrono::system_clock::now().time_since_epoch()).count();
    json head = {{"id", "cmpl-" + std::to_string(id)}, {"object", "text_completion"}, {"created", created},
                 {"model", options_.model}};
    if (stream) return complete_streamed(ex, boxes[0], head);
    // Every prompt joins the batch at once; the answer waits for the last.
    std::vector<CompletionBatch::Member> members;
    for (auto& box : boxes) members.push_back(box->member(box, false));
    loop_.submit(std::move(members));
    json choices = json::array();
    int64_t prompt_tokens = 0, completion_tokens = 0;
    bool gone = false;
    for (size_t i = 0; i < boxes.size(); i++) {
      if (gone) boxes[i]->abandoned = true;
      boxes[i]->wait_done(ex);
      gone = gone || boxes[i]->abandoned;
      const Completion& c = boxes[i]->completion;
      choices.push_back(completion_choice(tok_, (int)i, requests[i], c));
      prompt_tokens += (int64_t)c.prompt_tokens.size();
      completion_tokens += (int64_t)c.tokens.size();
    }
    metrics_.tokens(prompt_tokens, completion_tokens);
    if (gone) return 499;  // nobody to answer
    head["choices"] = choices;
    head["usage"] = {{"prompt_tokens", prompt_tokens}, {"completion_tokens", completion_tokens},
                     {"total_tokens", prompt_tokens + completion_tokens}};
    ex.respond(200, "application/json", dump_json(head));
    return 200;
  }

  // Server-sent events: one chunk per piece of text as it is sampled, the last with the
  // finish reason, then [DONE]. A client that goes away leaves the batch at its next step.
  int complete_streamed(net::Exchange& ex, std::shared_ptr<Outbox> box, const json& head) {
    auto event = [&](const json& choice) {
      json chunk = head;
      chunk["choices"] = json::array({choice});
      return ex.write("data: " + dump_json(chunk) + "\n\n");
    };
    const bool open = ex.begin_stream(200, "text/event-stream");
    loop_.submit({box->member(box, true)});
    if (!open) box->abandoned = true;
    for (;;) {
      std::unique_lock<std::mutex> lock(box->mu);
      if (!box->ready.wait_for(lock, kPollClient, [&] { return box->done || !box->pieces.empty(); })) {
        if (!box->abandoned && ex.client_gone()) box->abandoned = true;
        continue;
      }
      if (box->pieces.empty()) break;  // done, and everything sent
      const std::string piece = std::move(box->pieces.front());
      box->pieces.pop_front();
      lock.unlock();
      if (!box->abandoned && !event({{"index", 0}, {"text", piece}, {"logprobs", nullptr}, {"finish_reason", nullptr}}))
        box->abandoned = true;
    }
    const Completion& c = box->completion;
    metrics_.tokens((int64_t)c.prompt_tokens.size(), (int64_t)c.tokens.size());
    if (box->abandoned) return 499;
    event({{"index", 0}, {"text", ""}, {"logprobs", nullptr}, {"finish_reason", c.stopped ? "stop" : "length"}});
    ex.write("data: [DONE]\n\n");
    ex.end_stream();
    return 200;
  }

  ServeOptions options_;
  const model::Gpt& gpt_;
  const data::Tokenizer& tok_;
  ServeMetrics metrics_;
  BatchLoop loop_;  // outlives the HTTP server's handlers: they wait on it
  net::HttpServer http_;
  std::atomic<int64_t> next_id_{0};
};

// The HTTP server's limits (docs/serving.md: what a client sees at each).
void add_limit_flags(CLI::App* cmd, net::ServerLimits* l) {
  cmd->add_option("--max-request-bytes", l->parse.max_body_bytes, "Largest request body; a larger one gets 413")
      ->capture_default_str();
  cmd->add_option("--max-header-bytes", l->parse.max_header_bytes,
                  "Largest request line and headers together; larger get 431")
      ->capture_default_str();
  cmd->add_option("--max-connections", l->max_connections,
                  "Connections open at once; more get 503 with Retry-After and are closed")
      ->capture_default_str();
  cmd->add_option("--max-in-flight", l->max_in_flight,
                  "Requests handled at once (handler threads); more wait in arrival order, costing no thread")
      ->capture_default_str();
  cmd->add_option("--header-timeout", l->header_timeout_s,
                  "Seconds for a request's whole line and headers (not per read); later: 408, closed")
      ->capture_default_str();
  cmd->add_option("--body-timeout", l->body_timeout_s, "Seconds for a request's whole body after its headers; later: 408")
      ->capture_default_str();
  cmd->add_option("--idle-timeout", l->idle_timeout_s, "Seconds a kept-alive connection may wait for its next request")
      ->capture_default_str();
}

Status check_limits(const net::ServerLimits& l) {
  if (l.parse.max_body_bytes < 1) return Status::error("--max-request-bytes must be >= 1");
  if (l.parse.max_header_bytes < 64) return Status::error("--max-header-bytes must be >= 64");
  if (l.max_connections < 1 || l.max_in_flight < 1) return Status::error("--max-connections and --max-in-flight must be >= 1");
  // (A day at most: the deadlines are clock times, and infinity has none.)
  for (const auto& [flag, seconds] : {std::pair{"--header-timeout", l.header_timeout_s},
                                      {"--body-timeout", l.body_timeout_s}, {"--idle-timeout", l.idle_timeout_s}})
    if (!(seconds > 0 && seconds <= 86400))
      return Status::error(std::string(flag) + " must be in (0, 86400] seconds, got " + std::to_string(seconds));
  return Status::ok();
}

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
  RETURN_IF_ERROR(check_limits(o.limits));
  comm::MeshShape shape;
  RETURN_IF_ERROR(comm::resolve_mesh(world.size(), o.tp, o.pp, 1, &shape));
  if (o.threads > 0) omp_set_num_threads(o.threads);
  std::unique_ptr<data::Tokenizer> tokenizer;
  comm::Mesh mesh(world, shape);
  const infer::DecodeGroups groups{o.tp > 1 ? &mesh.tp() : nullptr, o.pp > 1 ? &mesh.pp() : nullptr, o.micro_batches};
  LoadedModel loaded;
  RETURN_IF_ERROR(load_for_completion(o.model, o.tokenizer, o.weights, groups, &loaded, &tokenizer));
  const data::Tokenizer& tok = *tokenizer;
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
  auto* cmd = app.add_subcommand("serve", "An OpenAI-compatible completions server (POST /v1/completions, GET /health, /stats, /metrics)");
  add_config_option(cmd);
  cmd->add_option("--checkpoint", o->model, "Run folder, checkpoint folder, .safetensors or llm.c .bin")->required();
  cmd->add_option("--port", o->port, "TCP port (0: any free port; the startup line names it)")->capture_default_str();
  cmd->add_option("--host", o->host, "Address to listen on")->capture_default_str();
  cmd->add_option("--tokenizer", o->tokenizer,
                  "Tokenizer folder or file: tokenizer.json, tokenizer.model (SentencePiece), *.tiktoken, "
                  "encoder.json + vocab.bpe (default: the model's own, as for generate)");
  cmd->add_option("--threads", o->threads, "OpenMP threads (0 = all cores)");
  cmd->add_option("--max-batch", o->max_batch,
                  "Sequences decoded together (continuous batching; 1: one at a time). Texts do not depend on it")
      ->capture_default_str();
  add_limit_flags(cmd, &o->limits);
  add_weight_flags(cmd, &o->weights);
  cmd->add_option("--tp", o->tp, "Tensor-parallel ranks (split by key/value heads; same text)")->capture_default_str();
  cmd->add_option("--pp", o->pp, "Pipeline stages (split by layers; same text)")->capture_default_str();
  cmd->add_option("--cp", o->cp, "Context parallelism: training only (decoding refuses --cp > 1)")->capture_default_str();
  cmd->add_option("--micro-batches", o->micro_batches,
                  "With --pp: a step's sequences go through the stages in this many groups (1 measured fastest "
                  "on 2 cores)")
      ->capture_default_str();
  return {cmd, [o] {
            if (o->tp < 1 || o->pp < 1) return fail(Status::error("--tp and --pp must be >= 1"));
            if (Status s = decode_without_cp("serve", o->cp); !s.is_ok()) return fail(s);
            if (o->micro_batches < 1) return fail(Status::error("--micro-batches must be >= 1"));
            return run_on_ranks(o->tp * o->pp, o->threads, [o](comm::Group& world) { return serve(*o, world); });
          }};
}

}  // namespace meshtrain::cli
