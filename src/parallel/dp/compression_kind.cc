// The compressors' names, apart from the compressors: the layout's rules and the parsers
// name them without linking the reductions (the fuzz targets link these alone).
#include "parallel/dp/compressed_reduce.h"

namespace meshtrain::parallel {

Status parse_compression_kind(const std::string& name, Compression::Kind* out) {
  if (name == "none") return *out = Compression::Kind::kNone, Status::ok();
  if (name == "powersgd") return *out = Compression::Kind::kPowerSgd, Status::ok();
  if (name == "onebit-adam") return *out = Compression::Kind::kOneBitAdam, Status::ok();
  return Status::error("--compress must be none, powersgd or onebit-adam, got '" + name + "'");
}

const char* compression_name(Compression::Kind kind) {
  switch (kind) {
    case Compression::Kind::kPowerSgd: return "powersgd";
    case Compression::Kind::kOneBitAdam: return "onebit-adam";
    default: return "none";
  }
}

}  // namespace meshtrain::parallel
