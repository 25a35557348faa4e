// encoder.json and vocab.bpe: Gpt2Tokenizer::from_strings. The input is the two files and
// a text to encode, separated by NUL bytes (neither file holds one). A tokenizer built from
// accepted files encodes any text into ids within its vocabulary that decode back to the
// text, as bpe.h promises.
#include <string>
#include <vector>

#include "data/bpe.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace meshtrain;
  const std::string_view input = fuzz::as_text(data, size);
  std::string_view encoder, vocab, text;
  if (!fuzz::split_two_files_and_text(input, &encoder, &vocab, &text)) return 0;
  data::Gpt2Tokenizer tok;
  if (!data::Gpt2Tokenizer::from_strings(encoder, vocab, "encoder.json", "vocab.bpe", &tok).is_ok()) return 0;
  const std::vector<int> ids = tok.encode(text);
  std::string decoded;
  fuzz::expect_ok(tok.decode_checked(ids, &decoded), "decode_checked");
  if (decoded != text) fuzz::broken_promise("decode(encode(text)) != text");
  return 0;
}
