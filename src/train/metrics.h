// metrics.jsonl: one JSON object per optimizer step (and one per evaluation), flushed as
// written so a crashed run keeps its history.
#pragma once
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "core/memory.h"
#include "core/status.h"

namespace meshtrain::train {

class MetricsWriter {
 public:
  ~MetricsWriter();
  // A fresh run truncates. A run resumed at `resume_step` keeps the records of steps up to
  // it and drops later ones (written after the checkpoint by the interrupted run), so every
  // step appears once. Empty path: writes nothing.
  Status open(const std::string& path, int64_t resume_step = -1);
  void write(const nlohmann::json& record);

 private:
  std::FILE* file_ = nullptr;
};

// {"params": peak bytes, ..., "total": peak of the sum}
nlohmann::json memory_json(const MemStats& stats);

}  // namespace meshtrain::train
