#include "data/bpe.h"

#include <unicode/uchar.h>

#include <algorithm>
#include <array>
#include <climits>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>

#include "core/check.h"

namespace meshtrain::data {
namespace {

constexpr std::string_view kEndOfText = "<|endoftext|>";

// Pieces longer than this use the O(n log n) heap merger; shorter ones (nearly all
// real words) use the simpler quadratic loop, which is faster at small n.
constexpr size_t kLongPiece = 64;

// ---------------------------------------------------------------------------------
// GPT-2's byte <-> unicode table: printable Latin-1 bytes map to themselves, the rest
// to code points from U+0100 up, so every byte has a visible, non-space character.

std::array<char32_t, 256> bytes_to_unicode() {
  std::array<char32_t, 256> table{};
  std::array<bool, 256> printable{};
  for (int b = 0; b < 256; ++b) {
    printable[b] = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
  }
  char32_t next_extra = 256;
  for (int b = 0; b < 256; ++b) table[b] = printable[b] ? char32_t(b) : next_extra++;
  return table;
}

void append_utf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(char(cp));
  } else if (cp < 0x800) {
    out->push_back(char(0xC0 | (cp >> 6)));
    out->push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(char(0xE0 | (cp >> 12)));
    out->push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(char(0xF0 | (cp >> 18)));
    out->push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(char(0x80 | (cp & 0x3F)));
  }
}

bool is_continuation(unsigned char c) { return (c & 0xC0) == 0x80; }

// Decodes one well-formed UTF-8 sequence at s[i]. Returns its byte length, or 0 for an
// invalid byte (bad lead, truncated, overlong, surrogate or > U+10FFFF); the caller then
// treats that single byte as a character of its own.
size_t decode_utf8(std::string_view s, size_t i, char32_t* cp) {
  const auto at = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char b0 = at(i);
  const size_t left = s.size() - i;
  if (b0 < 0x80) {
    *cp = b0;
    return 1;
  }
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    if (left < 2 || !is_continuation(at(i + 1))) return 0;
    *cp = (char32_t(b0 & 0x1F) << 6) | (at(i + 1) & 0x3F);
    return 2;
  }
  if (b0 >= 0xE0 && b0 <= 0xEF) {
    if (left < 3 || !is_continuation(at(i + 1)) || !is_continuation(at(i + 2))) return 0;
    const unsigned char b1 = at(i + 1);
    if ((b0 == 0xE0 && b1 < 0xA0) || (b0 == 0xED && b1 > 0x9F)) return 0;  // overlong, surrogate
    *cp = (char32_t(b0 & 0x0F) << 12) | (char32_t(b1 & 0x3F) << 6) | (at(i + 2) & 0x3F);
    return 3;
  }
  if (b0 >= 0xF0 && b0 <= 0xF4) {
    if (left < 4 || !is_continuation(at(i + 1)) || !is_continuation(at(i + 2)) ||
        !is_continuation(at(i + 3)))
      return 0;
    const unsigned char b1 = at(i + 1);
    if ((b0 == 0xF0 && b1 < 0x90) || (b0 == 0xF4 && b1 > 0x8F)) return 0;  // overlong, > U+10FFFF
    *cp = (char32_t(b0 & 0x07) << 18) | (char32_t(b1 & 0x3F) << 12) |
          (char32_t(at(i + 2) & 0x3F) << 6) | (at(i + 3) & 0x3F);
    return 4;
  }
  return 0;
}

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

// ---------------------------------------------------------------------------------
// Heap-based merging for long pieces. Semantics match encoder.py exactly: each step
// takes the lowest-ranked pair and merges all its non-overlapping occurrences left to
// right before any newly formed pair is considered ("rounds").

struct HeapEntry {
  int rank;
  int left;  // node index of the left symbol
  int left_id;
  int right_id;
  bool operator>(const HeapEntry& o) const {
    return rank != o.rank ? rank > o.rank : left > o.left;
  }
};

struct Node {
  int id;  // -1 once merged into its left neighbour
  int prev;
  int next;  // -1 at the ends
};

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

namespace {

// Maps a byte-alphabet token string back to raw bytes; false if it holds a character
// outside the 256-symbol alphabet.
bool unmap_token(std::string_view token, const std::array<int, 324>& byte_of, std::string* out) {
  out->clear();
  for (size_t i = 0; i < token.size();) {
    char32_t cp = 0;
    const size_t n = decode_utf8(token, i, &cp);
    if (n == 0 || cp >= byte_of.size() || byte_of[cp] < 0) return false;
    out->push_back(char(byte_of[cp]));
    i += n;
  }
  return true;
}

}  // namespace

