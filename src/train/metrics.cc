#include "train/metrics.h"

#include <cerrno>
#include <cstring>
#include <fstream>

namespace meshtrain::train {

MetricsWriter::~MetricsWriter() {
  if (file_) std::fclose(file_);
}

Status MetricsWriter::open(const std::string& path, int64_t resume_step) {
  if (path.empty()) return Status::ok();
  std::string kept;
  if (resume_step >= 0) {
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line)) {
      try {
        if (nlohmann::json::parse(line).value("step", int64_t{0}) <= resume_step) kept += line + "\n";
      } catch (...) {
        // A line cut short by the crash: dropped.
      }
    }
  }
  file_ = std::fopen(path.c_str(), "w");
  if (!file_) return Status::error("cannot open " + path + ": " + std::strerror(errno));
  std::fwrite(kept.data(), 1, kept.size(), file_);
  std::fflush(file_);
  return Status::ok();
}

void MetricsWriter::write(const nlohmann::json& record) {
  if (!file_) return;
  std::string line = record.dump() + "\n";
  std::fwrite(line.data(), 1, line.size(), file_);
  std::fflush(file_);
}

nlohmann::json memory_json(const MemStats& stats) {
  nlohmann::json out = nlohmann::json::object();
  for (int i = 0; i < kNumMemCategories; i++)
    out[std::string(mem_category_name(static_cast<MemCategory>(i)))] = stats.peak[i];
  out["total"] = stats.total_peak;
  return out;
}

}  // namespace meshtrain::train
