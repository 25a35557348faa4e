// GPT-2's initialisation (Gpt::init_weights) drawn one tensor at a time: N(0, 0.02), the
// residual projections N(0, 0.02 / sqrt(2L)), norm weights one, biases and padded
// vocabulary rows zero, every tensor from one seeded generator in the whole model's tensor
// order. InitialWeights hands out a rank's units (its tensor-parallel slice, its pipeline
// stages) one at a time with the values the whole model's initialisation gives them, so a
// model larger than memory can be initialised unit by unit (ZeRO-Infinity).
#pragma once
#include <cstdint>
#include <random>
#include <vector>

#include "model/param_layout.h"

namespace meshtrain::model {

// Draws whole-model tensor t (of the whole model's `layout`) into w (t.numel floats),
// advancing rng as the whole model's initialisation does.
void draw_initial_tensor(const GptConfig& config, const ParamLayout& layout, const ParamTensor& t,
                         std::mt19937_64& rng, float* w);

class InitialWeights {
 public:
  InitialWeights(const GptConfig& config, uint64_t seed);
  // Unit u of `layout` (any tp rank's or pipeline part's layout of the same model) into
  // out (the unit's numel floats). Asking in unit order draws every tensor once; a unit
  // before the last one asked for starts the generator again.
  void unit(const ParamLayout& layout, int u, float* out);

 private:
  void draw_until(size_t index);  // draws whole tensors up to `index` (into scratch_)

  GptConfig config_;
  uint64_t seed_;
  ParamLayout whole_;
  std::mt19937_64 rng_;
  size_t next_ = 0;  // the next whole tensor the generator would draw
  std::vector<float> scratch_;
};

}  // namespace meshtrain::model
