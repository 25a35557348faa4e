// The precisions' names, apart from the GEMMs that run them: the layout's rules and the
// parsers name them without linking oneDNN (the fuzz targets link these alone).
#include <string>

#include "kernels/ops.h"

namespace meshtrain::kernels {

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::kBf16: return "bf16";
    case Precision::kFp16: return "fp16";
    default: return "fp32";
  }
}

Status parse_precision(const std::string& name, Precision* out) {
  for (Precision p : {Precision::kFp32, Precision::kBf16, Precision::kFp16})
    if (name == precision_name(p)) return *out = p, Status::ok();
  return Status::error("unknown precision '" + name + "' (choose fp32, bf16 or fp16)");
}

}  // namespace meshtrain::kernels
