// tiktoken rank files (OpenAI's cl100k_base/o200k_base/r50k_base/p50k_base, and Meta's
// Llama 3 tokenizer.model, which is the same format): one "<base64 token bytes> <rank>" line
// per token, and nothing else.
//
// Why the file name matters: a rank file carries no regex and no special tokens; tiktoken
// keeps those in code, per encoding. So the encoding is chosen by the file's stem
// (cl100k_base.tiktoken -> cl100k_base), and a tokenizer.model of exactly 128000 ranks is
// Llama 3, whose regex and 256 special tokens come from Meta's tokenizer.py.
//
// Encoding is tiktoken's: special tokens spelt in the text become their ids (like
// allowed_special="all"), the regex splits the rest, a piece that is itself a token is that
// token, and otherwise byte pairs merge lowest rank first, where a pair may merge when its
// concatenated bytes are a token, whose rank is both the priority and the new id. Ranks
// without a token (cl100k's 100256 and 100261..100275) decode to nothing.
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "data/tokenizer.h"

namespace meshtrain::data {

struct BpePipeline;

class TiktokenTokenizer : public Tokenizer {
 public:
  // PATH is a *.tiktoken file, a tokenizer.model holding tiktoken lines, or a folder with
  // exactly one *.tiktoken file (or with such a tokenizer.model).
  static Status load(const std::string& path, TiktokenTokenizer* out);
  // The rank file load() would read under PATH, or "" when there is none.
  static std::string rank_file_in(const std::string& path);
  // Whether the file's first line reads as "<base64> <rank>".
  static bool looks_like_rank_file(const std::string& file);
  // ENCODING is one of known_encodings(); "llama3" needs exactly 128000 ranks.
  static Status from_string(std::string_view ranks, const std::string& encoding, const std::string& file_name,
                            TiktokenTokenizer* out);
  static std::vector<std::string> known_encodings();

  std::vector<int> encode(std::string_view text) const override;
  std::string_view token_bytes(int id) const override;
  int vocab_size() const override;

 private:
  std::shared_ptr<const BpePipeline> pipeline_;
};

}  // namespace meshtrain::data
