#include "net/http_server.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include <nlohmann/json.hpp>

namespace meshtrain::net {

namespace {

using Clock = std::chrono::steady_clock;

Clock::time_point after(double seconds) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

// How long a refused or finished connection is still read (and what arrives thrown away)
// after the server's last byte, so that closing with unread bytes does not reset the
// connection before the client has read the answer.
constexpr double kLingerSeconds = 2;

}  // namespace

std::string error_json(std::string_view message, std::string_view type) {
  return nlohmann::json{{"error", {{"message", message}, {"type", type}}}}.dump(
      -1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// ---- Exchange: a handler's side of the connection --------------------------------------

bool Exchange::send_all(std::string_view data) {
  if (failed_) return false;
  const Clock::time_point deadline = after(write_timeout_s_);
  while (!data.empty()) {
    const ssize_t n = ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      data.remove_prefix((size_t)n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      // The client reads slowly: wait for room, up to the write deadline in all.
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      pollfd p{fd_, POLLOUT, 0};
      if (left > 0 && ::poll(&p, 1, (int)left) > 0 && !(p.revents & (POLLERR | POLLHUP))) continue;
    }
    failed_ = true;
    return false;
  }
  return true;
}

std::string Exchange::head(int status, std::string_view content_type, const Headers& headers, bool chunked) const {
  std::string h = "HTTP/1.1 " + std::to_string(status) + " " + status_reason(status) + "\r\n";
  h += "Content-Type: " + std::string(content_type) + "\r\n";
  for (const auto& [name, value] : headers) h += name + ": " + value + "\r\n";
  if (chunked) h += "Transfer-Encoding: chunked\r\n";
  if (!request_.keep_alive || (streaming_ && !chunked)) h += "Connection: close\r\n";
  return h;
}

bool Exchange::respond(int status, std::string_view content_type, std::string_view body, const Headers& headers) {
  if (responded_) return false;
  responded_ = true;
  std::string message = head(status, content_type, headers, false);
  message += "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n";
  message += body;
  return send_all(message);
}

bool Exchange::begin_stream(int status, std::string_view content_type) {
  if (responded_) return false;
  responded_ = streaming_ = true;
  return send_all(head(status, content_type, {}, request_.minor_version >= 1) + "\r\n");
}

bool Exchange::write(std::string_view data) {
  if (!streaming_ || data.empty()) return streaming_ && !failed_;
  if (request_.minor_version == 0) return send_all(data);  // HTTP/1.0: the close ends it
  char size[24];
  std::snprintf(size, sizeof size, "%zx\r\n", data.size());
  return send_all(std::string(size) + std::string(data) + "\r\n");
}

bool Exchange::end_stream() {
  if (!streaming_) return false;
  const bool ok = request_.minor_version == 0 || send_all("0\r\n\r\n");
  // An HTTP/1.0 stream ends only with the connection.
  streaming_ = request_.minor_version == 0;
  return ok;
}

bool Exchange::client_gone() const {
  pollfd p{fd_, POLLIN | POLLRDHUP, 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLERR | POLLHUP | POLLRDHUP)) return true;
  char byte;  // readable: a pipelined request (still here), or the end of the stream (gone)
  return ::recv(fd_, &byte, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

// ---- The event loop --------------------------------------------------------------------

struct HttpServer::Connection {
  enum class Phase { kHeaders, kBody, kIdle, kClosing };
  int fd = -1;
  std::string in, out;  // received and not yet a request; to send from the loop
  Phase phase = Phase::kHeaders;
  Clock::time_point deadline;
  size_t need = 0;  // kBody: the bytes of `in` that make the request whole
  bool continue_sent = false, write_shut = false;
  bool counted = true;  // one of the open connections (a connection refused as busy is not)
};

struct HttpServer::Job {
  std::unique_ptr<Connection> conn;
  HttpRequest request;
};

HttpServer::HttpServer(ServerLimits limits, Handler handler) : limits_(std::move(limits)), handler_(std::move(handler)) {}

HttpServer::~HttpServer() {
  for (auto& [fd, c] : conns_) ::close(fd);
  for (int fd : {listen_fd_, epoll_fd_, wake_fd_})
    if (fd >= 0) ::close(fd);
}

Status HttpServer::listen(const std::string& host, int port) {
  const std::string where = host + ":" + std::to_string(port);
  addrinfo hints{}, *found = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  if (int e = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found); e != 0)
    return Status::error("cannot listen on " + where + ": " + ::gai_strerror(e));
  std::unique_ptr<addrinfo, void (*)(addrinfo*)> owned(found, ::freeaddrinfo);
  listen_fd_ = ::socket(found->ai_family, found->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, found->ai_protocol);
  if (listen_fd_ < 0) return Status::error("cannot listen on " + where + ": " + std::strerror(errno));
  // SO_REUSEADDR lets a restarted server take its port over connections in TIME_WAIT; on
  // Linux it never lets two servers listen on one port. SO_REUSEPORT would: never set.
  const int one = 1;
  ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(listen_fd_, found->ai_addr, found->ai_addrlen) != 0) {
    const int e = errno;
    return Status::error("cannot listen on " + where + ": " + std::strerror(e) +
                         (e == EADDRINUSE ? " (another server is on this port; choose another with --port)" : ""));
  }
  if (::listen(listen_fd_, limits_.backlog) != 0)
    return Status::error("cannot listen on " + where + ": " + std::strerror(errno));
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  ::getsockname(listen_fd_, (sockaddr*)&bound, &len);
  port_ = ntohs(bound.ss_family == AF_INET6 ? ((sockaddr_in6*)&bound)->sin6_port : ((sockaddr_in*)&bound)->sin_port);
  epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (epoll_fd_ < 0 || wake_fd_ < 0) return Status::error("cannot make the server's event loop: " + std::string(std::strerror(errno)));
  for (int fd : {listen_fd_, wake_fd_}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
  }
  return Status::ok();
}

void HttpServer::stop() {
  stopping_ = true;
  const uint64_t one = 1;
  if (wake_fd_ >= 0) (void)!::write(wake_fd_, &one, sizeof one);
}

ServerStats HttpServer::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  ServerStats s;
  s.connections = open_;
  s.in_flight = in_flight_;
  s.queued = (int)jobs_.size();
  s.accepted = accepted_;
  s.refused_busy = refused_busy_;
  s.refused = refused_;
  return s;
}

void HttpServer::count_refusal(int status) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = std::find_if(refused_.begin(), refused_.end(), [&](const auto& p) { return p.first == status; });
  if (it == refused_.end()) refused_.emplace_back(status, 1);
  else it->second++;
}

