// What runs each precision's GEMMs on this machine, in words: the run header, config.json
// and `bench peak` print it, so that a figure says which kernel produced it.
#include <dnnl.h>

#include <string>

#include "kernels/cpu/onednn.h"
#include "kernels/ops.h"

namespace meshtrain::kernels {

const char* onednn_isa_name() {
  switch (dnnl_get_effective_cpu_isa()) {
    case dnnl_cpu_isa_sse41: return "sse41";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx512_mic: return "avx512_mic";
    case dnnl_cpu_isa_avx512_mic_4ops: return "avx512_mic_4ops";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    default: return "baseline";
  }
}

namespace {
#if defined(__F16C__)
constexpr const char* kF16cConversions = "F16C";
#else
constexpr const char* kF16cConversions = "portable conversions";
#endif
// fp32 and fp16 strings are built once: the ISA does not change during a run.
std::string fp32_kernel() { return std::string("oneDNN sgemm (") + onednn_isa_name() + ")"; }
}  // namespace

const char* gemm_kernel_name(Precision p) {
  static const std::string fp32 = fp32_kernel();
  static const std::string fp16 = std::string("fp16-rounded operands (") +
                                  kF16cConversions + ") on " + fp32;
  static const std::string bf16_native = std::string("oneDNN bf16 matmul (") + onednn_isa_name() + ")";
  static const std::string bf16_widened = "bf16 operands widened to fp32 on " + fp32 + " (no bf16 units)";
  switch (p) {
    case Precision::kFp32: return fp32.c_str();
    case Precision::kFp16: return fp16.c_str();
    case Precision::kBf16:
      return (bf16_backend() == Bf16Backend::kOneDnn ? bf16_native : bf16_widened).c_str();
  }
  return fp32.c_str();
}

Precision peak_precision(Precision p) {
  if (p == Precision::kBf16 && bf16_backend() == Bf16Backend::kOneDnn) return Precision::kBf16;
  return Precision::kFp32;
}

}  // namespace meshtrain::kernels
