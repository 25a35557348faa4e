#include "data/tiktoken_tokenizer.h"

#include <charconv>
#include <filesystem>
#include <fstream>

#include "core/file_io.h"
#include "data/bpe_pipeline.h"

namespace meshtrain::data {

namespace fs = std::filesystem;

namespace {

struct Encoding {
  const char* name;
  const char* pattern;
  std::vector<std::pair<std::string, int>> specials;
  int eos_id;
  int bos_id;
  int ranks;  // the exact rank count required, or 0
};

constexpr const char* kR50kPattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

std::vector<std::pair<std::string, int>> llama3_specials() {
  // Meta's tokenizer.py: ten named slots, then reserved tokens 5..250, from id 128000.
  std::vector<std::string> names = {
      "<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
      "<|reserved_special_token_2|>", "<|reserved_special_token_3|>", "<|start_header_id|>", "<|end_header_id|>",
      "<|reserved_special_token_4|>", "<|eot_id|>"};
  for (int i = 5; i < 256 - 5; ++i) names.push_back("<|reserved_special_token_" + std::to_string(i) + "|>");
  std::vector<std::pair<std::string, int>> out;
  for (size_t i = 0; i < names.size(); ++i) out.emplace_back(names[i], 128000 + int(i));
  return out;
}

const std::vector<Encoding>& encodings() {
  static const std::vector<Encoding> kEncodings = {
      {"cl100k_base",
       R"('(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+)",
       {{"<|endoftext|>", 100257},
        {"<|fim_prefix|>", 100258},
        {"<|fim_middle|>", 100259},
        {"<|fim_suffix|>", 100260},
        {"<|endofprompt|>", 100276}},
       100257, -1, 0},
      {"o200k_base",
       R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|)"
       R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|)"
       R"(\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
       {{"<|endoftext|>", 199999}, {"<|endofprompt|>", 200018}},
       199999, -1, 0},
      {"r50k_base", kR50kPattern, {{"<|endoftext|>", 50256}}, 50256, -1, 0},
      {"gpt2", kR50kPattern, {{"<|endoftext|>", 50256}}, 50256, -1, 0},
      {"p50k_base", kR50kPattern, {{"<|endoftext|>", 50256}}, 50256, -1, 0},
      {"llama3",
       R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
       llama3_specials(), 128001, 128000, 128000},
  };
  return kEncodings;
}

int base64_value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

bool decode_base64(std::string_view in, std::string* out) {
  out->clear();
  uint32_t acc = 0;
  int bits = 0;
  size_t i = 0;
  for (; i < in.size() && in[i] != '='; ++i) {
    const int v = base64_value(in[i]);
    if (v < 0) return false;
    acc = (acc << 6) | uint32_t(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out->push_back(char((acc >> bits) & 0xFF));
    }
  }
  for (; i < in.size(); ++i) {
    if (in[i] != '=') return false;
  }
  return !out->empty();
}

// "<base64> <rank>" -> bytes, rank.
bool parse_line(std::string_view line, std::string* bytes, int* rank) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  const size_t space = line.find(' ');
  if (space == std::string_view::npos || !decode_base64(line.substr(0, space), bytes)) return false;
  const std::string_view number = line.substr(space + 1);
  const auto [end, ec] = std::from_chars(number.data(), number.data() + number.size(), *rank);
  return ec == std::errc() && end == number.data() + number.size() && *rank >= 0;
}

std::string joined_names() {
  std::string out;
  for (const Encoding& e : encodings()) out += (out.empty() ? "" : ", ") + std::string(e.name);
  return out;
}

}  // namespace

std::vector<std::string> TiktokenTokenizer::known_encodings() {
  std::vector<std::string> out;
  for (const Encoding& e : encodings()) out.push_back(e.name);
  return out;
}

bool TiktokenTokenizer::looks_like_rank_file(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  std::string line, bytes;
  int rank = 0;
  return in && std::getline(in, line) && parse_line(line, &bytes, &rank);
}

std::string TiktokenTokenizer::rank_file_in(const std::string& path) {
  std::error_code ec;
  const fs::path p(path);
  if (fs::is_regular_file(p, ec)) {
    if (p.extension() == ".tiktoken") return path;
    if (p.filename() == "tokenizer.model" && looks_like_rank_file(path)) return path;
    return "";
  }
  if (!fs::is_directory(p, ec)) return "";
  std::vector<std::string> found;
  for (const auto& entry : fs::directory_iterator(p, ec)) {
    if (entry.is_regular_file(ec) && entry.path().extension() == ".tiktoken") found.push_back(entry.path().string());
  }
  if (found.size() == 1) return found[0];
  if (found.empty() && fs::is_regular_file(p / "tokenizer.model", ec) && looks_like_rank_file((p / "tokenizer.model").string())) {
    return (p / "tokenizer.model").string();
  }
  return "";
}

Status TiktokenTokenizer::load(const std::string& path, TiktokenTokenizer* out) {
  const std::string file = rank_file_in(path);
  if (file.empty()) {
    return Status::error(path + ": no tiktoken rank file (a *.tiktoken file, exactly one in a folder, or a "
                                "tokenizer.model of \"<base64> <rank>\" lines)");
  }
  std::string ranks;
  RETURN_IF_ERROR(read_file(file, &ranks));
  const fs::path p(file);
  const std::string encoding = p.filename() == "tokenizer.model" ? "llama3" : p.stem().string();
  TiktokenTokenizer tok;
  RETURN_IF_ERROR(from_string(ranks, encoding, file, &tok));
  tok.source_files_ = {fs::absolute(p).lexically_normal().string()};
  *out = std::move(tok);
  return Status::ok();
}

