#include "model/recompute.h"

namespace meshtrain::model {

const char* recompute_name(Recompute r) {
  switch (r) {
    case Recompute::kNone:
      return "none";
    case Recompute::kSelective:
      return "selective";
    case Recompute::kFull:
      return "full";
  }
  return "?";
}

Status parse_recompute(const std::string& name, Recompute* out) {
  for (Recompute r : {Recompute::kNone, Recompute::kSelective, Recompute::kFull})
    if (name == recompute_name(r)) return *out = r, Status::ok();
  return Status::error("unknown recompute mode '" + name + "' (choose none, selective or full)");
}

}  // namespace meshtrain::model
