#include "data/bpe.h"

#include <unicode/uchar.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/check.h"
#include "data/byte_text.h"

namespace meshtrain::data {
namespace {

constexpr std::string_view kEndOfText = "<|endoftext|>";

// ---------------------------------------------------------------------------------
// Pre-tokenization: a hand-written matcher for GPT-2's pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// with \s = Unicode White_Space, as in Python's `regex` module that encoder.py uses.

enum class CharClass : uint8_t { kLetter, kNumber, kSpace, kOther };

CharClass classify_with_icu(char32_t cp) {
  if (u_isUWhiteSpace(UChar32(cp))) return CharClass::kSpace;
  const uint32_t mask = U_GET_GC_MASK(UChar32(cp));
  if (mask & U_GC_L_MASK) return CharClass::kLetter;
  if (mask & U_GC_N_MASK) return CharClass::kNumber;
  return CharClass::kOther;
}

// Latin-1 is by far the most common input; a table avoids the ICU lookups for it.
// Built from ICU itself so both paths agree by construction.
const std::array<CharClass, 256>& latin1_classes() {
  static const std::array<CharClass, 256> table = [] {
    std::array<CharClass, 256> t{};
    for (int c = 0; c < 256; ++c) t[c] = classify_with_icu(char32_t(c));
    return t;
  }();
  return table;
}

struct CharInfo {
  size_t length;  // bytes
  CharClass cls;
};

CharInfo char_at(std::string_view text, size_t pos) {
  const auto b0 = static_cast<unsigned char>(text[pos]);
  if (b0 < 0x80) return {1, latin1_classes()[b0]};
  char32_t cp = 0;
  const size_t length = decode_utf8(text, pos, &cp);
  if (length == 0) return {1, CharClass::kOther};  // invalid byte: punctuation-like
  return {length, cp < 256 ? latin1_classes()[cp] : classify_with_icu(cp)};
}

// End of the run of characters of class `cls` starting at pos.
size_t run_end(std::string_view text, size_t pos, CharClass cls) {
  while (pos < text.size()) {
    const CharInfo c = char_at(text, pos);
    if (c.cls != cls) break;
    pos += c.length;
  }
  return pos;
}

// Length of the contraction ('s 't 're 've 'm 'll 'd) at pos, or 0.
size_t contraction_length(std::string_view text, size_t pos) {
  if (text[pos] != '\'') return 0;
  const std::string_view rest = text.substr(pos + 1);
  if (rest.empty()) return 0;
  const char c = rest[0];
  if (c == 's' || c == 't' || c == 'm' || c == 'd') return 2;
  if (rest.size() >= 2) {
    const std::string_view two = rest.substr(0, 2);
    if (two == "re" || two == "ve" || two == "ll") return 3;
  }
  return 0;
}

// Whitespace alternatives: `\s+(?!\S)` keeps the run but leaves its last character to
// prefix the following word (" word"), unless the run ends the text or is one char long,
// in which case `\s+` takes the whole run.
size_t whitespace_end(std::string_view text, size_t pos) {
  size_t last_start = pos;
  size_t end = pos;
  while (end < text.size()) {
    const CharInfo c = char_at(text, end);
    if (c.cls != CharClass::kSpace) break;
    last_start = end;
    end += c.length;
  }
  if (end == text.size() || last_start == pos) return end;
  return last_start;
}

// Byte offset where the regex match starting at pos ends (always > pos).
size_t match_end(std::string_view text, size_t pos) {
  if (const size_t n = contraction_length(text, pos)) return pos + n;
  const CharInfo first = char_at(text, pos);
  // " ?X+" : a single U+0020 may lead a letter, number or punctuation run.
  if (text[pos] == ' ' && pos + 1 < text.size()) {
    const CharInfo next = char_at(text, pos + 1);
    if (next.cls != CharClass::kSpace) return run_end(text, pos + 1, next.cls);
  }
  if (first.cls != CharClass::kSpace) return run_end(text, pos, first.cls);
  return whitespace_end(text, pos);
}

}  // namespace

// ---------------------------------------------------------------------------------
// Loading

namespace {

Status read_tokenizer_file(const std::string& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::error("cannot open " + path);
  std::ostringstream buf;
  buf << in.rdbuf();
  if (in.bad()) return Status::error("error reading " + path);
  *out = std::move(buf).str();
  return Status::ok();
}

}  // namespace

Status Gpt2Tokenizer::load(const std::string& dir, Gpt2Tokenizer* out) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    return Status::error("tokenizer directory " + dir + " does not exist");
  }
  // Each file is read only once the one before it is valid, so the first bad one is named.
  const bool hf_names = !std::filesystem::exists(dir + "/encoder.json", ec) &&
                        std::filesystem::exists(dir + "/vocab.json", ec);
  const std::string encoder_path = dir + (hf_names ? "/vocab.json" : "/encoder.json"),
                    vocab_path = dir + (hf_names ? "/merges.txt" : "/vocab.bpe");
  Gpt2Tokenizer tok;
  std::string text;
  RETURN_IF_ERROR(read_tokenizer_file(encoder_path, &text));
  RETURN_IF_ERROR(tok.load_encoder(text, encoder_path));
  RETURN_IF_ERROR(read_tokenizer_file(vocab_path, &text));
  RETURN_IF_ERROR(tok.load_merges(text, vocab_path));
  namespace fs = std::filesystem;
  tok.info_.name = fs::path(dir).filename().string();
  tok.source_files_ = {fs::absolute(encoder_path).lexically_normal().string(),
                       fs::absolute(vocab_path).lexically_normal().string()};
  *out = std::move(tok);
  return Status::ok();
}