namespace {

// Each "<base64 bytes> <rank>" line into the vocabulary and the rank's bytes; `count` ranks.
Status read_rank_lines(std::string_view ranks, const std::string& file_name, BpePipeline* p, int* count) {
  std::vector<std::string>& token_bytes = p->token_bytes;
  std::string bytes;
  int line_number = 0;
  for (size_t pos = 0; pos < ranks.size();) {
    size_t end = ranks.find('\n', pos);
    if (end == std::string_view::npos) end = ranks.size();
    const std::string_view line = ranks.substr(pos, end - pos);
    pos = end + 1;
    ++line_number;
    if (line.empty() || line == "\r") continue;
    int rank = 0;
    if (!parse_line(line, &bytes, &rank)) {
      return Status::error(file_name + ":" + std::to_string(line_number) + ": expected \"<base64 bytes> <rank>\", got '" +
                           std::string(line.substr(0, 80)) + "'");
    }
    if (size_t(rank) >= token_bytes.size()) token_bytes.resize(size_t(rank) + 1);
    if (!token_bytes[rank].empty() || !p->vocab.emplace(bytes, BpePipeline::VocabEntry{rank}).second) {
      return Status::error(file_name + ":" + std::to_string(line_number) + ": rank " + std::to_string(rank) +
                           " or its bytes appear twice");
    }
    token_bytes[rank] = bytes;
    ++*count;
  }
  return Status::ok();
}

}  // namespace

Status TiktokenTokenizer::from_string(std::string_view ranks, const std::string& encoding_name,
                                      const std::string& file_name, TiktokenTokenizer* out) {
  const Encoding* enc = nullptr;
  for (const Encoding& e : encodings()) {
    if (encoding_name == e.name) enc = &e;
  }
  if (enc == nullptr) {
    return Status::error(file_name + ": unknown tiktoken encoding '" + encoding_name +
                         "' (the file's name chooses it; known: " + joined_names() + ")");
  }
  auto p = std::make_shared<BpePipeline>();
  p->byte_level = true;
  p->ignore_merges = true;
  PreTokenizerStep split{};
  split.kind = PreTokenizerStep::Kind::kSplit;
  RETURN_IF_ERROR(TextRegex::compile(enc->pattern, &split.regex).with_context(file_name));
  p->pre_tokenizers.push_back(std::move(split));

  std::vector<std::string>& token_bytes = p->token_bytes;
  int count = 0;
  RETURN_IF_ERROR(read_rank_lines(ranks, file_name, p.get(), &count));
  if (enc->ranks != 0 && count != enc->ranks) {
    return Status::error(file_name + ": " + std::to_string(count) + " ranks, but " + enc->name + " has exactly " +
                         std::to_string(enc->ranks));
  }
  for (int b = 0; b < 256; ++b) {
    if (!p->vocab.contains(std::string(1, char(b)))) {
      return Status::error(file_name + ": no token for the single byte " + std::to_string(b));
    }
  }
  // Every way to cut a token into two tokens is a pair that merges into it.
  for (size_t rank = 0; rank < token_bytes.size(); ++rank) {
    const std::string_view t = token_bytes[rank];
    for (size_t cut = 1; cut < t.size(); ++cut) {
      const auto left = p->vocab.find(t.substr(0, cut)), right = p->vocab.find(t.substr(cut));
      if (left != p->vocab.end() && right != p->vocab.end()) {
        p->merges.set(left->second.id, right->second.id, MergeRule{int(rank), int(rank)});
      }
    }
  }
  for (const auto& [text, id] : enc->specials) {
    if (size_t(id) >= token_bytes.size()) token_bytes.resize(size_t(id) + 1);
    if (!token_bytes[id].empty()) {
      return Status::error(file_name + ": special token " + text + " has id " + std::to_string(id) +
                           ", which a rank already uses");
    }
    token_bytes[id] = text;
    p->raw_specials.add(SpecialTokenSpec{text, id});
  }
  p->finish();

  TiktokenTokenizer tok;
  tok.info_.format = "tiktoken";
  tok.info_.name = enc->name;
  tok.info_.eos_id = enc->eos_id;
  tok.info_.bos_id = enc->bos_id;
  tok.info_.add_bos = enc->bos_id >= 0;
  for (const std::string& t : token_bytes) tok.info_.longest_token_bytes = std::max<int>(tok.info_.longest_token_bytes, int(t.size()));
  tok.pipeline_ = std::move(p);
  *out = std::move(tok);
  return Status::ok();
}

std::vector<int> TiktokenTokenizer::encode(std::string_view text) const {
  std::vector<int> ids;
  ids.reserve(text.size() / 4 + 4);
  pipeline_->encode(text, &ids);
  return ids;
}

std::string_view TiktokenTokenizer::token_bytes(int id) const { return pipeline_->token_bytes[size_t(id)]; }
int TiktokenTokenizer::vocab_size() const { return int(pipeline_->token_bytes.size()); }

}  // namespace meshtrain::data
