// How attention crosses the context-parallel ranks (--cp-comm; docs/long_context.md): ring
// (K/V blocks point to point), a2a (DeepSpeed-Ulysses: heads for sequence by all-to-all),
// all-gather (every rank gathers the whole sequence's K/V and reduce-scatters their
// gradients: Llama 3's, Megatron-Core's all_gather), hybrid (a2a inside groups, ring
// across). Header-only: the layout rules read it too.
#pragma once
#include <string>

#include "core/status.h"

namespace meshtrain::model {

enum class CpComm { kRing, kA2a, kAllGather, kHybrid };

inline const char* cp_comm_name(CpComm c) {
  switch (c) {
    case CpComm::kRing: return "ring";
    case CpComm::kA2a: return "a2a";
    case CpComm::kAllGather: return "all-gather";
    case CpComm::kHybrid: return "hybrid";
  }
  return "?";
}

inline Status parse_cp_comm(const std::string& name, CpComm* out) {
  for (CpComm c : {CpComm::kRing, CpComm::kA2a, CpComm::kAllGather, CpComm::kHybrid})
    if (name == cp_comm_name(c)) return *out = c, Status::ok();
  return Status::error("--cp-comm must be ring, a2a, all-gather or hybrid, got '" + name + "'");
}

}  // namespace meshtrain::model
