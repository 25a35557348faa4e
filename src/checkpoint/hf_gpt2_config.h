// What a Hugging Face safetensors model (one file or an index's shards) describes, checked
// without loading weights: the GPT-2 shape its tensors imply, and whether its tensor table
// is exactly a model's (names, shapes, float dtypes). hf_gpt2.h reads the weights; this part
// needs no model.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/safetensors_model.h"
#include "core/status.h"
#include "model/config.h"
#include "model/param_layout.h"

namespace meshtrain::checkpoint {

// The file's name for an engine tensor: the same, or with HF's "transformer." prefix.
std::string hf_tensor_name(const SafetensorsModel& f, const std::string& name);
// A shape for messages: "[768, 2304]".
std::string shape_text(const std::vector<int64_t>& shape);
// The shape HF stores an engine tensor in: unpadded vocabulary, Conv1D weights [in, out].
std::vector<int64_t> hf_shape(const model::ParamTensor& t, int vocab);

// Layers, width, vocabulary and positions from the tensor shapes (wte [vocab, C], wpe
// [positions, C], blocks h.0 .. h.{L-1}, each dimension within int); heads from the
// metadata's "n_head" (a positive integer), else heads_hint (> 0), else C / 64. The
// shape must pass model::validate, and the tensor table must then pass check_hf_tensors.
Status infer_hf_config(const SafetensorsModel& f, int heads_hint, model::GptConfig* config);

// Every tensor of `layout` (a tp = 1 whole model of vocabulary `vocab`) is present with
// HF's shape and a float dtype (F32, F16, BF16, F64), and the file holds nothing else but
// HF's attention-mask buffers and the tied lm_head.
Status check_hf_tensors(const SafetensorsModel& f, const model::ParamLayout& layout, int vocab);

}  // namespace meshtrain::checkpoint
