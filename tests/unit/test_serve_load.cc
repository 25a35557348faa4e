// `meshtrain serve` under load and abuse (issue 42), against the real binary on 127.0.0.1
// with bounded counts and times: a burst of 300 connections all answered (200, or 503 with
// Retry-After; none reset), 32 slow-loris connections that neither starve a normal request
// nor outlive the header deadline, size limits (413 for a body, a huge prompt refused before
// it is tokenized and the memory back afterwards), unknown fields refused naming them, a
// second server on a port in use failing, /health and /metrics reporting the queue and
// moving, a client that hangs up stopping its decoding, and generate's sampling defaults.
// The model is a tiny one with a context of 512 tokens, so that a completion can decode
// long enough to be interrupted.
#include <gtest/gtest.h>
#include <poll.h>

#include <chrono>
#include <cstdio>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_test_util.h"
#include "http_test_client.h"

namespace meshtrain::test_serve_load {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;
using http_test::seconds_since;

class ServeLoad : public cli_test::CliTest {
 protected:
  static void SetUpTestSuite() {
    CliTest::SetUpTestSuite();
    if (!prep_ok_) return;
    model_dir_ = cli_test::shared_once("serve_long_context", [](const std::string& dir) {
      const cli_test::RunResult r =
          cli_test::run(train("--model tiny --seq-len 512 --micro-batch 1 --vocab 50257 --steps 1 --quiet --out " + dir + "/run"));
      return r.exit_code == 0 ? std::string() : cli_test::describe(r);
    }, &model_error_);
  }
  void SetUp() override {
    CliTest::SetUp();
    if (HasFatalFailure()) return;
    ASSERT_FALSE(model_dir_.empty()) << model_error_;
  }
  void TearDown() override {
    if (!served_.pid.empty()) cli_test::stop_serve(served_, path("serve.out"));
    CliTest::TearDown();
  }

  static std::string model() { return model_dir_ + "/run"; }
  // The server of this test, on any free port; ASSERT its start in the caller.
  int serve(const std::string& flags = "") {
    served_ = cli_test::start_serve("--checkpoint " + model() + " --port 0 --threads 1 " + flags, path("serve.out"));
    return served_.port;
  }
  std::string log() const { return cli_test::read_file(path("serve.out")); }

  static std::string completion(int max_tokens, int seed = 1) {
    return json{{"prompt", "It was"}, {"max_tokens", max_tokens}, {"seed", seed}}.dump();
  }
  // A request sent on a fresh connection and left there: the caller reads or drops it.
  static int send_completion(int port, const std::string& body) {
    const int fd = http_test::connect_to(port);
    if (fd >= 0)
      http_test::send_text(fd, "POST /v1/completions HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Length: " +
                                   std::to_string(body.size()) + "\r\n\r\n" + body);
    return fd;
  }
  json health() const {
    const http_test::Reply r = http_test::request(served_.port, "GET", "/health");
    return json::parse(r.body, nullptr, false);
  }
  // A sample's value in GET /metrics ("name{labels}"), or -1 if it is not there.
  double metric(const std::string& sample) const {
    const std::string text = http_test::request(served_.port, "GET", "/metrics").body;
    for (const std::string& line : cli_test::lines_of(text))
      if (line.starts_with(sample + " ")) return std::stod(line.substr(sample.size() + 1));
    return -1;
  }
  // Polls /health until `done` holds (true) or `seconds` pass (false).
  bool wait_health(double seconds, const std::function<bool(const json&)>& done) const {
    const auto start = Clock::now();
    while (seconds_since(start) < seconds) {
      if (const json h = health(); h.is_object() && done(h)) return true;
      ::usleep(5000);
    }
    return false;
  }
  // The server's resident set in MB (/proc).
  double rss_mb() const {
    for (const std::string& line : cli_test::lines_of(cli_test::read_file("/proc/" + served_.pid + "/status")))
      if (line.starts_with("VmRSS:")) return std::stod(line.substr(6)) / 1024;
    return -1;
  }

