#include "net/http_request.h"

#include <algorithm>
#include <cctype>
#include <limits>

namespace meshtrain::net {

namespace {

constexpr size_t kMaxHeaders = 100;

// RFC 9110's tchar: what a method or a header name may be made of.
bool is_token_char(unsigned char c) {
  if (std::isalnum(c)) return true;
  return std::string_view("!#$%&'*+-.^_`|~").find((char)c) != std::string_view::npos;
}

bool is_token(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return is_token_char((unsigned char)c); });
}

// A header value may hold tabs and visible bytes (obs-text included), never other controls.
bool is_field_value(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) {
    const unsigned char u = (unsigned char)c;
    return u == '\t' || (u >= 0x20 && u != 0x7f);
  });
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = (char)std::tolower((unsigned char)c);
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

ParseResult failure(int status, std::string message) {
  ParseResult r;
  r.state = ParseState::kError;
  r.status = status;
  r.message = std::move(message);
  return r;
}

// The next line of `in` from `*at` (its "\r\n" or "\n" dropped), or false if none ends yet.
bool next_line(std::string_view in, size_t* at, std::string_view* line) {
  const size_t end = in.find('\n', *at);
  if (end == std::string_view::npos) return false;
  *line = in.substr(*at, end - *at);
  if (!line->empty() && line->back() == '\r') line->remove_suffix(1);
  *at = end + 1;
  return true;
}

// "METHOD /target HTTP/1.x" into `out`.
ParseResult parse_request_line(std::string_view line, HttpRequest* out) {
  const size_t sp1 = line.find(' ');
  const size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos || line.find(' ', sp2 + 1) != std::string_view::npos)
    return failure(400, "the request line must be 'METHOD /path HTTP/1.1'");
  const std::string_view method = line.substr(0, sp1), target = line.substr(sp1 + 1, sp2 - sp1 - 1),
                         version = line.substr(sp2 + 1);
  if (!is_token(method)) return failure(400, "the request's method is not a token");
  if (target.empty() || target.front() != '/' || !is_field_value(target) || target.find('\t') != std::string_view::npos)
    return failure(400, "the request's target must be a path beginning with '/'");
  if (version.size() != 8 || !version.starts_with("HTTP/") || !std::isdigit((unsigned char)version[5]) ||
      version[6] != '.' || !std::isdigit((unsigned char)version[7]))
    return failure(400, "the request line must end with the HTTP version, such as HTTP/1.1");
  if (version[5] != '1') return failure(505, "only HTTP/1.0 and HTTP/1.1 are served");
  out->method = method;
  out->target = target;
  const size_t q = target.find('?');
  out->path = target.substr(0, q);
  out->query = q == std::string_view::npos ? "" : std::string(target.substr(q + 1));
  out->minor_version = version[7] - '0';
  out->keep_alive = out->minor_version >= 1;
  return {};
}

// Content-Length's decimal digits, or -1 if it is not a number. More than 18 digits (which
// could overflow) is a number over any limit: the largest long long stands for it.
long long content_length_of(std::string_view v) {
  if (v.empty() || !std::all_of(v.begin(), v.end(), [](char c) { return std::isdigit((unsigned char)c); })) return -1;
  if (v.size() > 18) return std::numeric_limits<long long>::max();
  long long n = 0;
  for (char c : v) n = n * 10 + (c - '0');
  return n;
}

// The headers that change how the request is read: Content-Length, Transfer-Encoding,
// Connection and Expect.
ParseResult read_framing(const ParseLimits& limits, HttpRequest* out, size_t* body_bytes) {
  long long length = 0;
  bool have_length = false;
  for (const auto& [name, value] : out->headers) {
    if (name == "content-length") {
      const long long n = content_length_of(value);
      if (n < 0) return failure(400, "Content-Length must be a decimal number");
      if (have_length && n != length) return failure(400, "two different Content-Length headers");
      length = n, have_length = true;
    } else if (name == "transfer-encoding") {
      return failure(411, "send the body with a Content-Length (chunked request bodies are not read)");
    } else if (name == "connection") {
      const std::string v = lower(value);
      if (v.find("close") != std::string::npos) out->keep_alive = false;
      else if (v.find("keep-alive") != std::string::npos) out->keep_alive = true;
    } else if (name == "expect") {
      out->expect_continue = lower(value) == "100-continue";
    }
  }
  if ((unsigned long long)length > limits.max_body_bytes)
    return failure(413, "the request body of " + std::to_string(length) + " bytes is over this server's limit of " +
                            std::to_string(limits.max_body_bytes) + " bytes (--max-request-bytes)");
  *body_bytes = (size_t)length;
  return {};
}

}  // namespace

const std::string* HttpRequest::header(std::string_view name) const {
  for (const auto& [n, v] : headers)
    if (n == name) return &v;
  return nullptr;
}

ParseResult parse_request(std::string_view in, const ParseLimits& limits, HttpRequest* out) {
  *out = HttpRequest();
  size_t at = 0;
  // A server should ignore empty lines before a request line (RFC 9112 2.2).
  while (at < in.size() && at < 8 && (in[at] == '\r' || in[at] == '\n')) at++;
  const std::string_view head = in.substr(0, std::min(in.size(), limits.max_header_bytes));
  std::string_view line;
  if (!next_line(head, &at, &line)) {
    if (in.size() >= limits.max_header_bytes) return failure(431, "the request line is over the header limit");
    return {};
  }
  if (ParseResult r = parse_request_line(line, out); r.state == ParseState::kError) return r;
  for (;;) {
    if (!next_line(head, &at, &line)) {
      if (in.size() >= limits.max_header_bytes)
        return failure(431, "the request's headers are over " + std::to_string(limits.max_header_bytes) + " bytes");
      return {};
    }
    if (line.empty()) break;
    if (line.front() == ' ' || line.front() == '\t') return failure(400, "folded header lines are not accepted");
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos || !is_token(line.substr(0, colon)))
      return failure(400, "a header line must be 'Name: value'");
    const std::string_view value = trim(line.substr(colon + 1));
    if (!is_field_value(value)) return failure(400, "a header's value holds control characters");
    if (out->headers.size() == kMaxHeaders)
      return failure(431, "more than " + std::to_string(kMaxHeaders) + " headers");
    out->headers.emplace_back(lower(line.substr(0, colon)), std::string(value));
  }
  size_t body_bytes = 0;
  ParseResult r = read_framing(limits, out, &body_bytes);
  if (r.state == ParseState::kError) return r;
  r.body_bytes = body_bytes;
  r.consumed = at;
  if (in.size() - at < r.body_bytes) {
    r.state = ParseState::kNeedBody;
    return r;
  }
  out->body = in.substr(at, r.body_bytes);
  r.consumed = at + r.body_bytes;
  r.state = ParseState::kDone;
  return r;
}

const char* status_reason(int status) {
  switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 411: return "Length Required";
    case 413: return "Content Too Large";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "";
  }
}

}  // namespace meshtrain::net