bool Gpt2Tokenizer::files_in(const std::string& dir) {
  std::error_code ec;
  auto both = [&](const char* a, const char* b) {
    return std::filesystem::is_regular_file(dir + "/" + a, ec) && std::filesystem::is_regular_file(dir + "/" + b, ec);
  };
  return both("encoder.json", "vocab.bpe") || both("vocab.json", "merges.txt");
}

Status Gpt2Tokenizer::from_strings(std::string_view encoder_json, std::string_view vocab_bpe,
                                   const std::string& encoder_name, const std::string& vocab_name,
                                   Gpt2Tokenizer* out) {
  Gpt2Tokenizer tok;
  RETURN_IF_ERROR(tok.load_encoder(encoder_json, encoder_name));
  RETURN_IF_ERROR(tok.load_merges(vocab_bpe, vocab_name));
  *out = std::move(tok);
  return Status::ok();
}

Status Gpt2Tokenizer::load_encoder(std::string_view text, const std::string& path) {
  const nlohmann::json json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return Status::error(path + ": not valid JSON");
  if (!json.is_object() || json.empty())
    return Status::error(path + ": expected a non-empty object");

  const auto table = bytes_to_unicode();
  const auto byte_of = unicode_to_bytes();

  const size_t size = json.size();
  token_bytes_.assign(size, std::string());
  std::vector<bool> seen(size, false);
  for (const auto& [key, value] : json.items()) {
    if (!value.is_number_integer())
      return Status::error(path + ": id of '" + key + "' is not an integer");
    const int64_t id = value.get<int64_t>();
    if (id < 0 || id >= int64_t(size) || seen[id]) {
      return Status::error(path + ": ids must be 0.." + std::to_string(size - 1) +
                           " without repeats; bad id " + std::to_string(id) + " for '" + key + "'");
    }
    seen[id] = true;
    if (!unmap_byte_alphabet(key, byte_of, &token_bytes_[id])) {
      return Status::error(path + ": token '" + key + "' is outside GPT-2's byte alphabet");
    }
    encoder_.emplace(key, int(id));
    longest_token_bytes_ = std::max<int>(longest_token_bytes_, (int)token_bytes_[id].size());
  }
  longest_token_bytes_ = std::max<int>(longest_token_bytes_, (int)kEndOfText.size());

  const auto eot = encoder_.find(std::string(kEndOfText));
  if (eot == encoder_.end())
    return Status::error(path + ": no " + std::string(kEndOfText) + " token");
  eot_id_ = eot->second;
  // GPT-2's <|endoftext|> is both BOS and EOS in Hugging Face's config, and nothing is
  // inserted by default (add_bos_token false).
  info_.format = "gpt2-bpe";
  info_.bos_id = info_.eos_id = eot_id_;
  info_.longest_token_bytes = longest_token_bytes_;
  for (int b = 0; b < 256; ++b) {
    std::string symbol;
    append_utf8(table[b], &symbol);
    const auto it = encoder_.find(symbol);
    if (it == encoder_.end())
      return Status::error(path + ": missing the token for byte " + std::to_string(b));
    byte_ids_[b] = it->second;
  }
  return Status::ok();
}

