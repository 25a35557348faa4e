#include "train/metrics.h"

#include <cerrno>
#include <cstring>

namespace meshtrain::train {

MetricsWriter::~MetricsWriter() {
  if (file_) std::fclose(file_);
}

Status MetricsWriter::open(const std::string& path, bool append) {
  if (path.empty()) return Status::ok();
  file_ = std::fopen(path.c_str(), append ? "a" : "w");
  if (!file_) return Status::error("cannot open " + path + ": " + std::strerror(errno));
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
