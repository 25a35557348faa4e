#include "data/hf_tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/file_io.h"
#include "data/bpe_pipeline.h"
#include "data/byte_text.h"

namespace meshtrain::data {

namespace fs = std::filesystem;
using nlohmann::json;

struct HfTokenizer::Impl {
  BpePipeline pipeline;
};

namespace {

// The largest token id this reader takes. Tables are indexed by id, so one stray huge id
// would allocate gigabytes (a fuzzed file with an id of 269,999,997 asked for 8.6 GB); real
// vocabularies have well under a million tokens.
constexpr int64_t kMaxTokenId = (int64_t{1} << 22) - 1;

std::string id_too_large(const std::string& token, int64_t id) {
  return "id " + std::to_string(id) + " of '" + token + "' is above " + std::to_string(kMaxTokenId) +
         ", the largest token id this reader takes (token ids index its tables)";
}

// GPT-2's pre-tokenization pattern, which ByteLevel's use_regex means.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

Status parse_json(std::string_view text, const std::string& name, json* out) {
  try {
    *out = json::parse(text);
  } catch (const json::parse_error& e) {
    return Status::error(name + ": malformed JSON: " + e.what());
  }
  return Status::ok();
}

std::string type_of(const json& j) { return j.is_object() ? j.value("type", std::string()) : std::string(); }

Status unsupported(const std::string& what, const std::string& type, const std::string& supported) {
  return Status::error(what + " type '" + type + "' is not supported (supported: " + supported + ")");
}

// {"String": "..."} or {"Regex": "..."}.
Status parse_pattern(const json& j, const std::string& what, std::string* literal,
                     std::shared_ptr<const TextRegex>* regex) {
  if (j.is_object() && j.contains("String") && j["String"].is_string()) {
    *literal = j["String"].get<std::string>();
    return Status::ok();
  }
  if (j.is_object() && j.contains("Regex") && j["Regex"].is_string()) {
    return TextRegex::compile(j["Regex"].get<std::string>(), regex).with_context(what);
  }
  return Status::error(what + ": pattern must be {\"String\": ...} or {\"Regex\": ...}");
}

Status parse_normalizer(const json& j, std::vector<NormalizerStep>* steps) {
  if (j.is_null()) return Status::ok();
  using K = NormalizerStep::Kind;
  const std::string type = type_of(j);
  NormalizerStep step{};
  if (type == "Sequence") {
    for (const json& sub : j.value("normalizers", json::array())) RETURN_IF_ERROR(parse_normalizer(sub, steps));
    return Status::ok();
  } else if (type == "NFC") {
    step.kind = K::kNfc;
  } else if (type == "NFD") {
    step.kind = K::kNfd;
  } else if (type == "NFKC") {
    step.kind = K::kNfkc;
  } else if (type == "NFKD") {
    step.kind = K::kNfkd;
  } else if (type == "Lowercase") {
    step.kind = K::kLowercase;
  } else if (type == "Prepend") {
    step.kind = K::kPrepend;
    step.text = j.value("prepend", std::string());
  } else if (type == "Replace") {
    step.kind = K::kReplace;
    RETURN_IF_ERROR(parse_pattern(j.value("pattern", json()), "normalizer Replace", &step.text, &step.regex));
    step.content = j.value("content", std::string());
  } else if (type == "Strip") {
    step.kind = K::kStrip;
    step.left = j.value("strip_left", true);
    step.right = j.value("strip_right", true);
  } else {
    return unsupported("normalizer", type, "NFC, NFD, NFKC, NFKD, Lowercase, Prepend, Replace, Strip, Sequence");
  }
  steps->push_back(std::move(step));
  return Status::ok();
}

Status parse_behavior(const std::string& name, SplitBehavior* out) {
  static const std::pair<const char*, SplitBehavior> kNames[] = {
      {"Removed", SplitBehavior::kRemoved},
      {"Isolated", SplitBehavior::kIsolated},
      {"MergedWithPrevious", SplitBehavior::kMergedWithPrevious},
      {"MergedWithNext", SplitBehavior::kMergedWithNext},
      {"Contiguous", SplitBehavior::kContiguous}};
  for (const auto& [n, b] : kNames) {
    if (name == n) {
      *out = b;
      return Status::ok();
    }
  }
  return Status::error("pre_tokenizer Split: behavior '" + name +
                       "' is not one of Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous");
}

// Metaspace's prepend_scheme, or the older add_prefix_space flag.
PrependScheme prepend_scheme(const json& j) {
  const std::string scheme = j.value("prepend_scheme", std::string());
  if (scheme == "first") return PrependScheme::kFirst;
  if (scheme == "never") return PrependScheme::kNever;
  if (scheme.empty() && !j.value("add_prefix_space", true)) return PrependScheme::kNever;
  return PrependScheme::kAlways;
}

Status parse_pre_tokenizer(const json& j, std::vector<PreTokenizerStep>* steps) {
  if (j.is_null()) return Status::ok();
  using K = PreTokenizerStep::Kind;
  const std::string type = type_of(j);
  PreTokenizerStep step{};
  if (type == "Sequence") {
    for (const json& sub : j.value("pretokenizers", json::array())) RETURN_IF_ERROR(parse_pre_tokenizer(sub, steps));
    return Status::ok();
  } else if (type == "ByteLevel") {
    step.kind = K::kByteLevel;
    step.add_prefix_space = j.value("add_prefix_space", true);
    if (j.value("use_regex", true)) RETURN_IF_ERROR(TextRegex::compile(kGpt2Pattern, &step.regex));
  } else if (type == "Split") {
    step.kind = K::kSplit;
    RETURN_IF_ERROR(parse_pattern(j.value("pattern", json()), "pre_tokenizer Split", &step.literal, &step.regex));
    RETURN_IF_ERROR(parse_behavior(j.value("behavior", std::string("Isolated")), &step.behavior));
    step.invert = j.value("invert", false);
  } else if (type == "Metaspace") {
    step.kind = K::kMetaspace;
    step.replacement = j.value("replacement", std::string("\xE2\x96\x81"));
    step.prepend = prepend_scheme(j);
    step.split = j.value("split", true);
  } else if (type == "Digits") {
    step.kind = K::kDigits;
    step.individual_digits = j.value("individual_digits", false);
  } else {
    return unsupported("pre_tokenizer", type, "ByteLevel, Split, Metaspace, Digits, Sequence");
  }
  if (!steps->empty() && steps->back().kind == K::kByteLevel && step.kind != K::kDigits) {
    return Status::error("pre_tokenizer " + type + " after ByteLevel is not supported (only Digits may follow it)");
  }
  steps->push_back(std::move(step));
  return Status::ok();
}

// The decoder folded into per-token rewriting plus the sequence-start rule.
struct DecoderPlan {
  struct Rewrite {
    std::string from, to;
  };
  bool byte_level = false;
  bool byte_fallback = false;
  std::vector<Rewrite> rewrites;  // in order
  bool strip_leading_space = false;
};

Status parse_decoder(const json& j, DecoderPlan* plan) {
  if (j.is_null()) return Status::ok();
  const std::string type = type_of(j);
  if (type == "Sequence") {
    for (const json& sub : j.value("decoders", json::array())) RETURN_IF_ERROR(parse_decoder(sub, plan));
  } else if (type == "ByteLevel") {
    plan->byte_level = true;
  } else if (type == "ByteFallback") {
    plan->byte_fallback = true;
  } else if (type == "Fuse") {
  } else if (type == "Metaspace") {
    plan->rewrites.push_back({j.value("replacement", std::string("\xE2\x96\x81")), " "});
    if (prepend_scheme(j) != PrependScheme::kNever) plan->strip_leading_space = true;
  } else if (type == "Replace") {
    const json& pattern = j.value("pattern", json());
    if (!pattern.is_object() || !pattern.contains("String") || !pattern["String"].is_string()) {
      return Status::error("decoder Replace: only a {\"String\": ...} pattern is supported");
    }
    plan->rewrites.push_back({pattern["String"].get<std::string>(), j.value("content", std::string())});
  } else if (type == "Strip") {
    if (j.value("content", std::string(" ")) == " " && j.value("start", 0) >= 1) plan->strip_leading_space = true;
  } else {
    return unsupported("decoder", type, "ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip, Sequence");
  }
  return Status::ok();
}

bool parse_byte_token(std::string_view token, int* byte) {  // "<0xNN>"
  if (token.size() != 6 || !token.starts_with("<0x") || token.back() != '>') return false;
  int value = 0;
  for (char c : token.substr(3, 2)) {
    const int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (digit < 0) return false;
    value = value * 16 + digit;
  }
  *byte = value;
  return true;
}

std::string decode_token(const std::string& token, const DecoderPlan& plan,
                         const std::array<int, kByteAlphabetEnd>& byte_of) {
  int byte = 0;
  if (plan.byte_fallback && parse_byte_token(token, &byte)) return std::string(1, char(byte));
  if (plan.byte_level) {
    std::string out;
    for (size_t i = 0; i < token.size();) {
      char32_t cp = 0;
      const size_t n = std::max<size_t>(1, decode_utf8(token, i, &cp));
      if (n > 1 || token[i] >= 0) {
        if (cp < byte_of.size() && byte_of[cp] >= 0) {
          out.push_back(char(byte_of[cp]));
        } else {
          out.append(token, i, n);  // outside the byte alphabet: its own text
        }
      } else {
        out.push_back(token[i]);
      }
      i += n;
    }
    return out;
  }
  std::string out = token;
  for (const auto& r : plan.rewrites) {
    if (r.from.empty()) continue;
    std::string next;
    size_t copied = 0;
    for (size_t hit = out.find(r.from); hit != std::string::npos; hit = out.find(r.from, copied)) {
      next.append(out, copied, hit - copied);
      next += r.to;
      copied = hit + r.from.size();
    }
    next.append(out, copied);
    out.swap(next);
  }
  return out;
}

// Post-processor: which special tokens go around a single sequence.
struct Template {
  std::string bos, eos;  // token names, empty: none
  int bos_id = -1, eos_id = -1;
};

Status parse_post_processor(const json& j, Template* t) {
  if (j.is_null()) return Status::ok();
  const std::string type = type_of(j);
  if (type == "Sequence") {
    for (const json& sub : j.value("processors", json::array())) RETURN_IF_ERROR(parse_post_processor(sub, t));
  } else if (type == "ByteLevel") {
  } else if (type == "TemplateProcessing") {
    bool seen_a = false;
    for (const json& item : j.value("single", json::array())) {
      if (item.contains("Sequence")) {
        seen_a = true;
        continue;
      }
      if (!item.contains("SpecialToken")) continue;
      const std::string name = item["SpecialToken"].value("id", std::string());
      std::string& slot = seen_a ? t->eos : t->bos;
      int& id = seen_a ? t->eos_id : t->bos_id;
      if (!slot.empty()) continue;  // the first one on each side
      slot = name;
      const json& specials = j.value("special_tokens", json::object());
      if (specials.contains(name)) {
        const json& ids = specials[name].value("ids", json::array());
        if (!ids.empty() && ids[0].is_number_integer()) id = ids[0].get<int>();
      }
    }
  } else if (type == "RobertaProcessing" || type == "BertProcessing") {
    const json& cls = j.value("cls", json()), &sep = j.value("sep", json());
    if (cls.is_array() && cls.size() == 2) t->bos = cls[0].get<std::string>(), t->bos_id = cls[1].get<int>();
    if (sep.is_array() && sep.size() == 2) t->eos = sep[0].get<std::string>(), t->eos_id = sep[1].get<int>();
  } else {
    return unsupported("post_processor", type,
                       "TemplateProcessing, RobertaProcessing, BertProcessing, ByteLevel, Sequence");
  }
  return Status::ok();
}

// tokenizer_config.json's bos_token/eos_token: a string, {"content": ...}, or absent/null.
std::string config_token(const json& config, const char* key) {
  if (!config.contains(key)) return {};
  const json& v = config[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return {};
}

std::string describe_merge(const json& merge) {
  return merge.is_string() ? merge.get<std::string>() : merge.dump();
}

class Loader {
 public:
  Loader(BpePipeline* p, TokenizerInfo* info) : p_(*p), info_(*info) {}

  Status load(const json& root, const json* config) {
    if (!root.is_object()) return Status::error("expected a JSON object");
    RETURN_IF_ERROR(parse_normalizer(root.value("normalizer", json()), &p_.normalizers));
    RETURN_IF_ERROR(parse_pre_tokenizer(root.value("pre_tokenizer", json()), &p_.pre_tokenizers));
    p_.byte_level = std::any_of(p_.pre_tokenizers.begin(), p_.pre_tokenizers.end(), [](const PreTokenizerStep& s) {
      return s.kind == PreTokenizerStep::Kind::kByteLevel;
    });
    RETURN_IF_ERROR(load_model(root.value("model", json())));
    DecoderPlan decoder;
    RETURN_IF_ERROR(parse_decoder(root.value("decoder", json()), &decoder));
    RETURN_IF_ERROR(load_added_tokens(root.value("added_tokens", json::array())));
    fill_token_bytes(decoder);
    Template tmpl;
    RETURN_IF_ERROR(parse_post_processor(root.value("post_processor", json()), &tmpl));
    RETURN_IF_ERROR(fill_info(tmpl, config, decoder));
    p_.finish();
    return Status::ok();
  }

  // Errors about tokenizer_config.json are reported against that file.
  bool config_error() const { return config_error_; }

 private:
  Status load_model(const json& model) {
    if (!model.is_object()) return Status::error("no model");
    const std::string type = model.value("type", std::string(model.contains("merges") ? "BPE" : ""));
    if (type != "BPE") return unsupported("model", type, "BPE");
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      if (model.contains(key) && model[key].is_string() && !model[key].get<std::string>().empty()) {
        return Status::error(std::string("model ") + key + " '" + model[key].get<std::string>() + "' is not supported");
      }
    }
    if (model.contains("dropout") && model["dropout"].is_number() && model["dropout"].get<double>() > 0) {
      return Status::error("model dropout is not supported (encoding must be deterministic)");
    }
    p_.fuse_unk = model.value("fuse_unk", false);
    p_.byte_fallback = model.value("byte_fallback", false);
    p_.ignore_merges = model.value("ignore_merges", false);

    const json& vocab = model.value("vocab", json());
    if (!vocab.is_object() || vocab.empty()) return Status::error("model vocab must be a non-empty object");
    const auto byte_of = unicode_to_bytes();
    std::string bytes;
    for (const auto& [token, value] : vocab.items()) {
      if (!value.is_number_integer() || value.get<int64_t>() < 0) {
        return Status::error("model vocab: id of '" + token + "' is not a non-negative integer");
      }
      if (value.get<int64_t>() > kMaxTokenId) return Status::error("model vocab: " + id_too_large(token, value.get<int64_t>()));
      const int id = value.get<int>();
      grow(id);
      if (!vocab_text_[id].empty()) {
        return Status::error("model vocab: id " + std::to_string(id) + " is given to both '" + vocab_text_[id] +
                             "' and '" + token + "'");
      }
      vocab_text_[id] = token;
      id_of_text_.emplace(token, id);
      int byte = 0;
      if (parse_byte_token(token, &byte)) p_.byte_fallback_ids[byte] = id;
      // Byte-level vocabularies are keyed by the raw bytes a token spells.
      if (!p_.byte_level) {
        p_.vocab.emplace(token, BpePipeline::VocabEntry{id});
      } else if (unmap_byte_alphabet(token, byte_of, &bytes)) {
        p_.vocab.emplace(bytes, BpePipeline::VocabEntry{id});
      }
    }
    const json& unk = model.value("unk_token", json());
    if (unk.is_string()) {
      const auto it = id_of_text_.find(unk.get<std::string>());
      if (it == id_of_text_.end()) return Status::error("model unk_token '" + unk.get<std::string>() + "' is not in the vocabulary");
      p_.unk_id = it->second;
    }
    const json& merges = model.value("merges", json::array());
    if (!merges.is_array()) return Status::error("model merges must be an array");
    for (size_t i = 0; i < merges.size(); ++i) {
      const json& m = merges[i];
      std::string left, right;
      if (m.is_string()) {
        const std::string s = m.get<std::string>();
        const size_t space = s.find(' ');
        if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
          return Status::error("model merges[" + std::to_string(i) + "] '" + s + "' is not two tokens separated by one space");
        }
        left = s.substr(0, space), right = s.substr(space + 1);
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        left = m[0].get<std::string>(), right = m[1].get<std::string>();
      } else {
        return Status::error("model merges[" + std::to_string(i) + "] " + m.dump() + " is neither \"a b\" nor [\"a\", \"b\"]");
      }
      const std::string merged = left + right;
      for (const std::string* t : std::initializer_list<const std::string*>{&left, &right, &merged}) {
        if (!id_of_text_.contains(*t)) {
          return Status::error("model merges[" + std::to_string(i) + "] '" + describe_merge(m) + "' (line " +
                               std::to_string(i + 1) + " of the merges) names '" + *t +
                               "', which is not in the vocabulary");
        }
      }
      p_.merges.set(id_of_text_[left], id_of_text_[right], MergeRule{int(i), id_of_text_[merged]});
    }
    return Status::ok();
  }

