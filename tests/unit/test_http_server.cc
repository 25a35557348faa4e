// net/: the HTTP request parser (every refusal's status, the same answer however the bytes
// arrive) and the epoll server in-process on 127.0.0.1: keep-alive and pipelining, chunked
// streaming, and each limit as a client sees it (413, 431, 408 for a slow header, 503 with
// Retry-After past the connection cap, a port in use named).
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "http_test_client.h"
#include "net/http_request.h"
#include "net/http_server.h"

namespace meshtrain::test_http_server {
namespace {

using net::HttpRequest;
using net::ParseLimits;
using net::ParseResult;
using net::ParseState;

ParseResult parse(const std::string& text, HttpRequest* req, ParseLimits limits = {}) {
  return net::parse_request(text, limits, req);
}

TEST(HttpParser, ReadsARequestAndWhatFollowsIt) {
  const std::string one = "POST /v1/completions?x=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nX-Y:  v v \r\n\r\nhello";
  HttpRequest req;
  ParseResult r = parse(one + "GET /health HTTP/1.1\r\n\r\n", &req);
  ASSERT_EQ(r.state, ParseState::kDone) << r.message;
  EXPECT_EQ(r.consumed, one.size());
  EXPECT_EQ(req.method, "POST");
  EXPECT_EQ(req.path, "/v1/completions");
  EXPECT_EQ(req.query, "x=1");
  EXPECT_EQ(req.body, "hello");
  ASSERT_NE(req.header("x-y"), nullptr);
  EXPECT_EQ(*req.header("x-y"), "v v");
  EXPECT_TRUE(req.keep_alive);
  // Every prefix of it asks for more, headers first, then the body.
  for (size_t n = 0; n < one.size(); n++) {
    const ParseState s = parse(one.substr(0, n), &req).state;
    EXPECT_EQ(s, n < one.size() - 5 ? ParseState::kNeedHeaders : ParseState::kNeedBody) << n;
  }
  EXPECT_FALSE((parse("GET / HTTP/1.0\r\n\r\n", &req), req.keep_alive));
  EXPECT_FALSE((parse("GET / HTTP/1.1\r\nConnection: close\r\n\r\n", &req), req.keep_alive));
  EXPECT_TRUE((parse("POST / HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\n", &req), req.expect_continue));
}

TEST(HttpParser, RefusesWithTheStatusAClientCanActOn) {
  struct Case {
    std::string text;
    int status;
    ParseLimits limits;
  };
  const ParseLimits small{64, 10};
  const std::vector<Case> cases = {
      {"GARBAGE\r\n\r\n", 400, {}},
      {"GET  / HTTP/1.1\r\n\r\n", 400, {}},
      {"GET nopath HTTP/1.1\r\n\r\n", 400, {}},
      {"GET / HTTP/2.0\r\n\r\n", 505, {}},
      {"GET / HTTQ/1.1\r\n\r\n", 400, {}},
      {"GET / HTTP/1.1\r\nno colon\r\n\r\n", 400, {}},
      {"GET / HTTP/1.1\r\nA: b\r\n folded\r\n\r\n", 400, {}},
      {"GET / HTTP/1.1\r\nA: b\x01\r\n\r\n", 400, {}},
      {"POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400, {}},
      {"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", 400, {}},
      {"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", 411, {}},
      {"POST / HTTP/1.1\r\nContent-Length: 11\r\n\r\n", 413, small},
      {"POST / HTTP/1.1\r\nContent-Length: 9666666666666666666\r\n\r\n", 413, {}},  // found by the fuzzer
      {"POST / HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n", 413, {}},
      {"GET / HTTP/1.1\r\nA: " + std::string(100, 'x'), 431, small},
      {"GET /" + std::string(100, 'x'), 431, small},
  };
  for (const Case& c : cases) {
    HttpRequest req;
    const ParseResult r = parse(c.text, &req, c.limits);
    EXPECT_EQ(r.state, ParseState::kError) << c.text;
    EXPECT_EQ(r.status, c.status) << c.text << ": " << r.message;
    EXPECT_FALSE(r.message.empty());
  }
  std::string many = "GET / HTTP/1.1\r\n";
  for (int i = 0; i < 101; i++) many += "A: b\r\n";
  HttpRequest req;
  EXPECT_EQ(parse(many + "\r\n", &req).status, 431);
}

// An HttpServer on a free port, serving on a thread of its own until the test ends.
class ServedHere {
 public:
  explicit ServedHere(net::ServerLimits limits, net::Handler handler = nullptr)
      : server_(limits, handler ? handler : echo) {
    const Status s = server_.listen("127.0.0.1", 0);
    EXPECT_TRUE(s.is_ok()) << s.message();
    thread_ = std::thread([this] { server_.run(); });
  }
  ~ServedHere() {
    server_.stop();
    thread_.join();
  }
  int port() const { return server_.port(); }
  net::HttpServer& server() { return server_; }

 private:
  static void echo(net::Exchange& ex) {
    if (ex.request().path == "/stream") {
      ex.begin_stream(200, "text/plain");
      ex.write("one,");
      ex.write("two");
      ex.end_stream();
      return;
    }
    ex.respond(200, "text/plain", ex.request().method + " " + ex.request().path + " " + ex.request().body);
  }
  net::HttpServer server_;
  std::thread thread_;
};

TEST(HttpServer, KeepsConnectionsAliveAndStreamsInChunks) {
  ServedHere served({});
  const int fd = http_test::connect_to(served.port());
  ASSERT_GE(fd, 0);
  // Two pipelined requests on one connection, then a third that closes it.
  ASSERT_TRUE(http_test::send_text(fd, "GET /a HTTP/1.1\r\n\r\nPOST /b HTTP/1.1\r\nContent-Length: 2\r\n\r\nhi"
                                       "GET /stream HTTP/1.1\r\nConnection: close\r\n\r\n"));
  const http_test::Reply r = http_test::read_reply(fd);
  ::close(fd);
  EXPECT_FALSE(r.reset);
  const std::string all = r.head + "\r\n\r\n" + r.body;
  EXPECT_NE(all.find("\r\n\r\nGET /a "), std::string::npos) << all;
  EXPECT_NE(all.find("\r\n\r\nPOST /b hi"), std::string::npos) << all;
  EXPECT_NE(all.find("Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n4\r\none,\r\n3\r\ntwo\r\n0\r\n\r\n"),
            std::string::npos)
      << all;
}

TEST(HttpServer, RefusesOversizedRequestsAtOnce) {
  net::ServerLimits limits;
  limits.parse = {256, 1000};
  ServedHere served(limits);
  const auto start = std::chrono::steady_clock::now();
  http_test::Reply big = http_test::request(served.port(), "POST", "/x", std::string(100000, 'a'));
  EXPECT_EQ(big.status, 413) << big.head;
  EXPECT_NE(big.body.find("--max-request-bytes"), std::string::npos) << big.body;
  EXPECT_LT(http_test::seconds_since(start), 2.0);
  http_test::Reply headers = http_test::request(served.port(), "GET", "/" + std::string(300, 'p'));
  EXPECT_EQ(headers.status, 431) << headers.head;
  EXPECT_EQ(http_test::request(served.port(), "POST", "/x", std::string(1000, 'a')).status, 200);
}

// A client that sends its headers a byte at a time gets 408 once the whole-header deadline
// passes, however steadily it sends; meanwhile others are answered at once.
TEST(HttpServer, SlowHeadersMissTheirDeadline) {
  net::ServerLimits limits;
  limits.header_timeout_s = 0.6;
  ServedHere served(limits);
  const int slow = http_test::connect_to(served.port());
  ASSERT_GE(slow, 0);
  const auto start = std::chrono::steady_clock::now();
  const std::string text = "GET /slow HTTP/1.1\r\nX-Slow: " + std::string(40, 'z');
  bool refused = false;
  for (size_t i = 0; i < text.size() && !refused; i++) {
    refused = !http_test::send_text(slow, text.substr(i, 1));
    EXPECT_EQ(http_test::request(served.port(), "GET", "/fast").status, 200);
    pollfd p{slow, POLLIN, 0};
    refused = refused || ::poll(&p, 1, 50) > 0;
  }
  const http_test::Reply r = http_test::read_reply(slow);
  ::close(slow);
  EXPECT_EQ(r.status, 408) << r.head;
  EXPECT_LT(http_test::seconds_since(start), 2.0);
}

TEST(HttpServer, PastTheConnectionCapAnswers503WithRetryAfter) {
  net::ServerLimits limits;
  limits.max_connections = 3;
  ServedHere served(limits);
  std::vector<int> idle;
  for (int i = 0; i < 3; i++) idle.push_back(http_test::connect_to(served.port()));
  for (int i = 0; i < 50 && served.server().stats().connections < 3; i++) ::usleep(10000);
  const http_test::Reply r = http_test::request(served.port(), "GET", "/x");
  EXPECT_EQ(r.status, 503) << r.head;
  EXPECT_NE(r.head.find("Retry-After: 1"), std::string::npos) << r.head;
  EXPECT_FALSE(r.reset);
  for (int fd : idle) ::close(fd);
  for (int i = 0; i < 50 && served.server().stats().connections > 0; i++) ::usleep(10000);
  EXPECT_EQ(http_test::request(served.port(), "GET", "/x").status, 200);
  EXPECT_EQ(served.server().stats().refused_busy, 1);
}

TEST(HttpServer, APortInUseIsAnErrorNamingIt) {
  ServedHere served({});
  net::HttpServer second({}, [](net::Exchange&) {});
  const Status s = second.listen("127.0.0.1", served.port());
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("127.0.0.1:" + std::to_string(served.port())), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("in use"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace meshtrain::test_http_server
