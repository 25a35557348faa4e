// An HTTP/1.1 request parser for `meshtrain serve` (net/http_server.h): a pure function of
// the bytes received so far, so that the server can call it after every read and a fuzzer
// can call it on anything. It reads what the server needs and refuses the rest with the
// status a client should see: a request line, headers, and a body of Content-Length bytes.
// A chunked request body is refused (411): no completion client sends one.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace meshtrain::net {

struct HttpRequest {
  std::string method, target, path, query;  // target = path [? query]
  int minor_version = 1;                    // HTTP/1.minor
  std::vector<std::pair<std::string, std::string>> headers;  // names lower-cased
  std::string body;
  bool keep_alive = true;       // HTTP/1.1 unless "Connection: close"; 1.0 only if asked
  bool expect_continue = false;  // "Expect: 100-continue": the client waits for a 100

  // The first header named `name` (lower case), or null.
  const std::string* header(std::string_view name) const;
};

struct ParseLimits {
  size_t max_header_bytes = 16 * 1024;   // request line and headers, with the blank line
  size_t max_body_bytes = 1024 * 1024;   // Content-Length
};

enum class ParseState {
  kNeedHeaders,  // the headers are not complete yet
  kNeedBody,     // the headers are in (request filled but for the body); the body is not
  kDone,         // a whole request: `consumed` bytes of the input are its
  kError,        // refuse with `status` (400, 411, 413, 431, 501, 505) and `message`
};

struct ParseResult {
  ParseState state = ParseState::kNeedHeaders;
  size_t consumed = 0;  // kDone: the request's bytes; kNeedBody: the headers' bytes
  size_t body_bytes = 0;  // kNeedBody and kDone: the body's length (Content-Length)
  int status = 0;
  std::string message;
};

// Parses the first request in `in`, the bytes a connection has received so far (more
// requests may follow it: pipelining). Never reads past `in`, never allocates more than the
// limits allow, and gives the same answer however the bytes arrived.
ParseResult parse_request(std::string_view in, const ParseLimits& limits, HttpRequest* out);

// The reason phrase of an HTTP status ("Not Found"); "" for one this server never sends.
const char* status_reason(int status);

}  // namespace meshtrain::net