  Status load_added_tokens(const json& added) {
    if (!added.is_array()) return Status::error("added_tokens must be an array");
    for (const json& t : added) {
      if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer() || !t.contains("content") ||
          !t["content"].is_string()) {
        return Status::error("added_tokens: entry " + t.dump() + " needs an integer id and a string content");
      }
      const int64_t id = t["id"].get<int64_t>();
      const std::string content = t["content"].get<std::string>();
      if (id < 0) {
        return Status::error("added token '" + content + "' has id " + std::to_string(id) + ", which is negative");
      }
      if (id > kMaxTokenId) return Status::error("added_tokens: " + id_too_large(content, id));
      grow(int(id));
      if (!vocab_text_[id].empty() && vocab_text_[id] != content) {
        return Status::error("added token '" + content + "' has id " + std::to_string(id) +
                             ", which the vocabulary gives to '" + vocab_text_[id] + "'");
      }
      vocab_text_[id] = content;
      added_ids_.push_back(int(id));
      id_of_text_.emplace(content, int(id));
      const bool special = t.value("special", false);
      SpecialTokenSpec spec{content, int(id), t.value("lstrip", false), t.value("rstrip", false),
                            t.value("single_word", false)};
      if (special || !t.value("normalized", !special)) {
        p_.raw_specials.add(std::move(spec));
      } else {
        if (!p_.normalizers.empty()) p_.normalize(content, &spec.content);
        p_.normalized_specials.add(std::move(spec));
      }
    }
    return Status::ok();
  }

