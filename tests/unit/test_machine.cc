// The machine the engine runs on: CPU features read at run time, the GEMM peak and its
// cache, and the rule that keeps MFU at or below 100% (machine/peak.h).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "core/cpu_info.h"
#include "kernels/cpu/onednn.h"
#include "machine/describe.h"
#include "machine/peak.h"

namespace meshtrain::test_machine {
namespace {

namespace fs = std::filesystem;

// The flags Linux reports for the first CPU in /proc/cpuinfo.
std::set<std::string> proc_cpu_flags() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("flags", 0) == 0) {
      std::istringstream words(line.substr(line.find(':') + 1));
      std::set<std::string> flags;
      for (std::string w; words >> w;) flags.insert(w);
      return flags;
    }
  return {};
}

TEST(CpuInfo, AgreesWithTheKernelsView) {
  const std::set<std::string> flags = proc_cpu_flags();
  if (flags.empty()) GTEST_SKIP() << "no /proc/cpuinfo flags line";
  const CpuInfo& c = cpu_info();
  EXPECT_EQ(c.avx2, flags.count("avx2") == 1);
  EXPECT_EQ(c.fma, flags.count("fma") == 1);
  EXPECT_EQ(c.f16c, flags.count("f16c") == 1);
  EXPECT_EQ(c.avx512f, flags.count("avx512f") == 1);
  EXPECT_EQ(c.avx512_bf16, flags.count("avx512_bf16") == 1);
  EXPECT_EQ(c.amx_bf16, flags.count("amx_bf16") == 1);
  EXPECT_EQ(c.amx_tile, flags.count("amx_tile") == 1);
  EXPECT_FALSE(c.model.empty());
  // This binary is running, so every extension it was built for is present.
  EXPECT_EQ(missing_build_extensions(), "");
}

TEST(MachineJson, NamesTheKernelOfEveryPrecision) {
  const nlohmann::json m = machine::machine_json();
  EXPECT_EQ(m["cpu"], cpu_info().model);
  EXPECT_EQ(m["onednn_isa"], kernels::onednn_isa_name());
  for (const char* p : {"fp32", "bf16", "fp16"}) {
    ASSERT_TRUE(m["kernels"].contains(p)) << p;
    EXPECT_FALSE(m["kernels"][p]["gemm"].get<std::string>().empty()) << p;
  }
  EXPECT_EQ(m["kernels"]["fp16"]["mfu_peak"], "fp32");
  const bool units = kernels::bf16_backend() == kernels::Bf16Backend::kOneDnn;
  EXPECT_EQ(m["kernels"]["bf16"]["mfu_peak"], units ? "bf16" : "fp32");
  EXPECT_NE(machine::mfu_basis(kernels::Precision::kBf16).find(units ? "bf16 peak" : "fp32 peak"), std::string::npos);
}

class PeakCache : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("meshtrain_peak_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    ::setenv("MESHTRAIN_CACHE_DIR", dir_.c_str(), 1);
  }
  void TearDown() override {
    ::unsetenv("MESHTRAIN_CACHE_DIR");
    fs::remove_all(dir_);
  }
  nlohmann::json cache() const {
    std::ifstream in(dir_ / "peak.json");
    return nlohmann::json::parse(in);
  }
  fs::path dir_;
};

// The key tells machines, ISAs, precisions and thread counts apart, and a lower measurement
// (a busy machine) never replaces a higher one.
TEST_F(PeakCache, KeepsTheBestPerCpuIsaPrecisionAndThreads) {
  using kernels::Precision;
  const std::string key = machine::peak_cache_key(2, Precision::kFp32);
  EXPECT_NE(key.find(cpu_info().model), std::string::npos) << key;
  EXPECT_NE(key.find(kernels::onednn_isa_name()), std::string::npos) << key;
  EXPECT_NE(key, machine::peak_cache_key(1, Precision::kFp32));
  // fp16 shares fp32's peak; bf16 has its own only where it has its own units.
  EXPECT_EQ(machine::peak_cache_key(2, Precision::kFp16), key);
  EXPECT_EQ(machine::peak_cache_key(2, Precision::kBf16) == key,
            kernels::peak_precision(Precision::kBf16) == Precision::kFp32);
  machine::record_gemm_peak_gflops(2, 120.0);
  machine::record_gemm_peak_gflops(2, 90.0);
  EXPECT_DOUBLE_EQ(machine::cached_gemm_peak_gflops(2, false), 120.0);
  machine::record_gemm_peak_gflops(2, 150.0);
  EXPECT_DOUBLE_EQ(machine::cached_gemm_peak_gflops(2, false), 150.0);
  EXPECT_DOUBLE_EQ(cache()[key].get<double>(), 150.0);
}

// A step faster than the peak proves the peak stale: the MFU is capped at 1 and the peak
// raised to at least the achieved rate; a measured peak is measured again and recorded.
TEST_F(PeakCache, AStepAboveThePeakRaisesItAndMfuStaysAtMostOne) {
  using kernels::Precision;
  bool raised = true;
  double peak = 100;
  EXPECT_DOUBLE_EQ(machine::honest_mfu(60, &peak, 1, Precision::kFp32, true, &raised), 0.6);
  EXPECT_FALSE(raised);
  EXPECT_DOUBLE_EQ(peak, 100);
  // A user-given peak (--peak-gflops) is raised to the achieved rate, not measured or cached.
  peak = 50;
  EXPECT_DOUBLE_EQ(machine::honest_mfu(80, &peak, 1, Precision::kFp32, false, &raised), 1.0);
  EXPECT_TRUE(raised);
  EXPECT_DOUBLE_EQ(peak, 80);
  EXPECT_FALSE(fs::exists(dir_ / "peak.json"));
  // A measured one is measured again (a real GEMM on one thread) and recorded.
  peak = 0.001;
  const double mfu = machine::honest_mfu(0.002, &peak, 1, Precision::kFp32, true, &raised);
  EXPECT_TRUE(raised);
  EXPECT_GT(peak, 1.0) << "measured again: any CPU runs sgemm above 1 GFLOP/s";
  EXPECT_LE(mfu, 1.0);
  EXPECT_DOUBLE_EQ(cache()[machine::peak_cache_key(1, Precision::kFp32)].get<double>(), peak);
}

}  // namespace
}  // namespace meshtrain::test_machine
