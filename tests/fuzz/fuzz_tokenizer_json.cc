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
  std::string_view json, config, text;
  if (!fuzz::split_two_files_and_text(input, &json, &config, &text)) return 0;
  data::HfTokenizer tok;
  if (!data::HfTokenizer::from_strings(json, config, "tokenizer.json", "tokenizer_config.json", &tok).is_ok()) return 0;
  const std::vector<int> ids = tok.encode(text);
  for (int id : ids)
    if (id < 0 || id >= tok.vocab_size()) fuzz::broken_promise("encode gave an id outside the vocabulary");
  std::string decoded;
  fuzz::expect_ok(tok.decode_checked(ids, &decoded), "decode_checked");
  return 0;
}