Status Gpt2Tokenizer::load_encoder(std::string_view text, const std::string& path) {
  const nlohmann::json json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return Status::error(path + ": not valid JSON");
  if (!json.is_object() || json.empty())
    return Status::error(path + ": expected a non-empty object");

  const auto table = bytes_to_unicode();
  std::array<int, 324> byte_of;  // mapped code point -> raw byte (the table's range is 0..323)
  byte_of.fill(-1);
  for (int b = 0; b < 256; ++b) byte_of[table[b]] = b;

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
    if (!unmap_token(key, byte_of, &token_bytes_[id])) {
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
    merges_[pair_key(l->second, r->second)] = Merge{rank++, m->second};
  }
  if (merges_.empty()) return Status::error(path + ": no merges");
  return Status::ok();
}

// ---------------------------------------------------------------------------------
// Encoding

const Gpt2Tokenizer::Merge* Gpt2Tokenizer::find_merge(int left, int right) const {
  const auto it = merges_.find(pair_key(left, right));
  return it == merges_.end() ? nullptr : &it->second;
}

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

namespace {

// Quadratic merger for short pieces; mirrors encoder.py's bpe() loop directly.
template <typename FindMerge>
void merge_short(std::vector<int>* symbols, const FindMerge& find_merge) {
  std::vector<int>& s = *symbols;
  while (s.size() > 1) {
    int best_rank = INT_MAX, merged = -1;
    size_t best = 0;
    for (size_t i = 0; i + 1 < s.size(); ++i) {
      const auto* m = find_merge(s[i], s[i + 1]);
      if (m && m->rank < best_rank) best_rank = m->rank, merged = m->merged_id, best = i;
    }
    if (merged < 0) return;
    const int a = s[best], b = s[best + 1];
    size_t w = best;
    for (size_t i = best; i < s.size();) {
      if (i + 1 < s.size() && s[i] == a && s[i + 1] == b) {
        s[w++] = merged;
        i += 2;
      } else {
        s[w++] = s[i++];
      }
    }
    s.resize(w);
  }
}

template <typename FindMerge>
void merge_long(std::vector<int>* symbols, const FindMerge& find_merge) {
  std::vector<int>& s = *symbols;
  const int n = int(s.size());
  std::vector<Node> nodes(n);
  for (int i = 0; i < n; ++i) nodes[i] = Node{s[i], i - 1, i + 1 < n ? i + 1 : -1};

  std::priority_queue<HeapEntry, std::vector<HeapEntry>, std::greater<>> heap;
  std::vector<HeapEntry> pending;  // pairs formed this round, considered from the next one
  const auto consider = [&](int left, std::vector<HeapEntry>* into) {
    if (left < 0 || nodes[left].next < 0) return;
    const int left_id = nodes[left].id, right_id = nodes[nodes[left].next].id;
    if (const auto* m = find_merge(left_id, right_id))
      into->push_back({m->rank, left, left_id, right_id});
  };
  for (int i = 0; i + 1 < n; ++i) consider(i, &pending);
  for (const HeapEntry& e : pending) heap.push(e);
  pending.clear();

  while (!heap.empty()) {
    const int rank = heap.top().rank;
    while (!heap.empty() && heap.top().rank == rank) {  // ascending position within a rank
      const HeapEntry e = heap.top();
      heap.pop();
      Node& left = nodes[e.left];
      if (left.id != e.left_id || left.next < 0 || nodes[left.next].id != e.right_id)
        continue;  // stale
      const int right = left.next;
      left.id = find_merge(e.left_id, e.right_id)->merged_id;
      left.next = nodes[right].next;
      if (left.next >= 0) nodes[left.next].prev = e.left;
      nodes[right].id = -1;
      consider(left.prev, &pending);
      consider(e.left, &pending);
    }
    for (const HeapEntry& e : pending) heap.push(e);
    pending.clear();
  }
  s.clear();
  for (int i = 0; i >= 0; i = nodes[i].next) s.push_back(nodes[i].id);
}

}  // namespace

void Gpt2Tokenizer::encode_piece(std::string_view piece, std::vector<int>* ids) const {
  if (piece.size() == 1) {
    ids->push_back(byte_ids_[static_cast<unsigned char>(piece[0])]);
    return;
  }
  // Per-thread scratch keeps encode allocation-free in steady state yet thread-safe.
  thread_local std::vector<int> symbols;
  symbols.clear();
  for (char c : piece) symbols.push_back(byte_ids_[static_cast<unsigned char>(c)]);
  const auto find = [this](int l, int r) { return find_merge(l, r); };
  if (piece.size() <= kLongPiece) {
    merge_short(&symbols, find);
  } else {
    merge_long(&symbols, find);
  }
  ids->insert(ids->end(), symbols.begin(), symbols.end());
}

}  // namespace meshtrain::data