void HttpServer::watch(Connection& c, bool add) {
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP | (c.out.empty() ? 0u : (uint32_t)EPOLLOUT);
  ev.data.fd = c.fd;
  ::epoll_ctl(epoll_fd_, add ? EPOLL_CTL_ADD : EPOLL_CTL_MOD, c.fd, &ev);
}

void HttpServer::close_connection(int fd) {
  auto it = conns_.find(fd);
  if (it == conns_.end()) return;
  const bool counted = it->second->counted;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
  ::close(fd);
  conns_.erase(it);
  if (counted) {
    std::lock_guard<std::mutex> lock(mu_);
    open_--;
  }
}

void HttpServer::accept_all() {
  for (;;) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE) {  // out of descriptors: accept again at the next tick
        ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, listen_fd_, nullptr);
        accept_paused_ = true;
      }
      return;
    }
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);  // streamed pieces go at once
    auto c = std::make_unique<Connection>();
    c->fd = fd;
    c->deadline = after(limits_.header_timeout_s);
    bool busy;
    {
      std::lock_guard<std::mutex> lock(mu_);
      accepted_++;
      busy = open_ >= limits_.max_connections;
      if (busy) refused_busy_++;
      else open_++;
    }
    c->counted = !busy;
    // Connections being refused are bounded too: past twice the cap they are closed at once.
    if (busy && (int)conns_.size() >= 2 * limits_.max_connections) {
      ::close(fd);
      continue;
    }
    Connection& ref = *c;
    conns_[fd] = std::move(c);
    watch(ref, true);
    if (busy)
      refuse(ref, 503, "the server has " + std::to_string(limits_.max_connections) +
                           " connections open, its limit (--max-connections); retry later",
             {{"Retry-After", std::to_string(limits_.retry_after_s)}});
  }
}

