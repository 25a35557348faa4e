// A raw HTTP/1.1 client for the server tests (test_http_server.cc in-process,
// test_serve_load.cc against `meshtrain serve`): plain blocking sockets with timeouts, so a
// test controls every byte and sees a reset as a reset.
#pragma once
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>
#include <algorithm>

namespace meshtrain::http_test {

// A connection to 127.0.0.1:port with send and receive timeouts; -1 if it failed.
inline int connect_to(int port, double timeout_s = 10) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  timeval tv{(time_t)timeout_s, (suseconds_t)((timeout_s - (time_t)timeout_s) * 1e6)};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons((uint16_t)port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, (sockaddr*)&addr, sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// `n` connections to 127.0.0.1:port started at once (non-blocking connects), each made
// blocking with timeouts once it completes; -1 for each not completed within `seconds`.
inline std::vector<int> connect_all(int port, int n, double seconds, double timeout_s = 60) {
  std::vector<int> fds(n, -1);
  std::vector<pollfd> pending;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons((uint16_t)port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  for (int i = 0; i < n; i++) {
    fds[i] = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (::connect(fds[i], (sockaddr*)&addr, sizeof addr) != 0 && errno != EINPROGRESS) continue;
    pending.push_back({fds[i], POLLOUT, 0});
  }
  std::vector<bool> done(n, false);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  for (size_t left = pending.size(); left > 0 && std::chrono::steady_clock::now() < deadline;) {
    if (::poll(pending.data(), pending.size(), 20) <= 0) continue;
    for (pollfd& p : pending)
      if (p.revents & POLLOUT) left--, p.events = 0, p.revents = 0, p.fd = -p.fd - 1;  // done: poll skips it
  }
  for (int i = 0; i < n; i++) {
    int error = 0;
    socklen_t len = sizeof error;
    const bool connected = std::any_of(pending.begin(), pending.end(), [&](const pollfd& p) { return p.fd == -fds[i] - 1; }) &&
                           ::getsockopt(fds[i], SOL_SOCKET, SO_ERROR, &error, &len) == 0 && error == 0;
    if (!connected) {
      ::close(fds[i]);
      fds[i] = -1;
      continue;
    }
    ::fcntl(fds[i], F_SETFL, ::fcntl(fds[i], F_GETFL) & ~O_NONBLOCK);
    timeval tv{(time_t)timeout_s, 0};
    ::setsockopt(fds[i], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ::setsockopt(fds[i], SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  }
  return fds;
}

inline bool send_text(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n <= 0) return false;
    data.remove_prefix((size_t)n);
  }
  return true;
}

struct Reply {
  int status = 0;     // 0: no status line came
  std::string head;   // the status line and headers
  std::string body;   // as sent (chunked framing left in)
  bool reset = false;  // the connection was reset (or timed out) before the answer ended
};

// Everything until the server closes (requests send "Connection: close"), parsed.
inline Reply read_reply(int fd) {
  std::string all;
  char buf[65536];
  Reply r;
  for (;;) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n > 0) {
      all.append(buf, (size_t)n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    r.reset = n < 0;
    break;
  }
  const size_t end = all.find("\r\n\r\n");
  r.head = all.substr(0, end);
  if (end != std::string::npos) r.body = all.substr(end + 4);
  if (all.starts_with("HTTP/1.1 ") && all.size() >= 12) r.status = std::atoi(all.c_str() + 9);
  return r;
}

// One request on a new connection, "Connection: close", and its reply.
inline Reply request(int port, const std::string& method, const std::string& path, const std::string& body = "",
                     double timeout_s = 30) {
  Reply r;
  const int fd = connect_to(port, timeout_s);
  if (fd < 0) {
    r.reset = true;
    return r;
  }
  const std::string text = method + " " + path + " HTTP/1.1\r\nHost: test\r\nConnection: close\r\n" +
                           (body.empty() && method == "GET" ? "" : "Content-Length: " + std::to_string(body.size()) + "\r\n") +
                           "\r\n" + body;
  (void)send_text(fd, text);  // a refusal may come before the whole body is sent: read it anyway
  r = read_reply(fd);
  ::close(fd);
  return r;
}

inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace meshtrain::http_test