  void fill_token_bytes(const DecoderPlan& decoder) {
    const auto byte_of = unicode_to_bytes();
    p_.token_bytes.assign(vocab_text_.size(), std::string());
    for (size_t id = 0; id < vocab_text_.size(); ++id) {
      if (!vocab_text_[id].empty()) p_.token_bytes[id] = decode_token(vocab_text_[id], decoder, byte_of);
    }
    for (int id : added_ids_) p_.token_bytes[id] = vocab_text_[id];  // specials decode to their text
  }

  Status resolve(const std::string& name, const char* key, int* id) {
    const auto it = id_of_text_.find(name);
    if (it == id_of_text_.end()) {
      config_error_ = true;
      return Status::error(std::string(key) + " '" + name + "' is not a token of the tokenizer");
    }
    *id = it->second;
    return Status::ok();
  }

  Status fill_info(const Template& tmpl, const json* config, const DecoderPlan& decoder) {
    info_.format = "hf-bpe";
    info_.bos_id = tmpl.bos_id >= 0 || tmpl.bos.empty() ? tmpl.bos_id : lookup(tmpl.bos);
    info_.eos_id = tmpl.eos_id >= 0 || tmpl.eos.empty() ? tmpl.eos_id : lookup(tmpl.eos);
    info_.add_bos = info_.bos_id >= 0;
    info_.add_eos = info_.eos_id >= 0;
    if (config != nullptr) {
      if (const std::string bos = config_token(*config, "bos_token"); !bos.empty()) {
        RETURN_IF_ERROR(resolve(bos, "bos_token", &info_.bos_id));
      }
      if (const std::string eos = config_token(*config, "eos_token"); !eos.empty()) {
        RETURN_IF_ERROR(resolve(eos, "eos_token", &info_.eos_id));
      }
      if (config->contains("add_bos_token") && (*config)["add_bos_token"].is_boolean()) {
        info_.add_bos = (*config)["add_bos_token"].get<bool>();
      }
      if (config->contains("add_eos_token") && (*config)["add_eos_token"].is_boolean()) {
        info_.add_eos = (*config)["add_eos_token"].get<bool>();
      }
    }
    info_.strip_leading_space = decoder.strip_leading_space;
    info_.longest_token_bytes = 1;
    for (const std::string& b : p_.token_bytes) info_.longest_token_bytes = std::max<int>(info_.longest_token_bytes, int(b.size()));
    return Status::ok();
  }

