// Model shapes to plan for: the engine's presets (tiny, gpt2-124m, ...) and published
// large models, as GPT blocks (attention + 4h MLP, learned positions, tied embedding).
#pragma once
#include <string>
#include <vector>

#include "core/status.h"
#include "planner/time_model.h"

namespace meshtrain::planner {

// gpt3-1.3b, gpt3-13b, gpt3-175b (Brown et al. 2020, Table 2.1: L, h, heads; s = 2048;
// V = 51200, Megatron's padded GPT-2 vocabulary; the table prints h = 5140 for 13B, which
// its 40 heads do not divide, so 5120 is used), megatron-1t (Narayanan et al. 2021,
// Table 1), llama-7b, llama-13b, llama-70b (Touvron et al. 2023: L, h, heads, s = 4096,
// V = 32000). LLaMA's SwiGLU MLP (three matrices of width 8h/3, rounded) has about the
// parameters and FLOPs of a 4h GELU MLP, and its grouped-query attention (70B) is counted
// as full multi-head attention: these are GPT-shaped stand-ins, within a few percent in
// parameters (docs/planning.md). Engine presets resolve through model::preset_config.
Status planning_model(const std::string& name, ModelShape* out);
std::vector<std::string> planning_model_names();

}  // namespace meshtrain::planner
