// What `meshtrain serve` counts, for GET /metrics in Prometheus's text format (version
// 0.0.4), as vLLM and TGI expose theirs: requests by status, tokens in and out, the decode
// rate, the queue, and latency quantiles. Thread-safe: every handler thread records into it.
#pragma once
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "net/http_server.h"

namespace meshtrain::cli {

class ServeMetrics {
 public:
  // One answered request: its status (499: the client left first) and how long it took.
  // Latencies are kept for completions only, over the last kWindow of them.
  void request(int status, double seconds, bool completion);
  void tokens(int64_t prompt, int64_t generated);
  // The exposition: these counters, the batching loop's (BatchLoop::stats()) and the HTTP
  // server's (its connections, queue and own refusals: 408, 413, 431, 503).
  std::string prometheus(const nlohmann::json& loop, const net::ServerStats& http);

  static constexpr size_t kWindow = 1000;

 private:
  std::mutex mu_;
  std::map<int, int64_t> by_status_;
  int64_t prompt_tokens_ = 0, generated_tokens_ = 0, completions_ = 0;
  double latency_sum_ = 0;
  std::vector<double> latencies_;  // a ring of the last kWindow
  size_t next_ = 0;
};

}  // namespace meshtrain::cli