  int lookup(const std::string& text) const {
    const auto it = id_of_text_.find(text);
    return it == id_of_text_.end() ? -1 : it->second;
  }

  void grow(int id) {
    if (size_t(id) >= vocab_text_.size()) vocab_text_.resize(size_t(id) + 1);
  }

  BpePipeline& p_;
  TokenizerInfo& info_;
  std::vector<std::string> vocab_text_;  // id -> token as spelt in the file
  std::unordered_map<std::string, int> id_of_text_;
  std::vector<int> added_ids_;
  bool config_error_ = false;
};

}  // namespace

Status HfTokenizer::from_strings(std::string_view tokenizer_json, std::string_view config_json,
                                 const std::string& json_name, const std::string& config_name, HfTokenizer* out) {
  json root, config;
  RETURN_IF_ERROR(parse_json(tokenizer_json, json_name, &root));
  const bool has_config = !config_json.empty();
  if (has_config) {
    RETURN_IF_ERROR(parse_json(config_json, config_name, &config));
    if (!config.is_object()) return Status::error(config_name + ": expected a JSON object");
  }
  auto impl = std::make_shared<Impl>();
  HfTokenizer tok;
  Loader loader(&impl->pipeline, &tok.info_);
  try {
    const Status st = loader.load(root, has_config ? &config : nullptr);
    if (!st.is_ok()) return Status::error((loader.config_error() ? config_name : json_name) + ": " + st.message());
  } catch (const json::exception& e) {  // a field of an unexpected JSON type
    return Status::error(json_name + ": unexpected JSON: " + e.what());
  }
  tok.impl_ = std::move(impl);
  *out = std::move(tok);
  return Status::ok();
}

