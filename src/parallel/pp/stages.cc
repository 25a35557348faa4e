#include "parallel/pp/stages.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <string>

namespace meshtrain::parallel::pp {

double layer_cost(const model::GptConfig& c, int B, int T) {
  const double N = (double)B * T, C = c.dim;
  const double weights = C * ((double)c.qkv_dim() + C + c.fc_dim() + c.ffn());  // q k v, o, MLP in and out
  return 2.0 * N * weights + 2.0 * N * T * C;  // the linears, causal attention
}

double head_cost(const model::GptConfig& c, int B, int T) {
  return 2.0 * B * T * (double)c.dim * c.vocab;
}

Status split_layers(const model::GptConfig& c, int B, int T, int stages,
                    const std::vector<int>& requested, std::vector<int>* out) {
  return split_layers(c.layers, stages, {layer_cost(c, B, T), 0, head_cost(c, B, T)}, requested, out);
}

std::string stage_count_error(int layers, int stages) {
  if (stages <= layers) return "";
  return "the pipeline has " + std::to_string(stages) + " stages (--pp x --virtual-stages) but the model only " +
         std::to_string(layers) + " layers; every stage needs at least one";
}

Status split_layers(int L, int stages, const StageCosts& costs, const std::vector<int>& requested,
                    std::vector<int>* out) {
  if (stages < 1) return Status::error("the pipeline needs at least one stage");
  if (std::string why = stage_count_error(L, stages); !why.empty()) return Status::error(why);
  if (!requested.empty()) {
    if ((int)requested.size() != stages)
      return Status::error("--stage-layers lists " + std::to_string(requested.size()) +
                           " stages, the pipeline has " + std::to_string(stages) +
                           " (--pp x --virtual-stages)");
    if (*std::min_element(requested.begin(), requested.end()) < 1)
      return Status::error("--stage-layers: every stage needs at least one layer");
    const int sum = std::accumulate(requested.begin(), requested.end(), 0);
    if (sum != L)
      return Status::error("--stage-layers sums to " + std::to_string(sum) + " layers, the model has " +
                           std::to_string(L));
    *out = requested;
    return Status::ok();
  }
  // best[s][l]: the smallest possible most-expensive stage when the first s stages hold the
  // first l layers.
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(stages + 1, std::vector<double>(L + 1, inf));
  std::vector<std::vector<int>> cut(stages + 1, std::vector<int>(L + 1, 0));
  best[0][0] = 0;
  for (int s = 1; s <= stages; s++)
    for (int l = s; l <= L; l++)
      for (int k = s - 1; k < l; k++) {  // stage s holds layers [k, l)
        const double cost = (l - k) * costs.layer + (s == 1 ? costs.first : 0.0) + (s == stages ? costs.last : 0.0);
        const double worst = std::max(best[s - 1][k], cost);
        // Ties keep the earliest cut: earlier stages get fewer layers.
        if (worst < best[s][l]) best[s][l] = worst, cut[s][l] = k;
      }
  out->assign(stages, 0);
  for (int s = stages, l = L; s >= 1; l = cut[s][l], s--) (*out)[s - 1] = l - cut[s][l];
  return Status::ok();
}

model::ModelPart rank_part(const std::vector<int>& layers_per_stage, int p, int rank, ScheduleKind kind) {
  const int stages = (int)layers_per_stage.size(), v = stages / p;
  std::vector<int> first(stages + 1, 0);
  for (int s = 0; s < stages; s++) first[s + 1] = first[s] + layers_per_stage[s];
  model::ModelPart part;
  for (int c = 0; c < v; c++) {
    const int s = stage_of(kind, p, v, rank, c);
    part.chunks.push_back({first[s], first[s + 1]});
  }
  return part;
}

}  // namespace meshtrain::parallel::pp
