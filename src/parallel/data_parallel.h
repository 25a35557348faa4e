// Data parallelism and ZeRO stages 0-3 over one data-parallel group, as a ParamStore that
// the model calls unit by unit. Memory per rank for P parameters and N ranks (fp32, up to
// the per-unit shard padding documented in docs/parallelism.md):
//   stage 0: params 4P, grads 4P, optim 8P       (all-reduce of gradient buckets)
//   stage 1: params 4P, grads 4P, optim 8P/N     (reduce-scatter, shard update, all-gather)
//   stage 2: params 4P, grads 4P/N, optim 8P/N   (per-unit staging buffers in "comm")
//   stage 3: params 4P/N, grads 4P/N, optim 8P/N (units gathered into "gathered" on use)
// Reductions start as soon as a unit's (or bucket's) gradients are final, so they overlap
// the backward pass of earlier units; stages 0-1 reduce a unit only after its last
// micro-batch (a unit is final once it has been released once per micro-batch of the step,
// which holds for any pipeline schedule's order of backward passes).
#pragma once
#include <memory>
#include <vector>

#include "comm/group.h"
#include "model/gpt.h"
#include "optim/adamw.h"
#include "parallel/shard_layout.h"

namespace meshtrain::parallel {

struct DpConfig {
  int zero_stage = 0;
  double bucket_mb = 25;  // stage 0: gradient bucket size
  bool overlap = true;    // false: start every reduction after backward (for measuring)
};

// The full buffers a model keeps locally at a ZeRO stage.
model::Gpt::LocalState model_state_for_stage(int zero_stage);

class DataParallel : public model::ParamStore {
 public:
  // `gpt` must own what the stage keeps full (model_state_for_stage); for stage 3 the
  // initial parameters are taken from `full_params` (every rank passes the same values).
  // `tp` (may be null) is the tensor-parallel group, for the global gradient norm.
  DataParallel(model::Gpt& gpt, comm::Group& dp, const DpConfig& config,
               const optim::AdamWConfig& adamw, const float* full_params = nullptr,
               comm::Group* tp = nullptr);
  ~DataParallel() override;

  int stage() const { return config_.zero_stage; }
  const ShardLayout& shards() const { return shards_; }
  optim::AdamW& adamw() { return *adamw_; }
  const optim::AdamW& adamw() const { return *adamw_; }
  // Stage 3's parameter shard (local layout); stages 0-2 keep full params in the model.
  float* param_shard() { return param_shard_.data(); }

  // Pipeline: this rank's part holds the embedding unit as the first or the last stage, and
  // `tied_peer` (its rank in `pp`) holds the other copy (the LM head is the tied wte). The
  // two copies' reduced gradients are summed in finish_reductions(), so both stay equal
  // after the update; the last stage's copy is left out of the gradient norm, which is
  // reduced over `pp` as well. tied_peer < 0: no copy elsewhere.
  void set_pipeline(comm::Group* pp, int tied_peer);

  // --- one optimizer step ---
  void begin_step(int micro_batches);  // zeroes gradients
  void end_micro_batch();              // waits for the reductions started so far
  void finish_reductions();            // after the last backward: every reduction done
  // Global L2 norm of the reduced gradient over dp and tp, tp-replicated parameters
  // counted once.
  double grad_norm();
  // Clips on the global norm; with a loss scale S (norm then of the scaled gradients) the
  // gradients are also divided by S.
  void clip(double norm, float max_norm, double loss_scale = 1.0);
  void optimizer_step(float lr, int t);

  // --- ParamStore ---
  void begin_pass(model::Pass pass) override { pass_ = pass; }
  const float* acquire_params(int u) override;
  void release_params(int u) override;
  float* acquire_grads(int u) override;
  void release_grads(int u) override;

 private:
  struct Pending {
    int unit = -1;
    comm::RequestPtr request;
    Buffer<float> send, recv;  // staging (comm)
  };
  struct Gathered {
    Buffer<float> data;  // padded unit (gathered)
    comm::RequestPtr request;
    int refs = 0;
  };

  void build_buckets();
  void start_bucket(size_t b);
  void start_unit_reduce_scatter(int u, const float* unit_grads, bool own_copy);
  void retire(Pending& p);
  void wait_pending();
  void zero_grads();
  void sum_tied_embedding();
  // This rank's reduced gradient of unit u: the whole unit (stage 0), or its owned shard.
  float* reduced_grads(int u, size_t* n);
  Gathered& gather(int u);
  int next_unit(int u) const;
  float* full_grads() { return gpt_.grads(); }
  float* full_params() { return gpt_.params(); }

  model::Gpt& gpt_;
  comm::Group& dp_;
  comm::Group* tp_;
  DpConfig config_;
  const model::ParamLayout& layout_;
  ShardLayout shards_;
  std::unique_ptr<optim::AdamW> adamw_;
  model::Pass pass_ = model::Pass::kForward;
  int micro_batches_ = 1;
  std::vector<int> released_;  // per unit: micro-batches whose gradients were released
  comm::Group* pp_ = nullptr;
  int tied_peer_ = -1;

  Buffer<float> grad_shard_;   // stages 2-3 (grads)
  Buffer<float> param_shard_;  // stage 3 (params)
  std::vector<Buffer<float>> grad_staging_;  // stages 2-3: per unit, while in backward
  std::vector<std::unique_ptr<Gathered>> gathered_;  // stage 3: per unit
  std::vector<Pending> pending_;

  // Stage 0 buckets: runs of units in backward order (contiguous in memory).
  struct Bucket {
    std::vector<int> units;
    size_t begin = 0, end = 0;
    int ready = 0;
  };
  std::vector<Bucket> buckets_;
  std::vector<int> bucket_of_unit_;
  std::vector<comm::RequestPtr> bucket_requests_;
};

}  // namespace meshtrain::parallel
