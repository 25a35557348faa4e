#include "train/trainer.h"

#include "data/training_data.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/profile.h"
#include "trace/trace.h"

namespace meshtrain::train {

using nlohmann::json;

float evaluate_loss(model::Gpt& gpt, const data::TokenLoader& data, int B, int T, int batches,
                    parallel::pp::PipelineExecutor* pipeline) {
  // Evaluation runs without dropout.
  struct NoDropout {
    model::Gpt& g;
    float p;
    ~NoDropout() { g.set_dropout(p, 0); }
  } restore{gpt, gpt.dropout_probability()};
  gpt.set_dropout(0, 0);
  const int64_t n = std::min<int64_t>(batches, data.windows(B, T));
  std::vector<int> inputs((size_t)B * T), targets((size_t)B * T);
  double sum = 0;
  for (int64_t k = 0; k < n; k++) {
    data.fill(k, B, T, 0, B, inputs.data(), targets.data());
    sum += pipeline ? pipeline->forward_only(inputs.data(), targets.data(), B, T)
                    : gpt.forward(inputs.data(), targets.data(), B, T);
  }
  return (float)(sum / n);
}

namespace {

// What a non-finite step's report says: the loss and norm, and the units whose gradients
// hold a NaN or an infinity on any rank (one all-reduce over the world).
std::string describe_nonfinite(const model::GptConfig& c, parallel::DataParallel& dp, comm::Group& world,
                               float loss, double norm) {
  const int units = model::final_unit_id(c) + 1;
  std::vector<double> flags = dp.nonfinite_units(units);
  world.all_reduce_f64(flags.data(), flags.size(), comm::ReduceOp::kMax);
  std::vector<std::string> names;
  for (int u = 0; u < units; u++)
    if (flags[u] > 0) names.push_back(model::unit_name(c, u));
  char head[96];
  std::snprintf(head, sizeof head, "the loss is %g and the gradient norm %g", (double)loss, norm);
  std::string out = head;
  if (names.empty()) return out + " (every unit's gradient is finite)";
  out += "; not finite: the gradient of " + names[0];
  constexpr size_t kNamed = 4;
  for (size_t i = 1; i < std::min(names.size(), kNamed); i++) out += ", " + names[i];
  if (names.size() > kNamed) out += " and " + std::to_string(names.size() - kNamed) + " more units";
  return out;
}

}  // namespace

StepResult train_step(model::Gpt& gpt, parallel::DataParallel& dp, comm::Group& dp_group,
                      const optim::AdamWConfig& cfg, const data::TokenLoader& data,
                      const BatchShape& shape, int64_t k, float lr,
                      parallel::pp::PipelineExecutor* pipeline, optim::DynamicLossScaler* scaler,
                      NonfinitePolicy* nonfinite, bool more_steps, StepHooks* hooks) {
  // T places the rows (the data windows and the dropout positions); L is what is trained.
  const int B = shape.B, T = shape.T, L = shape.length(), G = shape.G();
  const double S = scaler ? scaler->scale() : 1.0;
  const float loss_scale = (float)(S / ((double)G * L));
  // Micro-batch a of this rank: rows first_row + a*B of the step's global batch.
  auto row = [&](int a) { return shape.first_row() + a * B; };
  dp.set_step(k);
  dp.begin_step(shape.A);
  double loss_sum = 0;  // sum of token losses over this rank's rows
  if (pipeline) {
    parallel::pp::MicroBatches mbs{
        [&](int a, int* inputs, int* targets) { data.fill(k, G, T, row(a), B, L, inputs, targets); },
        [&](int a) { return (int64_t)row(a) * T; }, nullptr};
    if (more_steps)  // 2bw's lists reach into the next step (same shape: no curriculum)
      mbs.fill_next = [&](int a, int* inputs, int* targets) { data.fill(k + 1, G, T, row(a), B, L, inputs, targets); };
    loss_sum = pipeline->train_step(shape.A, B, L, k, mbs, loss_scale, dp);
  } else {
    std::vector<int> inputs((size_t)B * L), targets((size_t)B * L);
    gpt.param_store()->use_weights(model::WeightVersion::kPrevious);  // a store with one version: the current
    for (int a = 0; a < shape.A; a++) {
      data.fill(k, G, T, row(a), B, L, inputs.data(), targets.data());
      gpt.set_batch_position(k, (int64_t)row(a) * T);
      const json where = {{"step", k + 1}, {"mb", a}, {"chunk", 0}};
      {
        trace::Tracer::Span span(trace::Lane::kCompute, parallel::pp::span_name('F', a, 0, 1),
                                 trace::category::kForward, where);
        loss_sum += (double)gpt.forward(inputs.data(), targets.data(), B, L) * B * L;
      }
      {
        trace::Tracer::Span span(trace::Lane::kCompute, parallel::pp::span_name('B', a, 0, 1),
                                 trace::category::kBackward, where);
        gpt.backward(loss_scale);
      }
      dp.end_micro_batch();
    }
    gpt.param_store()->use_weights(model::WeightVersion::kCurrent);
  }
  dp.finish_reductions();
  dp.advance_weight_versions();  // 2bw: the weights this update starts from are the next step's
  dp_group.all_reduce_f64(&loss_sum, 1, comm::ReduceOp::kSum);
  StepResult r;
  r.loss = (float)(loss_sum / ((double)G * L));
  trace::Tracer::Span span(trace::Lane::kCompute, "optimizer", trace::category::kOptimizer, {{"step", k + 1}});
  const profile::Scope optimizer(profile::Op::kOptimizer, 0, dp.update_bytes());
  if (hooks) hooks->before_update(k, dp);
  // The norm is reduced over every axis, so every rank reaches the same overflow verdict.
  const double norm = dp.grad_norm();
  r.grad_norm = norm / S;
  r.loss_scale = S;
  r.lr = lr;
  const int64_t applied = k - (scaler ? scaler->skipped_steps() : nonfinite ? nonfinite->skipped : 0);  // updates so far
  if (scaler) {
    r.skipped = !std::isfinite(norm);
    r.status = scaler->update(r.skipped);
    if (r.skipped) return r;
  } else if (nonfinite && !(std::isfinite(norm) && std::isfinite(r.loss))) {
    r.skipped = true;
    r.nonfinite = describe_nonfinite(gpt.config(), dp, *nonfinite->world, r.loss, norm);
    if (nonfinite->skip)
      nonfinite->skipped++;
    else
      r.status = Status::error("step " + std::to_string(k + 1) + ": " + r.nonfinite +
                               "; stopped before the update (--on-nonfinite stop; skip would go on without it)");
    return r;
  }
  dp.clip(norm, cfg.grad_clip, S);
  dp.optimizer_step(r.lr, (int)applied + 1);
  return r;
}

StepResult train_step(model::Gpt& gpt, parallel::DataParallel& dp, comm::Group& dp_group,
                      const optim::AdamWConfig& cfg, const data::TokenLoader& data,
                      const BatchShape& shape, int64_t k, int total_steps,
                      parallel::pp::PipelineExecutor* pipeline, optim::DynamicLossScaler* scaler,
                      NonfinitePolicy* nonfinite, bool more_steps) {
  return train_step(gpt, dp, dp_group, cfg, data, shape, k, optim::learning_rate(cfg, (int)k, total_steps), pipeline,
                    scaler, nonfinite, more_steps);
}

}  // namespace meshtrain::train
