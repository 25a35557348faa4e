// GPT-2 model shape and its validation.
#pragma once
#include <cstdint>
#include <string>

#include "core/status.h"

namespace meshtrain::model {

struct GptConfig {
  int layers = 2;
  int heads = 4;
  int dim = 128;
  int max_seq_len = 64;  // rows of the position embedding
  int vocab = 50257;
  // The token embedding is stored with this many rows (a multiple of 128, as llm.c);
  // rows >= vocab are zero and never produce logits.
  int padded_vocab() const { return (vocab + 127) / 128 * 128; }
  int head_dim() const { return dim / heads; }
};

// Known presets: tiny, gpt2-124m, gpt2-350m. Returns an error naming the choices.
Status preset_config(const std::string& name, GptConfig* out);

// Rejects shapes the engine cannot run, with a message naming the problem.
Status validate(const GptConfig& c);

// Rejects a tensor-parallel size that does not divide heads, 4*dim or the padded vocabulary.
Status validate_tp(const GptConfig& c, int tp);

// Parameters as a user counts them: the tied head once, padding rows excluded.
int64_t num_parameters(const GptConfig& c);

}  // namespace meshtrain::model
