#include "model/config_json.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <utility>

namespace meshtrain::model {

using json = nlohmann::json;

json config_json(const GptConfig& c) {
  json j = {{"layers", c.layers}, {"heads", c.heads}, {"dim", c.dim}, {"max_seq_len", c.max_seq_len},
            {"vocab", c.vocab}, {"arch", arch_name(c)}, {"kv_heads", c.kv_head_count()}, {"ffn_dim", c.ffn()},
            {"norm", c.norm == Norm::kRmsNorm ? "rmsnorm" : "layernorm"}, {"norm_eps", c.norm_eps},
            {"positions", c.positions == Positions::kRope ? "rope" : "learned"}, {"rope_theta", c.rope_theta},
            {"mlp", c.mlp == Mlp::kSwiGlu ? "swiglu" : "gelu"}, {"bias", c.bias}, {"tied_head", c.tied_head}};
  if (c.rope_scaling.factor > 0)
    j["rope_scaling"] = {{"factor", c.rope_scaling.factor},
                         {"low_freq_factor", c.rope_scaling.low_freq_factor},
                         {"high_freq_factor", c.rope_scaling.high_freq_factor},
                         {"original_positions", c.rope_scaling.original_positions}};
  if (c.is_moe())
    j["moe"] = {{"experts", c.moe.experts}, {"top_k", c.moe.top_k}, {"every", c.moe.every},
                {"shared_experts", c.moe.shared_experts}, {"expert_ffn", c.expert_ffn()},
                {"score", c.moe.score == MoeScore::kSigmoid ? "sigmoid" : "softmax"},
                {"renormalize", c.moe.renormalize}};
  return j;
}

namespace {

Status wrong(const std::string& at, const char* key, const char* want) {
  return Status::error(at + "." + key + " must be " + want);
}

Status read_int(const json& m, const std::string& at, const char* key, int lo, int* out) {
  if (!m.contains(key)) return Status::ok();
  const json& v = m[key];
  if (!v.is_number_integer() || v.get<int64_t>() < lo || v.get<int64_t>() > (1 << 30))
    return wrong(at, key, lo == 0 ? "an integer >= 0" : "a positive integer");
  *out = (int)v.get<int64_t>();
  return Status::ok();
}

Status read_number(const json& m, const std::string& at, const char* key, double* out) {
  if (!m.contains(key)) return Status::ok();
  const json& v = m[key];
  if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() <= 0) return wrong(at, key, "a positive number");
  *out = v.get<double>();
  return Status::ok();
}

Status read_bool(const json& m, const std::string& at, const char* key, bool* out) {
  if (!m.contains(key)) return Status::ok();
  if (!m[key].is_boolean()) return wrong(at, key, "true or false");
  *out = m[key].get<bool>();
  return Status::ok();
}

// A string member that must be one of two names, setting *out to the first's or second's value.
template <typename E>
Status read_choice(const json& m, const std::string& at, const char* key, const char* a, E va, const char* b, E vb,
                   E* out) {
  if (!m.contains(key)) return Status::ok();
  const json& v = m[key];
  if (v.is_string() && v.get<std::string>() == a) return *out = va, Status::ok();
  if (v.is_string() && v.get<std::string>() == b) return *out = vb, Status::ok();
  return wrong(at, key, (std::string("\"") + a + "\" or \"" + b + "\"").c_str());
}

}  // namespace

Status read_architecture(const json& m, const std::string& at, GptConfig* c) {
  if (!m.is_object()) return Status::error(at + " must be an object");
  RETURN_IF_ERROR(read_int(m, at, "kv_heads", 0, &c->kv_heads));
  RETURN_IF_ERROR(read_int(m, at, "ffn_dim", 0, &c->ffn_dim));
  RETURN_IF_ERROR(read_choice(m, at, "norm", "layernorm", Norm::kLayerNorm, "rmsnorm", Norm::kRmsNorm, &c->norm));
  double eps = c->norm_eps;
  RETURN_IF_ERROR(read_number(m, at, "norm_eps", &eps));
  c->norm_eps = (float)eps;
  RETURN_IF_ERROR(read_choice(m, at, "positions", "learned", Positions::kLearned, "rope", Positions::kRope,
                              &c->positions));
  RETURN_IF_ERROR(read_number(m, at, "rope_theta", &c->rope_theta));
  RETURN_IF_ERROR(read_choice(m, at, "mlp", "gelu", Mlp::kGelu, "swiglu", Mlp::kSwiGlu, &c->mlp));
  RETURN_IF_ERROR(read_bool(m, at, "bias", &c->bias));
  RETURN_IF_ERROR(read_bool(m, at, "tied_head", &c->tied_head));
  if (m.contains("rope_scaling")) {
    const json& s = m["rope_scaling"];
    const std::string where = at + ".rope_scaling";
    if (!s.is_object()) return Status::error(where + " must be an object");
    kernels::RopeScaling r;
    RETURN_IF_ERROR(read_number(s, where, "factor", &r.factor));
    RETURN_IF_ERROR(read_number(s, where, "low_freq_factor", &r.low_freq_factor));
    RETURN_IF_ERROR(read_number(s, where, "high_freq_factor", &r.high_freq_factor));
    RETURN_IF_ERROR(read_int(s, where, "original_positions", 1, &r.original_positions));
    if (!(r.high_freq_factor > r.low_freq_factor))
      return Status::error(where + ": high_freq_factor must exceed low_freq_factor");
    c->rope_scaling = r;
  }
  if (m.contains("moe")) {
    const json& e = m["moe"];
    const std::string where = at + ".moe";
    if (!e.is_object()) return Status::error(where + " must be an object");
    MoeConfig moe;
    RETURN_IF_ERROR(read_int(e, where, "experts", 1, &moe.experts));
    RETURN_IF_ERROR(read_int(e, where, "top_k", 1, &moe.top_k));
    RETURN_IF_ERROR(read_int(e, where, "every", 1, &moe.every));
    RETURN_IF_ERROR(read_int(e, where, "shared_experts", 0, &moe.shared_experts));
    RETURN_IF_ERROR(read_int(e, where, "expert_ffn", 1, &moe.expert_ffn));
    RETURN_IF_ERROR(read_choice(e, where, "score", "softmax", MoeScore::kSoftmax, "sigmoid", MoeScore::kSigmoid,
                                &moe.score));
    RETURN_IF_ERROR(read_bool(e, where, "renormalize", &moe.renormalize));
    if (!e.contains("experts")) return Status::error(where + ".experts is missing");
    c->moe = moe;
  }
  return Status::ok();
}

