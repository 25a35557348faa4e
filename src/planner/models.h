// Models to plan for: every engine preset (model::preset_config: GPT-2's, the trainable
// Llama-shaped ones, and the published Llama 2 and Llama 3 shapes, described part by part),
// and published GPT runs that only the planner needs.
#pragma once
#include <string>
#include <vector>

#include "core/status.h"
#include "model/config.h"
#include "planner/time_model.h"

namespace meshtrain::planner {

// gpt3-1.3b, gpt3-13b, gpt3-175b (Brown et al. 2020, Table 2.1: L, h, heads; s = 2048;
// V = 51200, Megatron's padded GPT-2 vocabulary; the table prints h = 5140 for 13B, which
// its 40 heads do not divide, so 5120 is used) and megatron-1t (Narayanan et al. 2021,
// Table 1): GPT blocks with Megatron's parts.
// The engine's presets plan at their pre-training sequence length: 4096 for Llama 2
// (Touvron et al. 2023), 8192 for Llama 3 (Dubey et al. 2024; the 128k of Llama 3.1 is a
// later long-context stage), max_seq_len for the others.
// A model by name: the engine's architecture record and the sequence length to plan at.
// An unknown name gets an error listing the known ones.
Status planning_config(const std::string& name, model::GptConfig* config, int* seq);
// The same as the time model sees it: model_shape(config, seq).
Status planning_model(const std::string& name, ModelShape* out);
std::vector<std::string> planning_model_names();

}  // namespace meshtrain::planner
