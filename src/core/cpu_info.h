// What this CPU is and which vector extensions it offers, read once with cpuid at run time
// (never assumed from how the binary was built: the machines this engine runs on change
// from one day to the next, AVX2-only EPYCs and AMX Xeons among them).
#pragma once
#include <string>

namespace meshtrain {

struct CpuInfo {
  std::string model;  // the brand string, e.g. "AMD EPYC 7B13" (or "unknown")
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false;      // AVX-512 foundation
  bool avx512_bf16 = false;  // AVX512_BF16: vcvtneps2bf16, vdpbf16ps
  bool amx_tile = false, amx_bf16 = false;
  // Each flag is the CPU's and the operating system's (XSAVE state enabled): an extension
  // the kernel does not save on a context switch cannot be used.

  // "avx2 fma f16c avx512f ..." of the flags that are set.
  std::string flags() const;
};

const CpuInfo& cpu_info();

// The extensions the compiler was told it may use (-march), which must all be present at
// run time: an empty string when they are, otherwise the missing ones, e.g. "avx512f".
std::string missing_build_extensions();

// Physical cores among the CPUs this process may run on (its affinity mask): hardware
// threads of one core count once. From /sys's topology; the logical CPUs where it is absent.
int physical_core_count();

}  // namespace meshtrain
