#include "cli/serve_metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace meshtrain::cli {

namespace {

// One metric's help and type lines, then its samples.
void metric(std::string* out, const char* name, const char* type, const char* help,
            const std::vector<std::pair<std::string, double>>& samples) {
  *out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
  for (const auto& [labels, value] : samples) {
    char number[64];
    std::snprintf(number, sizeof number, "%.17g", value);
    *out += name + labels + " " + number + "\n";
  }
}

// The q-quantile of sorted values by the nearest rank.
double quantile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  const size_t rank = (size_t)std::max(0.0, std::ceil(q * (double)sorted.size()) - 1);
  return sorted[std::min(rank, sorted.size() - 1)];
}

}  // namespace

void ServeMetrics::request(int status, double seconds, bool completion) {
  std::lock_guard<std::mutex> lock(mu_);
  by_status_[status]++;
  if (!completion) return;
  completions_++;
  latency_sum_ += seconds;
  if (latencies_.size() < kWindow) latencies_.push_back(seconds);
  else latencies_[next_] = seconds;
  next_ = (next_ + 1) % kWindow;
}

void ServeMetrics::tokens(int64_t prompt, int64_t generated) {
  std::lock_guard<std::mutex> lock(mu_);
  prompt_tokens_ += prompt;
  generated_tokens_ += generated;
}

std::string ServeMetrics::prometheus(const nlohmann::json& loop, const net::ServerStats& http) {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<int, int64_t> statuses = by_status_;
  for (const auto& [status, count] : http.refused) statuses[status] += count;
  statuses[503] += http.refused_busy;
  std::vector<std::pair<std::string, double>> requests;
  for (const auto& [status, count] : statuses) requests.push_back({"{code=\"" + std::to_string(status) + "\"}", (double)count});
  std::vector<double> sorted = latencies_;
  std::sort(sorted.begin(), sorted.end());
  const double busy = loop.value("busy_seconds", 0.0);
  std::string out;
  metric(&out, "meshtrain_requests_total", "counter",
         "HTTP requests answered, by status (499: the client left before its answer)", requests);
  metric(&out, "meshtrain_prompt_tokens_total", "counter", "Prompt tokens of completions", {{"", (double)prompt_tokens_}});
  metric(&out, "meshtrain_generation_tokens_total", "counter", "Tokens generated (those of clients that left included)",
         {{"", (double)generated_tokens_}});
  metric(&out, "meshtrain_generation_tokens_per_second", "gauge",
         "Tokens generated per second of decoding (the batching loop's busy time)",
         {{"", busy > 0 ? (double)generated_tokens_ / busy : 0.0}});
  metric(&out, "meshtrain_request_latency_seconds", "summary",
         "Completion latency, request in to answer out (quantiles over the last 1000)",
         {{"{quantile=\"0.5\"}", quantile(sorted, 0.5)},
          {"{quantile=\"0.9\"}", quantile(sorted, 0.9)},
          {"{quantile=\"0.99\"}", quantile(sorted, 0.99)}});
  out += "meshtrain_request_latency_seconds_sum " + std::to_string(latency_sum_) + "\n";
  out += "meshtrain_request_latency_seconds_count " + std::to_string(completions_) + "\n";
  metric(&out, "meshtrain_sequences_running", "gauge", "Sequences in the decode batch", {{"", loop.value("running", 0.0)}});
  metric(&out, "meshtrain_sequences_waiting", "gauge", "Sequences waiting to join the batch",
         {{"", loop.value("waiting", 0.0)}});
  metric(&out, "meshtrain_requests_queued", "gauge", "Whole HTTP requests waiting for a handler thread",
         {{"", (double)http.queued}});
  metric(&out, "meshtrain_requests_in_flight", "gauge", "HTTP requests in a handler", {{"", (double)http.in_flight}});
  metric(&out, "meshtrain_connections", "gauge", "Open HTTP connections", {{"", (double)http.connections}});
  metric(&out, "meshtrain_decode_steps_total", "counter", "Decode steps of the batching loop",
         {{"", loop.value("steps", 0.0)}});
  return out;
}

}  // namespace meshtrain::cli
