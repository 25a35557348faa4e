// Activation recomputation (Korthikanti et al. 2022), one enum for the engine and the
// planner. What each mode keeps is in model/gpt.h (ActivationInventory).
#pragma once
#include <string>

#include "core/status.h"

namespace meshtrain::model {

// kNone: every activation stored; kSelective: the attention core recomputed from the stored
// qkv; kFull: only each block's input stored, the whole block recomputed in backward.
enum class Recompute { kNone, kSelective, kFull };

const char* recompute_name(Recompute r);  // "none", "selective", "full"
Status parse_recompute(const std::string& name, Recompute* out);

}  // namespace meshtrain::model
