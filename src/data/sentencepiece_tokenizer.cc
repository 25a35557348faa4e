#include "data/sentencepiece_tokenizer.h"

#include <sentencepiece_processor.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>

#include "core/check.h"

namespace meshtrain::data {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view kSpaceMark = "\xE2\x96\x81";  // U+2581, SentencePiece's space

// "<0xNN>" -> the byte 0xNN; false for any other piece.
bool byte_piece(std::string_view piece, char* byte) {
  if (piece.size() != 6 || !piece.starts_with("<0x") || piece.back() != '>') return false;
  int value = 0;
  for (char c : piece.substr(3, 2)) {
    if (!std::isxdigit(static_cast<unsigned char>(c))) return false;
    value = value * 16 + (std::isdigit(static_cast<unsigned char>(c)) ? c - '0' : std::tolower(c) - 'a' + 10);
  }
  *byte = static_cast<char>(value);
  return true;
}

std::string spaced(std::string_view piece) {
  std::string out;
  for (size_t at = 0; at < piece.size();) {
    if (piece.substr(at).starts_with(kSpaceMark)) {
      out += ' ';
      at += kSpaceMark.size();
    } else {
      out += piece[at++];
    }
  }
  return out;
}

// Whether the first line of `head` is a tiktoken rank line: base64, one space, digits.
bool tiktoken_line(std::string_view head) {
  const size_t end = head.find('\n');
  std::string_view line = head.substr(0, end);
  if (line.ends_with('\r')) line.remove_suffix(1);
  const size_t space = line.find(' ');
  if (space == 0 || space == std::string_view::npos || space + 1 == line.size()) return false;
  auto base64 = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '+' || c == '/' || c == '='; };
  return std::all_of(line.begin(), line.begin() + space, base64) &&
         std::all_of(line.begin() + space + 1, line.end(), [](char c) { return c >= '0' && c <= '9'; });
}

}  // namespace

SentencePieceTokenizer::SentencePieceTokenizer() = default;
SentencePieceTokenizer::~SentencePieceTokenizer() = default;
SentencePieceTokenizer::SentencePieceTokenizer(SentencePieceTokenizer&&) noexcept = default;
SentencePieceTokenizer& SentencePieceTokenizer::operator=(SentencePieceTokenizer&&) noexcept = default;

std::string SentencePieceTokenizer::model_file_in(const std::string& path) {
  std::error_code ec;
  std::string file;
  if (fs::is_directory(path, ec)) {
    if (fs::exists(fs::path(path) / "tokenizer.json", ec)) return "";
    file = (fs::path(path) / "tokenizer.model").string();
  } else if (fs::path(path).extension() == ".model") {
    file = path;
  }
  if (file.empty() || !fs::is_regular_file(file, ec)) return "";
  std::ifstream in(file, std::ios::binary);
  std::string head(256, '\0');
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  head.resize(static_cast<size_t>(in.gcount()));
  return tiktoken_line(head) ? "" : file;
}

Status SentencePieceTokenizer::load(const std::string& path, SentencePieceTokenizer* out) {
  SentencePieceTokenizer tok;
  tok.sp_ = std::make_unique<sentencepiece::SentencePieceProcessor>();
  const auto loaded = tok.sp_->Load(path);
  if (!loaded.ok())
    return Status::error(path + " is not a SentencePiece model the library can read: " + loaded.ToString());
  const int n = tok.sp_->GetPieceSize();
  if (n <= 0) return Status::error(path + ": the SentencePiece model has no pieces");
  tok.token_bytes_.reserve(n);
  for (int id = 0; id < n; ++id) {
    const std::string& piece = tok.sp_->IdToPiece(id);
    char byte = 0;
    if (tok.sp_->IsByte(id) && byte_piece(piece, &byte)) {
      tok.token_bytes_.emplace_back(1, byte);
    } else if (tok.sp_->IsControl(id) || tok.sp_->IsUnknown(id)) {
      tok.token_bytes_.push_back(piece);
    } else {
      tok.token_bytes_.push_back(spaced(piece));
    }
    tok.info_.longest_token_bytes =
        std::max(tok.info_.longest_token_bytes, static_cast<int>(tok.token_bytes_.back().size()));
  }
  TokenizerInfo& info = tok.info_;
  info.format = "sentencepiece";
  info.name = fs::path(path).filename().string();
  info.bos_id = tok.sp_->bos_id() >= 0 && tok.sp_->bos_id() < n ? tok.sp_->bos_id() : -1;
  info.eos_id = tok.sp_->eos_id() >= 0 && tok.sp_->eos_id() < n ? tok.sp_->eos_id() : -1;
  info.add_bos = info.bos_id >= 0;
  // The library's own rule: its decoder drops the space its encoder put in front exactly
  // when the decoded text of a leading "▁word" lacks the space that piece stands for.
  const std::vector<int> probe = tok.encode("a");
  std::string joined;
  for (int id : probe) joined += tok.token_bytes_[id];
  info.strip_leading_space = !probe.empty() && joined == " " + tok.sp_->DecodeIds(probe);
  tok.source_files_ = {fs::absolute(path).lexically_normal().string()};
  *out = std::move(tok);
  return Status::ok();
}

std::vector<int> SentencePieceTokenizer::encode(std::string_view text) const {
  std::vector<int> ids;
  const auto s = sp_->Encode(text, &ids);
  CHECK_MSG(s.ok(), "SentencePiece encode failed");
  return ids;
}

std::string SentencePieceTokenizer::decode(std::span<const int> ids) const {
  for (int id : ids) CHECK_MSG(id >= 0 && id < vocab_size(), "token id out of range in SentencePieceTokenizer::decode");
  return sp_->DecodeIds(std::vector<int>(ids.begin(), ids.end()));
}

}  // namespace meshtrain::data