  static inline std::string model_dir_, model_error_;
  cli_test::Served served_;
};

// 300 clients connect at the same moment, while the server is paused (SIGSTOP: a moment
// when it is busy), so only the kernel's listen queue holds them; then each sends a
// completion. Every connection completes at once, and every request is answered, 200 or
// 503 with Retry-After, none reset. cpp-httplib's listen queue of 5 took 6 of them; the
// rest waited for SYN retries, and in the issue's measurement most were reset.
TEST_F(ServeLoad, BurstOfConnectionsIsAllAnswered) {
  const int port = serve();
  ASSERT_GT(port, 0) << log();
  constexpr int kClients = 300;
  ASSERT_EQ(cli_test::run("kill -STOP " + served_.pid).exit_code, 0);
  const std::vector<int> fds = http_test::connect_all(port, kClients, 3.0);
  EXPECT_EQ(cli_test::run("kill -CONT " + served_.pid).exit_code, 0);
  for (int i = 0; i < kClients; i++) {
    ASSERT_GE(fds[i], 0) << "connection " << i << " did not complete within 3 s: the listen queue is too short";
    const std::string body = completion(2, i);
    http_test::send_text(fds[i], "POST /v1/completions HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Length: " +
                                     std::to_string(body.size()) + "\r\n\r\n" + body);
  }
  int ok = 0, busy = 0;
  for (int i = 0; i < kClients; i++) {
    const http_test::Reply r = http_test::read_reply(fds[i]);
    ::close(fds[i]);
    EXPECT_FALSE(r.reset) << "client " << i;
    if (r.status == 200) ok++;
    else if (r.status == 503 && r.head.find("Retry-After: ") != std::string::npos) busy++;
    else ADD_FAILURE() << "client " << i << ": " << r.head;
  }
  EXPECT_EQ(ok + busy, kClients);
  EXPECT_GT(ok, 0);
}

// 32 connections send their headers a byte every 200 ms (slow-loris). A normal completion
// is still answered at once, and each slow one gets 408 once the whole-header deadline
// (2 s here) passes, however steadily it sends. cpp-httplib gave every worker thread to them,
// and its timeout was per read. (The bounds are loose for the sanitizers' build under load.)
TEST_F(ServeLoad, SlowClientsNeitherStarveOthersNorOutliveTheirDeadline) {
  const int port = serve("--header-timeout 2");
  ASSERT_GT(port, 0) << log();
  constexpr int kSlow = 32;
  std::vector<int> slow;
  for (int i = 0; i < kSlow; i++) {
    slow.push_back(http_test::connect_to(port));
    ASSERT_GE(slow.back(), 0);
    http_test::send_text(slow.back(), "POST /v1/completions HTTP/1.1\r\nHost: t\r\n");
  }
  const auto start = Clock::now();
  std::vector<double> answered_at(kSlow, -1);
  std::thread trickle([&] {  // one byte to each, every 200 ms, until it is answered
    while (seconds_since(start) < 15) {
      int left = 0;
      for (int i = 0; i < kSlow; i++) {
        if (answered_at[i] >= 0) continue;
        pollfd p{slow[i], POLLIN, 0};
        if (::poll(&p, 1, 0) > 0) answered_at[i] = seconds_since(start);
        else left++, http_test::send_text(slow[i], "X");
      }
      if (left == 0) break;
      ::usleep(200000);
    }
  });
  const auto asked = Clock::now();
  const http_test::Reply normal = http_test::request(port, "POST", "/v1/completions", completion(4), 20);
  const double took = seconds_since(asked);
  trickle.join();
  EXPECT_EQ(normal.status, 200) << normal.head;
  EXPECT_LT(took, 5.0) << "a normal request waited behind the slow ones";
  for (int i = 0; i < kSlow; i++) {
    const http_test::Reply r = http_test::read_reply(slow[i]);
    ::close(slow[i]);
    EXPECT_EQ(r.status, 408) << "slow client " << i << ": " << r.head;
    EXPECT_GE(answered_at[i], 1.5) << "slow client " << i;
    EXPECT_LT(answered_at[i], 6.0) << "slow client " << i << " outlived the 2 s header deadline";
  }
}

// A body over --max-request-bytes gets 413 before it is all sent; a prompt whose bytes
// alone put it over the context is refused before it is tokenized (a megabyte took seconds
// and hundreds of MB), and the memory comes back; an unknown field is a 400 naming it and the
// nearest known name, while OpenAI's usual extra fields are accepted.
TEST_F(ServeLoad, OversizedAndUnknownRequestsAreRefusedEarly) {
  const int port = serve();
  ASSERT_GT(port, 0) << log();
  const double before = rss_mb();
  auto start = Clock::now();
  const http_test::Reply big = http_test::request(port, "POST", "/v1/completions", std::string(2 << 20, ' '));
  EXPECT_EQ(big.status, 413) << big.head << big.body;
  EXPECT_LT(seconds_since(start), 3.0);

  const std::string huge = json{{"prompt", std::string(1000000, 'a')}, {"max_tokens", 1}}.dump();
  start = Clock::now();
  for (int i = 0; i < 4; i++) {
    const http_test::Reply r = http_test::request(port, "POST", "/v1/completions", huge);
    EXPECT_EQ(r.status, 400) << r.head;
    EXPECT_NE(r.body.find("exceeds the model's context of 512 tokens"), std::string::npos) << r.body;
  }
  EXPECT_LT(seconds_since(start), 3.0) << "four 1 MB prompts should be refused without tokenizing them";
  const double after = rss_mb();
  EXPECT_LT(after - before, 64) << "RSS " << before << " MB before, " << after << " MB after";

  const http_test::Reply typo =
      http_test::request(port, "POST", "/v1/completions", R"({"prompt": "It was", "temprature": 0.5})");
  EXPECT_EQ(typo.status, 400) << typo.head;
  EXPECT_NE(typo.body.find("unknown field 'temprature' (did you mean 'temperature'?)"), std::string::npos) << typo.body;
  const http_test::Reply n2 = http_test::request(port, "POST", "/v1/completions", R"({"prompt": "It was", "n": 2})");
  EXPECT_EQ(n2.status, 400) << n2.body;
  const http_test::Reply openai = http_test::request(
      port, "POST", "/v1/completions",
      R"({"prompt": "It was", "max_tokens": 2, "model": "x", "user": "u", "n": 1, "echo": false, "presence_penalty": 0})");
  EXPECT_EQ(openai.status, 200) << openai.body;
}

// A request that names no sampling settings gets generate's defaults (one definition,
// cli::kDefaultSampling): the same text as `generate` with the same seed. serve sampled at
// temperature 1 over the whole vocabulary, generate at 0.8 among the top 40.
TEST_F(ServeLoad, DefaultSamplingIsGeneratesDefault) {
  const int port = serve();
  ASSERT_GT(port, 0) << log();
  const http_test::Reply r = http_test::request(port, "POST", "/v1/completions", R"({"prompt": "It was", "max_tokens": 8, "seed": 5})");
  ASSERT_EQ(r.status, 200) << r.body;
  const cli_test::RunResult alone = cli_test::run(cli_test::kBinary + " generate --checkpoint " + model() +
                                                  " --threads 1 --prompt 'It was' --max-new-tokens 8 --seed 5 --json");
  ASSERT_EQ(alone.exit_code, 0) << cli_test::describe(alone);
  EXPECT_EQ(json::parse(r.body)["choices"][0]["text"], json::parse(alone.out)["text"]);
}

// A second server on the port of a running one fails at once, naming host:port; with
// SO_REUSEPORT it started silently and the kernel split the traffic between them.
TEST_F(ServeLoad, ASecondServerOnAPortInUseFails) {
  const int port = serve();
  ASSERT_GT(port, 0) << log();
  const cli_test::RunResult second = cli_test::run("timeout 60 " + cli_test::kBinary + " serve --checkpoint " + model() +
                                                   " --threads 1 --port " + std::to_string(port));
  EXPECT_NE(second.exit_code, 0) << cli_test::describe(second);
  EXPECT_NE(second.exit_code, 124) << "the second server was still running after 60 s";
  EXPECT_NE(second.err.find("cannot listen on 127.0.0.1:" + std::to_string(port)), std::string::npos) << second.err;
  EXPECT_NE(second.err.find("in use"), std::string::npos) << second.err;
  EXPECT_EQ(http_test::request(port, "GET", "/health").status, 200);
}

// GET /health shows the queue while one completion decodes and two wait (--max-batch 1);
// GET /metrics is Prometheus text whose counters move with a completion.
TEST_F(ServeLoad, HealthAndMetricsReportTheQueue) {
  const int port = serve("--max-batch 1");
  ASSERT_GT(port, 0) << log();
  const std::regex sample(R"(^[a-z_]+(\{[a-z_]+="[^"]*"\})? (-?[0-9.e+\-]+|nan)$)");
  const std::string text = http_test::request(port, "GET", "/metrics").body;
  int samples = 0;
  for (const std::string& line : cli_test::lines_of(text)) {
    if (line.starts_with("# HELP ") || line.starts_with("# TYPE ")) continue;
    EXPECT_TRUE(std::regex_match(line, sample)) << line;
    samples++;
  }
  EXPECT_GE(samples, 12) << text;
  const double ok0 = metric("meshtrain_requests_total{code=\"200\"}"), tokens0 = metric("meshtrain_generation_tokens_total");
  EXPECT_GE(ok0, 0) << text;
  EXPECT_EQ(tokens0, 0) << text;
  EXPECT_EQ(http_test::request(port, "POST", "/v1/completions", completion(5)).status, 200);
  EXPECT_EQ(metric("meshtrain_generation_tokens_total"), 5);
  EXPECT_EQ(metric("meshtrain_prompt_tokens_total"), 2);
  EXPECT_GT(metric("meshtrain_requests_total{code=\"200\"}"), ok0);
  EXPECT_GT(metric("meshtrain_request_latency_seconds{quantile=\"0.99\"}"), 0);
  EXPECT_GT(metric("meshtrain_generation_tokens_per_second"), 0);

