// The model record as JSON, for checkpoint indexes and run folders: the shape, and the
// architecture's parts. Indexes written before the parts existed have none: GPT-2's.
#pragma once
#include <string>

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

}  // namespace meshtrain::model
