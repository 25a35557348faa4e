#include "train/activation_table.h"

#include <cstdio>

#include "comm/shape_group.h"
#include "model/gpt.h"

namespace meshtrain::train {

namespace {

int64_t stored_bytes(model::GptConfig c, int layers, int B, int T, int tp, bool sp,
                     const std::string& recompute) {
  c.layers = layers;
  comm::ShapeOnlyGroup group(tp, 0, "tp");
  model::Gpt gpt(c, model::Gpt::LocalState::kNone, &group, sp);
  gpt.set_recompute(recompute == "full"        ? model::Recompute::kFull
                    : recompute == "selective" ? model::Recompute::kSelective
                                               : model::Recompute::kNone);
  return gpt.stored_activation_bytes(B, T);
}

}  // namespace

int64_t measured_layer_activation_bytes(const model::GptConfig& config, int B, int T, int tp,
                                        bool sp, const std::string& recompute) {
  // Full recomputation keeps one shared scratch block whatever L is: compare 3 and 2 layers.
  return stored_bytes(config, 3, B, T, tp, sp, recompute) -
         stored_bytes(config, 2, B, T, tp, sp, recompute);
}

std::string activation_table(const model::GptConfig& c, int B, int T, int tp) {
  const double s = T, b = B, h = c.dim, a = c.heads, t = tp;
  const double sbh = s * b * h;
  struct Row {
    const char* name;
    int tp;
    bool sp;
    const char* recompute;
    double paper;  // bytes, 16-bit activations
    const char* formula;
  };
  const Row rows[] = {
      {"no parallelism", 1, false, "none", sbh * (34 + 5 * a * s / h), "sbh(34 + 5as/h)"},
      {"tensor parallel", tp, false, "none", sbh * (10 + 24 / t + 5 * a * s / (h * t)),
       "sbh(10 + 24/t + 5as/(ht))"},
      {"tensor + sequence parallel", tp, true, "none", sbh / t * (34 + 5 * a * s / h),
       "sbh/t (34 + 5as/h)"},
      {"tensor parallel + selective", tp, false, "selective", sbh * (10 + 24 / t), "sbh(10 + 24/t)"},
      {"tensor + sequence + selective", tp, true, "selective", 34 * sbh / t, "34 sbh/t"},
      {"full recompute", 1, false, "full", 2 * sbh, "2 sbh"},
  };
  char line[512];
  std::string out;
  std::snprintf(line, sizeof line,
                "s = %d (seq-len), b = %d (micro-batch), h = %d, a = %d heads, t = %d\n\n", T, B,
                c.dim, c.heads, tp);
  out += line;
  out += "| layout | measured fp32 bytes/layer | measured at 2 bytes/value | Korthikanti et al. "
         "(16-bit) | formula | measured / paper |\n|---|---|---|---|---|---|\n";
  for (const Row& r : rows) {
    const int64_t measured = measured_layer_activation_bytes(c, B, T, r.tp, r.sp, r.recompute);
    std::snprintf(line, sizeof line, "| %s | %lld | %lld | %.0f | %s | %.3f |\n", r.name,
                  (long long)measured, (long long)(measured / 2), r.paper, r.formula,
                  (measured / 2.0) / r.paper);
    out += line;
  }
  return out;
}

}  // namespace meshtrain::train
