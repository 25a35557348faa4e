// A token file's bytes: parse_token_file. Accepted means exactly a 1024-byte header and
// the count of tokens it states, 2 or 4 bytes each as its version says.
#include <cstring>
#include <vector>

#include "data/token_file.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace meshtrain;
  std::vector<data::Token> tokens = {1};
  const Status s = data::parse_token_file(fuzz::as_text(data, size), &tokens);
  if (!s.is_ok()) {
    if (!tokens.empty()) fuzz::broken_promise("tokens left after an error");
    return 0;
  }
  int32_t version;
  std::memcpy(&version, data + sizeof(int32_t), sizeof version);
  if (data::kTokenFileHeaderBytes + data::token_bytes(version) * tokens.size() != size)
    fuzz::broken_promise("accepted " + std::to_string(tokens.size()) + " tokens from " + std::to_string(size) + " bytes");
  return 0;
}
