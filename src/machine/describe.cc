#include "machine/describe.h"

#include "core/cpu_info.h"
#include "kernels/cpu/onednn.h"

#ifndef MESHTRAIN_MARCH
#define MESHTRAIN_MARCH "unknown"
#endif

namespace meshtrain::machine {

using kernels::Precision;

nlohmann::json machine_json() {
  const CpuInfo& c = cpu_info();
  nlohmann::json kernels_by_precision = nlohmann::json::object();
  for (Precision p : {Precision::kFp32, Precision::kBf16, Precision::kFp16})
    kernels_by_precision[kernels::precision_name(p)] = {
        {"gemm", kernels::gemm_kernel_name(p)},
        {"mfu_peak", kernels::precision_name(kernels::peak_precision(p))}};
  return {{"cpu", c.model},
          {"flags", {{"avx2", c.avx2}, {"fma", c.fma}, {"f16c", c.f16c}, {"avx512f", c.avx512f},
                     {"avx512_bf16", c.avx512_bf16}, {"amx_tile", c.amx_tile}, {"amx_bf16", c.amx_bf16}}},
          {"onednn_isa", kernels::onednn_isa_name()},
          {"build_march", MESHTRAIN_MARCH},
          {"kernels", kernels_by_precision}};
}

std::string machine_summary() {
  const CpuInfo& c = cpu_info();
  std::string s = "cpu: " + c.model + " | " + c.flags() + " | oneDNN ISA " + kernels::onednn_isa_name() +
                  " | built -march=" + MESHTRAIN_MARCH + "\n";
  for (Precision p : {Precision::kFp32, Precision::kBf16, Precision::kFp16})
    s += std::string("  ") + kernels::precision_name(p) + " GEMMs: " + kernels::gemm_kernel_name(p) + "\n";
  return s;
}

std::string mfu_basis(Precision p) {
  const Precision peak = kernels::peak_precision(p);
  std::string s = std::string(kernels::precision_name(p)) + " GEMMs on " + kernels::gemm_kernel_name(p) +
                  ", MFU against the " + kernels::precision_name(peak) + " peak";
  return s;
}

}  // namespace meshtrain::machine
