// An llm.c token file's bytes: parse_token_file. Accepted means exactly a 1024-byte
// header and the count of tokens it states.
#include <vector>

#include "data/token_file.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace meshtrain;
  std::vector<uint16_t> tokens = {1};
  const Status s = data::parse_token_file(fuzz::as_text(data, size), &tokens);
  if (!s.is_ok()) {
    if (!tokens.empty()) fuzz::broken_promise("tokens left after an error");
    return 0;
  }
  if (data::kTokenFileHeaderBytes + 2 * tokens.size() != size)
    fuzz::broken_promise("accepted " + std::to_string(tokens.size()) + " tokens from " + std::to_string(size) + " bytes");
  return 0;
}