void HttpServer::refuse(Connection& c, int status, const std::string& message, const Headers& headers) {
  if (status != 503) count_refusal(status);
  c.out += "HTTP/1.1 " + std::to_string(status) + " " + status_reason(status) + "\r\n";
  for (const auto& [name, value] : headers) c.out += name + ": " + value + "\r\n";
  const std::string body = error_json(message, status == 503 ? "server_error" : "invalid_request_error");
  c.out += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
           "\r\nConnection: close\r\n\r\n" + body;
  c.in.clear();
  c.phase = Connection::Phase::kClosing;
  c.deadline = after(kLingerSeconds);
  on_writable(c);
}

void HttpServer::on_writable(Connection& c) {
  while (!c.out.empty()) {
    const ssize_t n = ::send(c.fd, c.out.data(), c.out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      c.out.erase(0, (size_t)n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      break;
    } else {
      return close_connection(c.fd);
    }
  }
  if (c.out.empty() && c.phase == Connection::Phase::kClosing && !c.write_shut) {
    ::shutdown(c.fd, SHUT_WR);  // the answer is all sent: say so, then read until the client closes
    c.write_shut = true;
  }
  watch(c, false);
}

void HttpServer::on_readable(Connection& c) {
  // Parsed after every read, so that a refusal (413 from Content-Length) goes out before
  // the rest of a large body is read, and a whole request goes to a handler at once.
  const int fd = c.fd;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n > 0) {
      if (c.phase == Connection::Phase::kClosing) continue;  // lingering: read and dropped
      c.in.append(buf, (size_t)n);
      // Parse again only when it can say more: a header line has ended, or the body is all
      // in. A client sending a byte at a time then costs no parse of all it sent per byte.
      using Phase = Connection::Phase;
      const bool line_ended = std::memchr(buf, '\n', (size_t)n) != nullptr;
      if (c.phase == Phase::kHeaders && !line_ended && c.in.size() < limits_.parse.max_header_bytes) continue;
      if (c.phase == Phase::kBody && c.in.size() < c.need) continue;
      advance(c);
      if (!conns_.count(fd)) return;  // a handler has it now (or it was closed)
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    // The client has closed (or reset): nothing more can be answered.
    return close_connection(fd);
  }
}

void HttpServer::advance(Connection& c) {
  using Phase = Connection::Phase;
  if (c.in.empty()) return;
  if (c.phase == Phase::kIdle) {  // a kept-alive connection's next request begins
    c.phase = Phase::kHeaders;
    c.deadline = after(limits_.header_timeout_s);
  }
  HttpRequest request;
  ParseResult r = parse_request(c.in, limits_.parse, &request);
  switch (r.state) {
    case ParseState::kNeedHeaders:
      return;
    case ParseState::kNeedBody:
      if (c.phase == Phase::kHeaders) {
        c.phase = Phase::kBody;
        c.deadline = after(limits_.body_timeout_s);
      }
      c.need = r.consumed + r.body_bytes;
      if (request.expect_continue && !c.continue_sent) {  // the client waits for it before its body
        c.continue_sent = true;
        c.out += "HTTP/1.1 100 Continue\r\n\r\n";
        on_writable(c);
      }
      return;
    case ParseState::kDone:
      c.in.erase(0, r.consumed);
      c.need = 0;
      return dispatch(c, std::move(request));
    case ParseState::kError:
      return refuse(c, r.status, r.message);
  }
}

void HttpServer::dispatch(Connection& c, HttpRequest request) {
  const int fd = c.fd;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);  // a handler owns it until it is answered
  auto job = std::make_unique<Job>();
  job->conn = std::move(conns_.at(fd));
  conns_.erase(fd);
  job->conn->continue_sent = false;
  job->request = std::move(request);
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back(std::move(job));
    handling_++;
  }
  work_ready_.notify_one();
}

void HttpServer::check_deadlines() {
  using Phase = Connection::Phase;
  const Clock::time_point now = Clock::now();
  std::vector<int> late;
  for (const auto& [fd, c] : conns_)
    if (now >= c->deadline) late.push_back(fd);
  for (int fd : late) {
    Connection& c = *conns_.at(fd);
    if (c.phase == Phase::kHeaders)
      refuse(c, 408, "the request's headers did not all arrive within " + std::to_string((int)limits_.header_timeout_s) + " s");
    else if (c.phase == Phase::kBody)
      refuse(c, 408, "the request's body did not all arrive within " + std::to_string((int)limits_.body_timeout_s) +
                         " s of its headers");
    else
      close_connection(fd);  // idle past the keep-alive timeout, or done lingering
  }
  if (accept_paused_ && !stopping_) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = listen_fd_;
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &ev);
    accept_paused_ = false;
  }
}