Status Gpt2Tokenizer::load_merges(std::string_view text, const std::string& path) {
  std::istringstream lines{std::string(text)};
  std::string line;
  int line_number = 0;
  int rank = 0;
  while (std::getline(lines, line)) {
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (line_number == 1 && line[0] == '#')) continue;  // "#version: 0.2"
    const size_t space = line.find(' ');
    if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos ||
        space == 0 || space + 1 == line.size()) {
      return Status::error(path + ":" + std::to_string(line_number) +
                           ": expected two tokens, got '" + line + "'");
    }
    const std::string left = line.substr(0, space);
    const std::string right = line.substr(space + 1);
    const auto l = encoder_.find(left), r = encoder_.find(right), m = encoder_.find(left + right);
    if (l == encoder_.end() || r == encoder_.end() || m == encoder_.end()) {
      return Status::error(path + ":" + std::to_string(line_number) + ": merge '" + line +
                           "' uses a token missing from encoder.json");
    }
    // Like encoder.py's dict(zip(merges, range)), a repeated merge keeps its last rank.
    merges_.set(l->second, r->second, MergeRule{rank++, m->second});
  }
  if (merges_.empty()) return Status::error(path + ": no merges");
  return Status::ok();
}

// ---------------------------------------------------------------------------------
// Encoding

std::vector<int> Gpt2Tokenizer::encode(std::string_view text) const {
  std::vector<int> ids;
  ids.reserve(text.size() / 3 + 1);
  size_t pos = 0;
  while (true) {
    const size_t special = text.find(kEndOfText, pos);
    encode_ordinary(text.substr(pos, special == std::string_view::npos ? std::string_view::npos
                                                                       : special - pos),
                    &ids);
    if (special == std::string_view::npos) break;
    ids.push_back(eot_id_);
    pos = special + kEndOfText.size();
  }
  return ids;
}

void Gpt2Tokenizer::encode_ordinary(std::string_view text, std::vector<int>* ids) const {
  for (size_t pos = 0; pos < text.size();) {
    const size_t end = match_end(text, pos);
    encode_piece(text.substr(pos, end - pos), ids);
    pos = end;
  }
}

void Gpt2Tokenizer::encode_piece(std::string_view piece, std::vector<int>* ids) const {
  if (piece.size() == 1) {
    ids->push_back(byte_ids_[static_cast<unsigned char>(piece[0])]);
    return;
  }
  // Per-thread scratch keeps encode allocation-free in steady state yet thread-safe.
  thread_local std::vector<int> symbols;
  symbols.clear();
  for (char c : piece) symbols.push_back(byte_ids_[static_cast<unsigned char>(c)]);
  apply_merges(&symbols, merges_, MergeOrder::kRounds);
  ids->insert(ids->end(), symbols.begin(), symbols.end());
}

}  // namespace meshtrain::data
