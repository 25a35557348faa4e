#include "core/cpu_info.h"

#include <cpuid.h>
#include <sched.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <utility>

namespace meshtrain {

namespace {

struct Regs {
  unsigned a = 0, b = 0, c = 0, d = 0;
};

Regs cpuid(unsigned leaf, unsigned subleaf = 0) {
  Regs r;
  if (!__get_cpuid_count(leaf, subleaf, &r.a, &r.b, &r.c, &r.d)) r = Regs{};
  return r;
}

bool bit(unsigned reg, int i) { return (reg >> i) & 1u; }

// XCR0: which register states the OS saves (bit 1 SSE, 2 AVX, 5-7 AVX-512, 17-18 AMX tiles).
uint64_t xcr0() {
  uint32_t lo, hi;
  __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return ((uint64_t)hi << 32) | lo;
}

std::string brand_string() {
  if (cpuid(0x80000000).a < 0x80000004) return "unknown";
  char brand[49] = {};
  for (unsigned i = 0; i < 3; i++) {
    Regs r = cpuid(0x80000002 + i);
    std::memcpy(brand + 16 * i, &r, 16);
  }
  std::string s(brand);
  const size_t begin = s.find_first_not_of(' '), end = s.find_last_not_of(' ');
  return begin == std::string::npos ? "unknown" : s.substr(begin, end - begin + 1);
}

CpuInfo detect() {
  CpuInfo info;
  info.model = brand_string();
  const Regs l1 = cpuid(1);
  const bool osxsave = bit(l1.c, 27);
  const uint64_t xcr = osxsave ? xcr0() : 0;
  const bool avx_state = (xcr & 0x6) == 0x6;
  const bool avx512_state = avx_state && (xcr & 0xE0) == 0xE0;
  const bool amx_state = (xcr & 0x60000) == 0x60000;
  const bool max7 = cpuid(0).a >= 7;
  const Regs l7 = max7 ? cpuid(7, 0) : Regs{};
  const Regs l7_1 = max7 ? cpuid(7, 1) : Regs{};
  info.fma = avx_state && bit(l1.c, 12);
  info.f16c = avx_state && bit(l1.c, 29);
  info.avx2 = avx_state && bit(l7.b, 5);
  info.avx512f = avx512_state && bit(l7.b, 16);
  info.avx512_bf16 = info.avx512f && bit(l7_1.a, 5);
  info.amx_bf16 = amx_state && bit(l7.d, 22);
  info.amx_tile = amx_state && bit(l7.d, 24);
  return info;
}

}  // namespace

std::string CpuInfo::flags() const {
  std::string s;
  auto add = [&](bool on, const char* name) {
    if (!on) return;
    if (!s.empty()) s += ' ';
    s += name;
  };
  add(avx2, "avx2");
  add(fma, "fma");
  add(f16c, "f16c");
  add(avx512f, "avx512f");
  add(avx512_bf16, "avx512_bf16");
  add(amx_tile, "amx_tile");
  add(amx_bf16, "amx_bf16");
  return s.empty() ? "none of avx2 fma f16c avx512f avx512_bf16 amx" : s;
}

const CpuInfo& cpu_info() {
  static const CpuInfo info = detect();
  return info;
}

std::string missing_build_extensions() {
  const CpuInfo& c = cpu_info();
  std::string missing;
  auto need = [&](bool present, const char* name) {
    if (present) return;
    if (!missing.empty()) missing += ' ';
    missing += name;
  };
#if defined(__AVX2__)
  need(c.avx2, "avx2");
#endif
#if defined(__FMA__)
  need(c.fma, "fma");
#endif
#if defined(__F16C__)
  need(c.f16c, "f16c");
#endif
#if defined(__AVX512F__)
  need(c.avx512f, "avx512f");
#endif
#if defined(__AVX512BF16__)
  need(c.avx512_bf16, "avx512_bf16");
#endif
  (void)c;
  (void)need;
  return missing;
}

int physical_core_count() {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  const int logical = (int)std::max(1u, std::thread::hardware_concurrency());
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) return logical;
  std::set<std::pair<int, int>> cores;  // (package, core) of each allowed CPU
  for (int cpu = 0; cpu < CPU_SETSIZE; cpu++) {
    if (!CPU_ISSET(cpu, &allowed)) continue;
    const std::string dir = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/";
    int package = -1, core = -1;
    std::ifstream(dir + "physical_package_id") >> package;
    std::ifstream(dir + "core_id") >> core;
    if (package < 0 || core < 0) return CPU_COUNT(&allowed);
    cores.insert({package, core});
  }
  return cores.empty() ? logical : (int)cores.size();
}

}  // namespace meshtrain
