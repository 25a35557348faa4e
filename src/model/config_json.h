// The model record as JSON, for checkpoint indexes and run folders: the shape, and the
// architecture's parts. Indexes written before the parts existed have none: GPT-2's.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "model/config.h"

namespace meshtrain::model {

// {"layers", "heads", "dim", "max_seq_len", "vocab", "arch", and the parts: "kv_heads",
// "ffn_dim", "norm" ("layernorm"|"rmsnorm"), "norm_eps", "positions" ("learned"|"rope"),
// "rope_theta", "rope_scaling" ({factor, low_freq_factor, high_freq_factor,
// original_positions}), "mlp" ("gelu"|"swiglu"), "bias", "tied_head"}.
nlohmann::json config_json(const GptConfig& c);
// Reads the parts config_json writes into *c (absent ones keep c's values), each checked for
// its type and range; `at` names the object in messages.
Status read_architecture(const nlohmann::json& m, const std::string& at, GptConfig* c);
// Whether two records describe the same model (shape and every part).
bool same_model(const GptConfig& a, const GptConfig& b);
// What makes `run` another model than `saved` (a checkpoint's), one line per field, named by
// the train flag that sets it: "--dim 96 differs from the checkpoint's 64". A width that
// follows from another field (ffn_dim from dim, kv_heads from heads) is left out when both
// models derive it; empty for the same model.
std::vector<std::string> model_differences(const GptConfig& run, const GptConfig& saved);

}  // namespace meshtrain::model
