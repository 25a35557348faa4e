// Hugging Face tokenizer.json and tokenizer_config.json: HfTokenizer::from_strings. The input
// is the two files and a text to encode, separated by NUL bytes. Any input is an error
// Status or a tokenizer; a tokenizer encodes any text into ids within its vocabulary, which
// decode_checked accepts.
#include <string>
#include <vector>

#include "data/hf_tokenizer.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace meshtrain;
  const std::string_view input = fuzz::as_text(data, size);
  const size_t a = input.find('\0');
  if (a == std::string_view::npos) return 0;
  const size_t b = input.find('\0', a + 1);
  const std::string_view json = input.substr(0, a);
  const std::string_view config = input.substr(a + 1, b == std::string_view::npos ? std::string_view::npos : b - a - 1);
  const std::string_view text = b == std::string_view::npos ? std::string_view() : input.substr(b + 1);
  data::HfTokenizer tok;
  if (!data::HfTokenizer::from_strings(json, config, "tokenizer.json", "tokenizer_config.json", &tok).is_ok()) return 0;
  const std::vector<int> ids = tok.encode(text);
  for (int id : ids)
    if (id < 0 || id >= tok.vocab_size()) fuzz::broken_promise("encode gave an id outside the vocabulary");
  std::string decoded;
  fuzz::expect_ok(tok.decode_checked(ids, &decoded), "decode_checked");
  return 0;
}
