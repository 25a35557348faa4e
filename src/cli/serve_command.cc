// `meshtrain serve`: an OpenAI-compatible completions server over HTTP (cpp-httplib, from
// Debian's libcpp-httplib-dev). POST /v1/completions takes OpenAI's fields (prompt or a list
// of prompts, max_tokens, temperature, top_p, top_k, seed, stop, logprobs, stream) and
// answers with OpenAI's shape, or with server-sent events when stream is true; GET /health
// answers {"status": "ok"}. A bad request gets a 400 and a JSON error naming the field, and
// the server goes on serving. Requests run one at a time on the one model (a mutex): each
// one's text is what `generate` gives for the same prompt and seed. SIGINT or SIGTERM stops
// it after the requests in progress.
#include <omp.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <thread>
#include <type_traits>

#include <httplib.h>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/completion.h"
#include "cli/config_file.h"
#include "data/bpe.h"

namespace meshtrain::cli {

namespace {

using nlohmann::json;

struct ServeOptions {
  std::string model, tokenizer, host = "127.0.0.1";
  int port = 8000, threads = 0;
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

class Server {
 public:
  Server(const ServeOptions& o, std::unique_ptr<model::Gpt> gpt, data::Gpt2Tokenizer tok)
      : options_(o), gpt_(std::move(gpt)), tok_(std::move(tok)) {
    http_.Get("/health", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(R"({"status":"ok"})", "application/json");
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
    std::printf("serving %s on http://%s:%d (POST /v1/completions, GET /health)\n", options_.model.c_str(),
                options_.host.c_str(), port);
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
    std::vector<Completion> done(requests.size());
    for (size_t i = 0; i < requests.size(); i++)
      if (Status s = prepare_completion(*gpt_, tok_, requests[i], &done[i]); !s.is_ok())
        return send_error(res, 400, requests.size() > 1 ? "prompt " + std::to_string(i) + ": " + s.message() : s.message());
    const int64_t id = ++next_id_;
    const int64_t created = std::chrono::duration_cast<std::chrono::seconds>(
                                std::chrono::system_clock::now().time_since_epoch()).count();
    json head = {{"id", "cmpl-" + std::to_string(id)}, {"object", "text_completion"}, {"created", created},
                 {"model", options_.model}};
    if (stream) return complete_streamed(requests[0], std::move(done[0]), head, res);
    json choices = json::array();
    int64_t prompt_tokens = 0, completion_tokens = 0;
    for (size_t i = 0; i < requests.size(); i++) {
      {
        std::lock_guard<std::mutex> lock(model_);
        run_completion(*gpt_, tok_, requests[i], nullptr, &done[i]);
      }
      choices.push_back(completion_choice(tok_, (int)i, requests[i], done[i]));
      prompt_tokens += (int64_t)done[i].prompt_tokens.size();
      completion_tokens += (int64_t)done[i].tokens.size();
    }
    head["choices"] = choices;
    head["usage"] = {{"prompt_tokens", prompt_tokens}, {"completion_tokens", completion_tokens},
                     {"total_tokens", prompt_tokens + completion_tokens}};
    res.set_content(dump_json(head), "application/json");
  }

  // Server-sent events: one chunk per piece of text as it is sampled, the last with the
  // finish reason, then [DONE].
  void complete_streamed(const CompletionRequest& r, Completion prepared, const json& head, httplib::Response& res) {
    res.set_chunked_content_provider("text/event-stream", [this, r, prepared, head](size_t, httplib::DataSink& sink) {
      Completion c = prepared;
      auto event = [&](const json& choice) {
        json chunk = head;
        chunk["choices"] = json::array({choice});
        const std::string text = "data: " + dump_json(chunk) + "\n\n";
        return sink.write(text.data(), text.size());
      };
      {
        std::lock_guard<std::mutex> lock(model_);
        run_completion(*gpt_, tok_, r, [&](const std::string& piece) {
          event({{"index", 0}, {"text", piece}, {"logprobs", nullptr}, {"finish_reason", nullptr}});
        }, &c);
      }
      event({{"index", 0}, {"text", ""}, {"logprobs", nullptr}, {"finish_reason", c.stopped ? "stop" : "length"}});
      const std::string done = "data: [DONE]\n\n";
      sink.write(done.data(), done.size());
      sink.done();
      return true;
    });
  }

  ServeOptions options_;
  std::unique_ptr<model::Gpt> gpt_;
  data::Gpt2Tokenizer tok_;
  httplib::Server http_;
  std::mutex model_;  // one request on the model at a time
  std::atomic<int64_t> next_id_{0};
};

Status serve(const ServeOptions& o) {
  if (o.port < 0 || o.port > 65535) return Status::error("--port must be 0-65535 (0: any free port)");
  if (o.threads > 0) omp_set_num_threads(o.threads);
  data::Gpt2Tokenizer tok;
  std::unique_ptr<model::Gpt> gpt;
  RETURN_IF_ERROR(load_for_completion(o.model, o.tokenizer, &gpt, &tok));
  // SIGINT and SIGTERM go to one thread that stops the server (not to a handler that
  // could interrupt it anywhere).
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  Server server(o, std::move(gpt), std::move(tok));
  std::thread stopper([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    if (sig != 0) server.stop();
  });
  const Status s = server.listen();
  pthread_kill(stopper.native_handle(), SIGTERM);  // the server stopped by itself: end the waiter
  stopper.join();
  if (s.is_ok()) std::printf("stopped\n");
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
  return {cmd, [o] {
            Status s = serve(*o);
            return s.is_ok() ? 0 : fail(s);
          }};
}

}  // namespace meshtrain::cli