bool HfTokenizer::files_in(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) return fs::is_regular_file(fs::path(path) / "tokenizer.json", ec);
  return fs::is_regular_file(path, ec) && fs::path(path).extension() == ".json";
}

Status HfTokenizer::load(const std::string& path, HfTokenizer* out) {
  std::error_code ec;
  const fs::path json_path = fs::is_directory(path, ec) ? fs::path(path) / "tokenizer.json" : fs::path(path);
  const fs::path config_path = json_path.parent_path() / "tokenizer_config.json";
  std::string text, config_text;
  RETURN_IF_ERROR(read_file(json_path.string(), &text));
  const bool has_config = fs::is_regular_file(config_path, ec);
  if (has_config) RETURN_IF_ERROR(read_file(config_path.string(), &config_text));
  if (has_config && config_text.empty()) return Status::error(config_path.string() + ": empty file");
  HfTokenizer tok;
  RETURN_IF_ERROR(from_strings(text, config_text, json_path.string(), config_path.string(), &tok));
  const fs::path absolute = fs::absolute(json_path).lexically_normal();
  tok.info_.name = absolute.parent_path().filename().string();
  tok.source_files_ = {absolute.string()};
  if (has_config) tok.source_files_.push_back(fs::absolute(config_path).lexically_normal().string());
  *out = std::move(tok);
  return Status::ok();
}

std::vector<int> HfTokenizer::encode(std::string_view text) const {
  std::vector<int> ids;
  ids.reserve(text.size() / 4 + 4);
  impl_->pipeline.encode(text, &ids);
  return ids;
}

std::string_view HfTokenizer::token_bytes(int id) const { return impl_->pipeline.token_bytes[size_t(id)]; }
int HfTokenizer::vocab_size() const { return int(impl_->pipeline.token_bytes.size()); }
bool HfTokenizer::byte_level() const { return impl_->pipeline.byte_level; }

}  // namespace meshtrain::data
