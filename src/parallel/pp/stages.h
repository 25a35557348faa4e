// How the model's depth is cut into pipeline stages, and which stages a rank runs.
//
// S = p * v stages of contiguous layers; stage s runs on pipeline rank s % p as that
// rank's chunk s / p (Megatron's interleaving; v = 1 gives one stage per rank). The first
// stage also runs the embedding, the last one the final norm, the tied head and the loss.
#pragma once
#include <string>
#include <vector>

#include "core/status.h"
#include "model/config.h"
#include "model/param_layout.h"
#include "parallel/pp/schedule.h"

namespace meshtrain::parallel::pp {

// Relative forward cost of one transformer layer and of the head on a B x T micro-batch
// (matmul and attention FLOPs, for any block: GQA's narrower k and v, SwiGLU's three
// matrices; the embedding lookup is negligible).
double layer_cost(const model::GptConfig& c, int B, int T);
double head_cost(const model::GptConfig& c, int B, int T);

// What a stage's cost is made of, in any one unit: each layer, plus the first stage's
// embedding and the last stage's head and loss.
struct StageCosts {
  double layer = 1, first = 0, last = 0;
};

// Why `stages` pipeline stages cannot split `layers` layers ("" when they can): each needs
// one (a layout rule too, parallel/layout.h).
std::string stage_count_error(int layers, int stages);

// Layers per stage. `requested` (from --stage-layers) is used as given after checking it
// (S entries, each >= 1, summing to the layer count); empty: the split that minimises the
// most expensive stage; of equally good ones, the one with fewer layers early (earlier
// stages keep more micro-batches in flight under 1F1B). With a head worth a fraction of a
// layer this is Llama 3 405B's split: 126 layers on 16 stages as 7, fourteen of 8, 7.
Status split_layers(int layers, int stages, const StageCosts& costs, const std::vector<int>& requested,
                    std::vector<int>* layers_per_stage);
// The engine's model: the head counted on the last stage.
Status split_layers(const model::GptConfig& c, int B, int T, int stages,
                    const std::vector<int>& requested, std::vector<int>* layers_per_stage);

// The chunks of pipeline rank `rank` of p in chunk order: stages rank, rank + p, ... (ZB-V:
// stages rank and 2p - 1 - rank, stage_of).
model::ModelPart rank_part(const std::vector<int>& layers_per_stage, int p, int rank,
                           ScheduleKind kind = ScheduleKind::k1F1B);

}  // namespace meshtrain::parallel::pp