bool same_model(const GptConfig& a, const GptConfig& b) { return config_json(a) == config_json(b); }

namespace {

// The record's keys that a train flag sets; the others (norm, positions, ...) come with
// --model or --arch and are named as they are.
constexpr std::pair<const char*, const char*> kKeyFlags[] = {
    {"layers", "--layers"},         {"heads", "--heads"},
    {"dim", "--dim"},               {"max_seq_len", "--seq-len"},
    {"vocab", "--vocab"},           {"arch", "--arch"},
    {"kv_heads", "--kv-heads"},     {"ffn_dim", "--ffn-dim"},
    {"rope_theta", "--rope-theta"}, {"moe.experts", "--moe-experts"},
    {"moe.top_k", "--moe-top-k"},   {"moe.every", "--moe-every"},
    {"moe.shared_experts", "--moe-shared-experts"}, {"moe.expert_ffn", "--moe-ffn-dim"},
    {"moe.score", "--moe-score"},   {"moe.renormalize", "--moe-renormalize"}};

// config_json's fields as "key" or "object.key"; a dense model's moe is {experts: 0} and
// an unscaled RoPE's rope_scaling {factor: 0}, so that one line says that one side has none.
std::vector<std::pair<std::string, json>> flat_fields(const GptConfig& c) {
  json j = config_json(c);
  if (!j.contains("moe")) j["moe"] = {{"experts", 0}};
  if (!j.contains("rope_scaling")) j["rope_scaling"] = {{"factor", 0}};
  std::vector<std::pair<std::string, json>> out;
  for (const auto& [key, value] : j.items())
    if (value.is_object())
      for (const auto& [sub, v] : value.items()) out.emplace_back(key + "." + sub, v);
    else
      out.emplace_back(key, value);
  return out;
}

// A width both models derive from a field that is itself compared.
bool derived_in_both(const std::string& key, const GptConfig& run, const GptConfig& saved) {
  if (key == "ffn_dim") return run.ffn_dim == 0 && saved.ffn() == 4 * saved.dim;
  if (key == "kv_heads") return run.kv_heads == 0 && saved.kv_head_count() == saved.heads;
  if (key == "moe.expert_ffn") return run.moe.expert_ffn == 0 && saved.expert_ffn() == saved.ffn();
  return false;
}

std::string shown(const json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

}  // namespace

std::vector<std::string> model_differences(const GptConfig& run, const GptConfig& saved) {
  const auto ours = flat_fields(run), theirs = flat_fields(saved);
  std::vector<std::pair<int, std::string>> lines;  // ordered as kKeyFlags, then the rest
  for (const auto& field : ours) {
    // (Not a structured binding: clang, which builds the fuzz targets, cannot capture one.)
    const auto& key = field.first;
    const auto& value = field.second;
    auto other = std::find_if(theirs.begin(), theirs.end(), [&](const auto& t) { return t.first == key; });
    if (other == theirs.end() || other->second == value || derived_in_both(key, run, saved)) continue;
    int order = (int)std::size(kKeyFlags);
    std::string name = key;
    for (int i = 0; i < (int)std::size(kKeyFlags); i++)
      if (key == kKeyFlags[i].first) order = i, name = kKeyFlags[i].second;
    lines.emplace_back(order, name + " " + shown(value) + " differs from the checkpoint's " + shown(other->second));
  }
  std::stable_sort(lines.begin(), lines.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::string> out;
  for (auto& l : lines) out.push_back(std::move(l.second));
  return out;
}

}  // namespace meshtrain::model