void HttpServer::take_returned() {
  std::vector<std::unique_ptr<Connection>> back;
  {
    std::lock_guard<std::mutex> lock(mu_);
    back.swap(returned_);
  }
  for (auto& c : back) {
    const int fd = c->fd;
    Connection& ref = *c;
    conns_[fd] = std::move(c);
    watch(ref, true);
    if (ref.phase == Connection::Phase::kClosing) on_writable(ref);
    else advance(ref);  // a pipelined request may be here already
  }
}

void HttpServer::serve_job(Job& job) {
  Connection& c = *job.conn;
  Exchange exchange(c.fd, job.request, limits_.write_timeout_s);
  bool gone = exchange.client_gone();  // waited its turn, and its client left meanwhile
  if (!gone) {
    try {
      handler_(exchange);
    } catch (const std::exception& e) {  // a handler's bug must not take the server down
      if (!exchange.responded()) exchange.respond(500, "application/json", error_json(e.what(), "server_error"));
    }
    if (!exchange.responded()) exchange.respond(500, "application/json", error_json("no answer", "server_error"));
  }
  if (gone || exchange.failed()) {  // nobody to answer or to read from
    ::close(c.fd);
    std::lock_guard<std::mutex> lock(mu_);
    open_--;
    return;
  }
  if (exchange.reusable() && !stopping_) {
    c.phase = Connection::Phase::kIdle;
    c.deadline = after(limits_.idle_timeout_s);
  } else {  // answered, then closed: from the loop, reading what still comes (no reset)
    c.phase = Connection::Phase::kClosing;
    c.deadline = after(kLingerSeconds);
    c.in.clear();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    returned_.push_back(std::move(job.conn));
  }
  const uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof one);
}

void HttpServer::work() {
  for (;;) {
    std::unique_ptr<Job> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_ready_.wait(lock, [&] { return workers_stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
      in_flight_++;
    }
    serve_job(*job);
    std::lock_guard<std::mutex> lock(mu_);
    in_flight_--;
    handling_--;
  }
}

void HttpServer::run() {
  for (int i = 0; i < std::max(1, limits_.max_in_flight); i++) workers_.emplace_back([this] { work(); });
  epoll_event events[256];
  for (;;) {
    const int n = ::epoll_wait(epoll_fd_, events, 256, 100);  // the tick that checks deadlines
    for (int i = 0; i < n; i++) {
      const int fd = events[i].data.fd;
      if (fd == listen_fd_) {
        if (!stopping_) accept_all();
      } else if (fd == wake_fd_) {
        uint64_t count;
        (void)!::read(wake_fd_, &count, sizeof count);
      } else if (auto it = conns_.find(fd); it != conns_.end()) {
        if (events[i].events & EPOLLOUT) on_writable(*it->second);
        if (auto again = conns_.find(fd); again != conns_.end() && (events[i].events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)))
          on_readable(*again->second);
      }
    }
    take_returned();
    check_deadlines();
    if (stopping_ && drained()) break;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    workers_stop_ = true;
  }
  work_ready_.notify_all();
  for (std::thread& t : workers_) t.join();
  workers_.clear();
  take_returned();
  std::vector<int> fds;
  for (const auto& [fd, c] : conns_) fds.push_back(fd);
  for (int fd : fds) close_connection(fd);
}

bool HttpServer::drained() {
  // Stopping: no new connection, no new request; the requests in handlers are answered.
  if (listen_fd_ >= 0) {
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, listen_fd_, nullptr);
    ::close(listen_fd_);
    listen_fd_ = -1;
  }
  std::vector<int> waiting;
  for (const auto& [fd, c] : conns_)
    if (c->phase != Connection::Phase::kClosing || c->out.empty()) waiting.push_back(fd);
  for (int fd : waiting) close_connection(fd);
  std::lock_guard<std::mutex> lock(mu_);
  return handling_ == 0;
}

}  // namespace meshtrain::net
