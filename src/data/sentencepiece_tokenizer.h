// SentencePiece .model files (Llama 1 and 2, Mistral, T5, Gemma and the models trained with
// spm_train), read and run by the SentencePiece library itself (Debian's libsentencepiece):
// ids are exactly what the library's encoder gives, and decode is its DecodeIds.
//
// What the Tokenizer interface adds on top of the library:
// - encode: the library's ids, no BOS or EOS (encode_with_special adds the BOS when the model
//   has one: Llama's convention). Special-token text inside the text is treated as the
//   library treats it: user-defined symbols become their ids, control tokens ("<s>") do not.
// - token_bytes(id): the piece with "▁" (U+2581) as a space; a byte piece <0xNN> is that one
//   byte; control and unknown tokens (<s>, </s>, <unk>) are their piece text.
// - info().strip_leading_space: whether the library's decoder drops the space its encoder
//   prepends (the model's add_dummy_prefix), found by asking the library.
//
// Thread safety: the library's Encode and DecodeIds are const and may run concurrently.
#pragma once
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "data/tokenizer.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace meshtrain::data {

class SentencePieceTokenizer : public Tokenizer {
 public:
  SentencePieceTokenizer();
  ~SentencePieceTokenizer() override;
  SentencePieceTokenizer(SentencePieceTokenizer&&) noexcept;
  SentencePieceTokenizer& operator=(SentencePieceTokenizer&&) noexcept;

  // Reads a SentencePiece model file. A file the library cannot read is an error naming the
  // file and the library's own message; nothing aborts.
  static Status load(const std::string& path, SentencePieceTokenizer* out);
  // The SentencePiece model `path` names, or "": a *.model file, or a folder with
  // tokenizer.model and no tokenizer.json (a Hugging Face folder with both is read through
  // its tokenizer.json). A .model file whose first line is a tiktoken rank line ("base64
  // rank", Meta's Llama 3 tokenizer.model) is not one: SentencePiece models are binary
  // protobuf.
  static std::string model_file_in(const std::string& path);

  std::vector<int> encode(std::string_view text) const override;
  std::string_view token_bytes(int id) const override { return token_bytes_[id]; }
  // The library's DecodeIds (control tokens decode to nothing, unknown ones to " ⁇ ").
  std::string decode(std::span<const int> ids) const override;
  int vocab_size() const override { return static_cast<int>(token_bytes_.size()); }

 private:
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  std::vector<std::string> token_bytes_;
};

}  // namespace meshtrain::data
