// One training step (train_step), evaluation, and the training loop (run_training, in
// loop.cc: data, model, optimizer, metrics, eval, checkpoints).
#pragma once
#include <vector>

#include "core/status.h"
#include "comm/group.h"
#include "data/loader.h"
#include "model/gpt.h"
#include "optim/adamw.h"
#include "optim/loss_scale.h"
#include "parallel/data_parallel.h"
#include "parallel/pp/executor.h"
#include "train/console.h"
#include "train/options.h"
#include "train/reporter.h"

namespace meshtrain::train {

struct TrainResult {
  std::vector<float> losses;      // per optimizer step run in this call
  std::vector<float> grad_norms;
  float final_val_loss = -1;      // -1 when no validation ran
  int interrupted_by = 0;         // SIGINT or SIGTERM stopped it between steps (0: it ran to the end)
  bool stopped_by_request = false;  // a RunSubscriber answered Reply::kStop (reporter.h)
};

struct BatchShape {
  int B = 1, A = 1, T = 1;  // micro-batch rows, micro-batches per step, sequence length
  int dp = 1, dp_rank = 0;  // data-parallel ranks share the global batch
  // This step's row length when a curriculum cuts rows short (train/curriculum.h): the
  // first L tokens of each T-token window; 0: T.
  int L = 0;
  int length() const { return L > 0 ? L : T; }
  int G() const { return B * A * dp; }
  int first_row() const { return dp_rank * B * A; }  // this rank's rows of the global batch
};

struct StepResult {
  float loss = 0;  // mean over the G*L tokens of the step
  double grad_norm = 0;  // before clipping (of the unscaled gradients); inf/NaN on overflow
  float lr = 0;
  double loss_scale = 1;  // the scale this step's backward used
  bool skipped = false;   // fp16 overflow, or a non-finite step skipped: no update
  std::string nonfinite;  // a non-finite step: what was not finite and in which units
  Status status;          // the loss scaler gave up (stuck at its floor), or --on-nonfinite stop
};

// --on-nonfinite, for runs without a loss scaler (fp32, bf16): a step whose loss or
// gradient norm is not finite is reported with the units whose gradients are not, then
// stops the run before the update or is skipped (no update; AdamW's t counts applied
// steps). Every rank reaches the same verdict (the norm is reduced over every axis).
struct NonfinitePolicy {
  bool skip = false;
  int64_t skipped = 0;     // steps skipped so far (kept in the checkpoint's train_state)
  comm::Group* world = nullptr;  // locates the units (one all-reduce, on a non-finite step only)
};

// Points of a step where a test may act (debug_hooks.h holds the command's testing aids).
// Both are called on every rank, with k the 0-based step.
class StepHooks {
 public:
  virtual ~StepHooks() = default;
  // The loop announced step k + 1 (comm::set_current_step) and has done nothing else for it.
  virtual void before_step(int64_t /*k*/) {}
  // train_step: the gradients are reduced; the norm, the overflow checks and the update follow.
  virtual void before_update(int64_t /*k*/, parallel::DataParallel& /*dp*/) {}
};

// One optimizer step k over the G rows of the global batch: this rank's A micro-batches
// of B rows of shape.length() tokens, gradients accumulated and reduced by `dp`, clipped on
// the global norm, AdamW at learning rate `lr` (the caller's schedule: by steps,
// optim::learning_rate, or by tokens). The loss is the mean over all G*L tokens (reduced over dp, and over
// the pipeline when `pipeline` runs the micro-batches through this rank's stages).
// With a loss `scaler` (fp16) the backward runs on the loss times its scale, the gradients
// are unscaled while clipping, and a step whose gradients overflowed anywhere is skipped
// (AdamW's step count t counts applied steps only, as torch's GradScaler leaves it).
// Under 2bw (dp keeps weight versions) the micro-batches compute with the weights before
// the last update, and with a pipeline the step's lists run on into step k + 1's first
// micro-batches when `more_steps` says one follows. `hooks`: testing (StepHooks).
StepResult train_step(model::Gpt& gpt, parallel::DataParallel& dp, comm::Group& dp_group,
                      const optim::AdamWConfig& cfg, const data::TokenLoader& data,
                      const BatchShape& shape, int64_t k, float lr,
                      parallel::pp::PipelineExecutor* pipeline = nullptr,
                      optim::DynamicLossScaler* scaler = nullptr, NonfinitePolicy* nonfinite = nullptr,
                      bool more_steps = false, StepHooks* hooks = nullptr);
// The same at the schedule by steps of a `total_steps`-step run (optim::learning_rate).
StepResult train_step(model::Gpt& gpt, parallel::DataParallel& dp, comm::Group& dp_group,
                      const optim::AdamWConfig& cfg, const data::TokenLoader& data,
                      const BatchShape& shape, int64_t k, int total_steps,
                      parallel::pp::PipelineExecutor* pipeline = nullptr,
                      optim::DynamicLossScaler* scaler = nullptr, NonfinitePolicy* nonfinite = nullptr,
                      bool more_steps = false);

// Mean loss over the first `batches` windows of B rows x T tokens of `data` (fewer if the
// file holds fewer).
// With a pipeline, every rank runs its stages and every rank gets the loss.
float evaluate_loss(model::Gpt& gpt, const data::TokenLoader& data, int B, int T, int batches,
                    parallel::pp::PipelineExecutor* pipeline = nullptr);

// Validates everything before any work, on every rank; then trains. `world` is the job's
// world group (a one-rank group when not under MPI). Errors carry a user-facing message.
// The run's text goes to `console` (world rank 0's, unless --quiet); its events go to the
// built-in subscribers (console, metrics.jsonl, trace) and to `subscriber` when given,
// which may ask the run to stop (reporter.h).
Status run_training(const TrainOptions& options, comm::Group& world, const Console& console,
                    TrainResult* result = nullptr, RunSubscriber* subscriber = nullptr);

}  // namespace meshtrain::train
