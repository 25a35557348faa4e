#include "cli/serve_request.h"

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "core/text.h"

namespace meshtrain::cli {

namespace {

using nlohmann::json;

// The fields read into the request.
const std::vector<std::string_view> kReadFields = {"prompt", "max_tokens", "temperature", "top_p", "top_k",
                                                   "seed",   "stop",       "logprobs",    "stream"};
// Sent by OpenAI's clients, changing nothing here.
const std::vector<std::string_view> kIgnoredFields = {"model", "user"};
// OpenAI's fields this server does not implement: accepted at the value that means "off".
struct NoOpField {
  std::string_view name;
  json off;
  std::string_view why;
};
const std::vector<NoOpField>& no_op_fields() {
  static const std::vector<NoOpField> fields = {
      {"n", 1, "one choice per prompt"},           {"best_of", 1, "one choice per prompt"},
      {"echo", false, "the prompt is not echoed"}, {"presence_penalty", 0, "no penalties"},
      {"frequency_penalty", 0, "no penalties"},    {"logit_bias", json::object(), "no logit bias"},
      {"suffix", nullptr, "no suffix"}};
  return fields;
}

std::vector<std::string_view> known_fields() {
  std::vector<std::string_view> all = kReadFields;
  all.insert(all.end(), kIgnoredFields.begin(), kIgnoredFields.end());
  for (const NoOpField& f : no_op_fields()) all.push_back(f.name);
  return all;
}

// Every field is one this server knows, and those it does not implement are off.
Status check_fields(const json& body) {
  const std::vector<std::string_view> known = known_fields();
  for (const auto& [key, value] : body.items()) {
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      const std::string near = nearest_name(key, known);
      return Status::error("unknown field '" + key + "'" + (near.empty() ? "" : " (did you mean '" + near + "'?)"));
    }
    for (const NoOpField& f : no_op_fields())
      if (key == f.name && !value.is_null() && value != f.off && !(f.off.is_object() && value.empty()))
        return Status::error("'" + key + "' other than " + f.off.dump() + " is not supported (" + std::string(f.why) +
                             "), got " + value.dump());
  }
  return Status::ok();
}

// Field `key` of `body`, a string or a list of strings, appended to `out`.
Status strings_of(const json& body, const char* key, std::vector<std::string>* out) {
  const json& v = body[key];
  const Status wrong = Status::error(std::string("'") + key + "' must be a string or a list of strings");
  if (v.is_string()) {
    out->push_back(v.get<std::string>());
    return Status::ok();
  }
  if (!v.is_array()) return wrong;
  for (const json& x : v) {
    if (!x.is_string()) return wrong;
    out->push_back(x.get<std::string>());
  }
  return Status::ok();
}

template <typename T>
Status integer_field(const json& body, const char* key, int64_t lo, int64_t hi, T* v) {
  if (!body.contains(key) || body[key].is_null()) return Status::ok();
  if (!body[key].is_number_integer())
    return Status::error(std::string("'") + key + "' must be an integer, got " + body[key].dump());
  const int64_t x = body[key].get<int64_t>();
  if (x < lo || x > hi)
    return Status::error(std::string("'") + key + "' must be in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                         "], got " + std::to_string(x));
  *v = static_cast<T>(x);
  return Status::ok();
}

Status number_field(const json& body, const char* key, float* v) {
  if (!body.contains(key) || body[key].is_null()) return Status::ok();
  if (!body[key].is_number()) return Status::error(std::string("'") + key + "' must be a number, got " + body[key].dump());
  *v = body[key].get<float>();
  return Status::ok();
}

}  // namespace

std::string nearest_name(std::string_view name, const std::vector<std::string_view>& known) {
  if (name.size() > 64) return "";  // no field is that long, and the distance is quadratic
  std::string best;
  size_t best_distance = std::min<size_t>(3, std::max<size_t>(1, name.size() / 3)) + 1;
  for (std::string_view k : known)
    if (const size_t d = edit_distance(std::string(name), std::string(k)); d < best_distance)
      best = k, best_distance = d;
  return best;
}

Status parse_completion_body(const json& body, std::vector<CompletionRequest>* out, bool* stream) {
  if (!body.is_object()) return Status::error("the request body must be a JSON object");
  RETURN_IF_ERROR(check_fields(body));
  std::vector<std::string> prompts;
  if (!body.contains("prompt")) return Status::error("'prompt' is required");
  RETURN_IF_ERROR(strings_of(body, "prompt", &prompts));
  if (prompts.empty()) return Status::error("'prompt' must be a string or a non-empty list of strings");
  CompletionRequest r;
  RETURN_IF_ERROR(integer_field(body, "max_tokens", 0, 1 << 20, &r.max_tokens));
  RETURN_IF_ERROR(integer_field(body, "top_k", 0, 1 << 30, &r.sampling.top_k));
  RETURN_IF_ERROR(integer_field(body, "seed", 0, INT64_MAX, &r.seed));
  RETURN_IF_ERROR(integer_field(body, "logprobs", 0, 20, &r.logprobs));
  RETURN_IF_ERROR(number_field(body, "temperature", &r.sampling.temperature));
  RETURN_IF_ERROR(number_field(body, "top_p", &r.sampling.top_p));
  if (body.contains("stop") && !body["stop"].is_null()) RETURN_IF_ERROR(strings_of(body, "stop", &r.stop));
  *stream = false;
  if (body.contains("stream") && !body["stream"].is_null()) {
    if (!body["stream"].is_boolean()) return Status::error("'stream' must be true or false");
    *stream = body["stream"].get<bool>();
  }
  if (*stream && prompts.size() > 1) return Status::error("'stream' takes a single prompt");
  for (const std::string& text : prompts) {
    out->push_back(r);
    out->back().prompt = text;
  }
  return Status::ok();
}

}  // namespace meshtrain::cli
