// The bytes a connection received: net::parse_request, as `meshtrain serve` calls it after
// every read. Promises checked: it never reads past the input (ASan), a whole request
// consumes no more than the input and its body is Content-Length bytes within the limit,
// a refusal carries a status and a reason, and the answer is the same for the input cut
// anywhere before the request ends (a request split across reads reads the same).
#include <string>

#include "fuzz_util.h"
#include "net/http_request.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace meshtrain;
  const std::string_view in = fuzz::as_text(data, size);
  const net::ParseLimits limits{512, 4096};
  net::HttpRequest req;
  const net::ParseResult r = net::parse_request(in, limits, &req);
  switch (r.state) {
    case net::ParseState::kDone: {
      if (r.consumed > size || r.body_bytes != req.body.size() || req.body.size() > limits.max_body_bytes)
        fuzz::broken_promise("a whole request of " + std::to_string(r.consumed) + " bytes from " + std::to_string(size));
      if (req.path.empty() || req.path[0] != '/') fuzz::broken_promise("a path not beginning with '/'");
      // The same request, whatever follows it.
      net::HttpRequest again;
      const net::ParseResult alone = net::parse_request(in.substr(0, r.consumed), limits, &again);
      if (alone.state != net::ParseState::kDone || alone.consumed != r.consumed || again.body != req.body)
        fuzz::broken_promise("the request read differently without what follows it");
      // Cut short, it asks for more.
      const net::ParseResult cut = net::parse_request(in.substr(0, r.consumed - 1), limits, &again);
      if (cut.state == net::ParseState::kDone) fuzz::broken_promise("a request cut short was read whole");
      break;
    }
    case net::ParseState::kError:
      if (r.status < 400 || r.status > 505 || r.message.empty()) fuzz::broken_promise("a refusal without status or reason");
      break;
    case net::ParseState::kNeedBody:
      if (r.consumed > size || size - r.consumed >= r.body_bytes) fuzz::broken_promise("asks for a body it has");
      break;
    case net::ParseState::kNeedHeaders:
      if (size >= limits.max_header_bytes) fuzz::broken_promise("waits for headers past the limit");
      break;
  }
  return 0;
}
