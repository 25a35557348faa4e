// GPT-2 weights in Hugging Face's safetensors layout (names "wte.weight",
// "h.{i}.attn.c_attn.weight", ...; Conv1D weights stored [in, out]; unpadded vocabulary).
#pragma once
#include <memory>
#include <string>

#include "core/status.h"
#include "model/gpt.h"

namespace meshtrain::checkpoint {

// Writes the model's weights as fp32 in HF GPT-2 names and layouts, with the head count
// and shape in __metadata__. Atomic.
Status export_hf_safetensors(const model::Gpt& gpt, const std::string& path);

// Infers layers, width, vocabulary and positions from the file's tensor shapes; the head
// count comes from the file's metadata ("n_head"), else `heads_hint` (> 0), else width/64.
// Accepts an optional "transformer." prefix and ignores HF's attention-mask buffers and
// the tied lm_head. Wrong names, shapes or dtypes, or a truncated file, give a clear error
// before any model is built (the checks are listed in hf_gpt2_config.h).
Status infer_hf_config(const std::string& path, int heads_hint, model::GptConfig* config);
// Loads the weights into `gpt`, whose config must match the file (see infer_hf_config).
Status load_hf_safetensors(const std::string& path, model::Gpt* gpt);

}  // namespace meshtrain::checkpoint
