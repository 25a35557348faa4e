// A small HTTP/1.1 server on epoll for `meshtrain serve`, written so that slow, idle or
// abusive clients cost no thread and cannot starve the others (docs/serving.md says why
// this replaced cpp-httplib):
//   - one event-loop thread accepts connections and reads requests on non-blocking sockets;
//     a connection that is still sending its request costs a buffer, never a thread;
//   - a whole request goes to one of `max_in_flight` handler threads; beyond that, whole
//     requests wait in arrival order, costing no thread (a request whose client has gone by
//     its turn is dropped);
//   - every limit answers with a status the client can act on: more than `max_connections`
//     open: 503 with Retry-After; headers over the limit: 431; a body over it: 413 (as soon
//     as Content-Length says so); headers not all in within `header_timeout_s` of the
//     connection (or of a kept-alive request's first byte), or a body not in within
//     `body_timeout_s` of its headers: 408. The server then closes its side and reads what
//     the client still sends for a moment, so that the answer is not lost to a reset.
//   - no SO_REUSEPORT: a second server on a port in use fails, naming it.
#pragma once
#include <sys/socket.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/status.h"
#include "net/http_request.h"

namespace meshtrain::net {

struct ServerLimits {
  int backlog = SOMAXCONN;           // the listen queue (the kernel caps it at net.core.somaxconn)
  int max_connections = 512;         // open at once; more get 503 + Retry-After
  int max_in_flight = 64;            // requests handled at once (handler threads)
  double header_timeout_s = 10;      // the whole request line and headers, not per read
  double body_timeout_s = 30;        // the whole body, from the end of the headers
  double idle_timeout_s = 30;        // a kept-alive connection between requests
  double write_timeout_s = 30;       // a client that reads nothing for this long is dropped
  int retry_after_s = 1;             // what a 503 tells the client to wait
  ParseLimits parse;
};

using Headers = std::vector<std::pair<std::string, std::string>>;

// One request and the writing side of its connection, on a handler thread. A handler
// answers once with respond(), or streams with begin_stream(), write()s and end_stream().
class Exchange {
 public:
  Exchange(int fd, const HttpRequest& request, double write_timeout_s)
      : fd_(fd), request_(request), write_timeout_s_(write_timeout_s) {}
  const HttpRequest& request() const { return request_; }
  // A whole response; false if the client could not be written to.
  bool respond(int status, std::string_view content_type, std::string_view body, const Headers& headers = {});
  // A response sent as it is made: chunked on HTTP/1.1, until the close on HTTP/1.0.
  bool begin_stream(int status, std::string_view content_type);
  bool write(std::string_view data);
  bool end_stream();
  // Whether the client has hung up or reset: for a handler waiting on long work.
  bool client_gone() const;
  bool responded() const { return responded_; }
  bool failed() const { return failed_; }  // a write failed: the client is gone or stalled
  // Whether the connection can take the next request: answered whole, kept alive.
  bool reusable() const { return responded_ && !failed_ && !streaming_ && request_.keep_alive; }

 private:
  bool send_all(std::string_view data);
  std::string head(int status, std::string_view content_type, const Headers& headers, bool chunked) const;

  int fd_;
  const HttpRequest& request_;
  double write_timeout_s_;
  bool responded_ = false, streaming_ = false, failed_ = false;
};

using Handler = std::function<void(Exchange&)>;

struct ServerStats {
  int connections = 0;  // open, whatever their state
  int in_flight = 0;    // requests in a handler
  int queued = 0;       // whole requests waiting for a handler
  int64_t accepted = 0, refused_busy = 0;  // connections; those refused with 503
  std::vector<std::pair<int, int64_t>> refused;  // the server's own answers by status (408, 413, ...)
};

// The JSON error body every refusal carries: {"error": {"message", "type"}}, as OpenAI's.
std::string error_json(std::string_view message, std::string_view type = "invalid_request_error");

class HttpServer {
 public:
  HttpServer(ServerLimits limits, Handler handler);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds and listens on host:port (0: any free port). An error names host:port and the
  // operating system's reason.
  Status listen(const std::string& host, int port);
  int port() const { return port_; }
  // Serves until stop(); returns once the requests in progress are answered.
  void run();
  // From any thread (not from a signal handler: use a pipe, as serve does).
  void stop();
  ServerStats stats() const;

 private:
  struct Connection;
  struct Job;
  void accept_all();
  void on_readable(Connection& c);
  void on_writable(Connection& c);
  void advance(Connection& c);
  void refuse(Connection& c, int status, const std::string& message, const Headers& headers = {});
  void close_connection(int fd);
  void check_deadlines();
  void take_returned();
  void dispatch(Connection& c, HttpRequest request);
  void work();
  void serve_job(Job& job);
  void watch(Connection& c, bool add);
  void count_refusal(int status);
  bool drained();  // stopping: closes what waits; whether the handlers are done

  ServerLimits limits_;
  Handler handler_;
  int listen_fd_ = -1, epoll_fd_ = -1, wake_fd_ = -1, port_ = 0;
  std::atomic<bool> stopping_{false};
  bool accept_paused_ = false;  // out of descriptors: the listening socket is not watched
  std::unordered_map<int, std::unique_ptr<Connection>> conns_;  // the loop thread's own

  mutable std::mutex mu_;  // guards everything below
  std::condition_variable work_ready_;
  std::deque<std::unique_ptr<Job>> jobs_;
  std::vector<std::unique_ptr<Connection>> returned_;  // kept alive after a handler
  int handling_ = 0, in_flight_ = 0, open_ = 0;
  int64_t accepted_ = 0, refused_busy_ = 0;
  std::vector<std::pair<int, int64_t>> refused_;
  bool workers_stop_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace meshtrain::net