  std::vector<int> long_ones;
  for (int i = 0; i < 3; i++) long_ones.push_back(send_completion(port, completion(500, i)));
  json seen;
  EXPECT_TRUE(wait_health(10, [&](const json& h) {
    seen = h;
    return h["running"] == 1 && h["waiting"] == 2 && h["connections"] >= 4;
  })) << seen.dump();
  EXPECT_EQ(seen["status"], "ok");
  EXPECT_GE(metric("meshtrain_connections"), 3);
  for (int fd : long_ones) ::close(fd);  // and they leave
  EXPECT_TRUE(wait_health(10, [](const json& h) { return h["running"] == 0 && h["waiting"] == 0; })) << health().dump();
}

// A client that hangs up on a non-streamed completion stops its decoding: 500 tokens were
// asked for, far fewer are decoded, and the request is counted as 499.
TEST_F(ServeLoad, AClientThatHangsUpStopsItsDecoding) {
  const int port = serve("--max-batch 1");
  ASSERT_GT(port, 0) << log();
  const int fd = send_completion(port, completion(500));
  ASSERT_GE(fd, 0);
  EXPECT_TRUE(wait_health(10, [](const json& h) { return h["running"] == 1; }));
  ::close(fd);
  const auto start = Clock::now();
  EXPECT_TRUE(wait_health(10, [](const json& h) { return h["running"] == 0; }));
  EXPECT_LT(seconds_since(start), 5.0);
  const double generated = metric("meshtrain_generation_tokens_total");
  EXPECT_GE(generated, 0);
  EXPECT_LT(generated, 300) << "the decoding went on after the client left";
  EXPECT_EQ(metric("meshtrain_requests_total{code=\"499\"}"), 1);
}

}  // namespace
}  // namespace meshtrain::test_serve_load
