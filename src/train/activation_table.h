// Activation memory per transformer layer, measured by the tracker for each layout, beside
// Korthikanti et al. 2022's Table 2 formulas (16-bit activations). `meshtrain bench
// activations` prints it; docs/activations.md holds its output.
#pragma once
#include <string>

#include "model/config.h"

namespace meshtrain::train {

// Bytes kept for backward by one layer of tensor-parallel rank 0, measured as the
// difference between a (L+1)-layer and an L-layer model's stored activations.
int64_t measured_layer_activation_bytes(const model::GptConfig& config, int B, int T, int tp,
                                        bool sp, const std::string& recompute);

// Markdown table: layouts none, tp, tp+sp, tp+selective, tp+sp+selective, full.
std::string activation_table(const model::GptConfig& config, int B, int T, int tp);

}  // namespace meshtrain::train
