// One entry point for "a model" wherever it comes from: a run folder (its newest
// checkpoint), a checkpoints/step_* folder, a Hugging Face GPT-2 .safetensors file, or an
// llm.c model .bin (recognised by content, not by name).
#pragma once
#include <functional>
#include <memory>
#include <string>

#include "core/status.h"
#include "model/gpt.h"

namespace meshtrain::checkpoint {

// The file or checkpoint folder `path` stands for (a run folder becomes its newest
// checkpoint folder).
Status resolve_model_path(const std::string& path, std::string* resolved);

// The model shape stored in `path`. heads_hint (> 0) supplies the head count for files
// that do not record it (HF files without metadata); a conflicting hint is an error.
Status model_file_config(const std::string& path, int heads_hint, model::GptConfig* config);
// Loads the weights of `path` into gpt (whose shape must match).
Status load_model_file(const std::string& path, model::Gpt* gpt);
// Both: a new model with the file's shape and weights (`local`: which buffers it owns;
// inference needs no gradients).
Status open_model_file(const std::string& path, int heads_hint, std::unique_ptr<model::Gpt>* out,
                       model::Gpt::LocalState local = model::Gpt::LocalState::kParamsAndGrads);
// The parameters of `path` (whose shape is `config`) handed to `write` in pieces, elements
// [at, at + n) of the whole-model flat layout, without the whole model in memory: for
// streaming them elsewhere (ZeRO-Inference). Checkpoint folders and runs only.
Status stream_model_weights(const std::string& path, const model::GptConfig& config,
                            const std::function<Status(size_t at, size_t n, const float* values)>& write);

}  // namespace meshtrain::checkpoint
