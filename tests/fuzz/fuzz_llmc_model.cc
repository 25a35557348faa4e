// An llm.c model file's bytes: parse_llmc_header, then read_llmc_params. A header the
// parser accepts describes the file exactly, so every weight must then read.
#include <vector>

#include "checkpoint/byte_source.h"
#include "checkpoint/llmc_format.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace meshtrain;
  const auto file = checkpoint::memory_source(std::string(fuzz::as_text(data, size)));
  checkpoint::LlmcHeader header;
  if (!checkpoint::parse_llmc_header(*file, &header).is_ok()) return 0;
  const model::ParamLayout layout(header.config);
  std::vector<float> params(layout.total());
  fuzz::expect_ok(checkpoint::read_llmc_params(*file, header, layout, params.data()), "read_llmc_params");
  return 0;
}
