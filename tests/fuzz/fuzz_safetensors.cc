// A safetensors file's bytes: SafetensorsFile::from_bytes, then what --init-from does with
// it (infer_hf_config, check_hf_tensors). Every tensor of an accepted file must read back
// through read_float when its dtype is a float type (and be refused otherwise), and a file
// accepted as GPT-2 must hold every tensor of that model with a readable shape.
#include <string>
#include <vector>

#include "checkpoint/hf_gpt2_config.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/safetensors_model.h"
#include "fuzz_util.h"

namespace meshtrain::fuzz {
namespace {

constexpr size_t kMaxElements = 1 << 22;  // reads of larger accepted tensors are skipped

bool is_float(const std::string& d) { return d == "F32" || d == "F16" || d == "BF16" || d == "F64"; }

void read_every_tensor(const checkpoint::SafetensorsFile& f) {
  std::vector<float> buf;
  for (const auto& t : f.tensors()) {
    const size_t count = (t.end - t.begin) / checkpoint::dtype_size(t.dtype);
    if (count > kMaxElements) continue;
    buf.resize(count + 1);
    const Status s = f.read_float(t.name, buf.data(), count);
    if (is_float(t.dtype)) expect_ok(s, "read_float");
    if (!is_float(t.dtype) && s.is_ok()) broken_promise("read_float read dtype " + t.dtype + " as float");
  }
}

void check_as_gpt2(const checkpoint::SafetensorsModel& f) {
  model::GptConfig c;
  if (!checkpoint::infer_hf_config(f, 0, &c).is_ok()) return;
  const model::ParamLayout layout(c);
  expect_ok(checkpoint::check_hf_tensors(f, layout, c.vocab), "check_hf_tensors");
  for (const auto& t : layout.tensors()) {
    const auto* info = f.find(checkpoint::hf_tensor_name(f, t.name));
    if (!info) broken_promise("accepted GPT-2 file lacks " + t.name);
  }
}

}  // namespace
}  // namespace meshtrain::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace meshtrain;
  checkpoint::SafetensorsFile f;
  if (!checkpoint::SafetensorsFile::from_bytes(std::string(fuzz::as_text(data, size)), "fuzz.safetensors", &f).is_ok())
    return 0;
  fuzz::read_every_tensor(f);
  fuzz::check_as_gpt2(checkpoint::SafetensorsModel::single(f));
  return 0;
}
