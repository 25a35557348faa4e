// Data parallelism and ZeRO stages 0-3, as a ParamStore that the model calls unit by unit
// and a GradSync that the training step calls between backward passes. It composes parts
// that each do one thing and are tested alone (parallel/dp/):
//   ParamGroup          units whose gradients are reduced over one group of ranks
//   BucketAllReduce,    the gradient reducer of a group: buckets all-reduced (stage 0), or
//   ShardReduceScatter  units reduce-scattered (stages 1-3), the sums handed to a sink
//   HalfStorage         16-bit parameters and gradients (stage 3: the store holds the
//                       words), and the fp32 views of a unit
//   FileBackedShards    ZeRO-Infinity's reads ahead and gradient writes (shards in files)
//   UnitsInUse          the units handed to the model: gathered, prefetched, kept or freed
//   optim::ShardStore   the rank's shard of the model states, in memory or in files; it
//                       hands the shard to the optimizer step run by run
//   optim::AdamW        the optimizer step over one run (fp32, 16-bit with master weights,
//                       or 1-bit Adam's frozen-variance step); it holds nothing
// What stays here is the ZeRO protocol between them: which buffers a stage keeps, when a
// unit is gathered, reduced, and released, and where a run's parameters and gradients are. Memory per rank for P parameters and N ranks
// (up to the per-unit shard padding documented in docs/parallelism.md):
//            fp32 storage                  16-bit storage (bf16/fp16, fp32 master in optim)
//   stage 0: params 4P,   grads 4P,   optim 8P      2P,   2P,   12P   (bucket all-reduce)
//   stage 1: params 4P,   grads 4P,   optim 8P/N    2P,   2P,   12P/N (reduce-scatter, all-gather)
//   stage 2: params 4P,   grads 4P/N, optim 8P/N    2P,   2P/N, 12P/N (staging buffers in "comm")
//   stage 3: params 4P/N, grads 4P/N, optim 8P/N    2P/N, 2P/N, 12P/N (units gathered on use)
// With 16-bit storage (ZeRO's mixed-precision Adam, K = 12) the model holds no buffers of
// its own: a unit's parameters are widened to fp32 into "gathered" while in use (bf16: only
// its tensors that are not GEMM weights, packed; the bf16 GEMMs read the stored words), and its
// gradient is accumulated in fp32 ("workspace", or the "comm" staging of stages 2-3) and
// added into the 16-bit gradient once per micro-batch (the sum in fp32, one rounding).
// Gradients are reduced in fp32: 16-bit values are widened into the fp32 send buffer and
// the reduced result is rounded back. The optimizer updates its fp32 master weights from
// the widened gradients and writes the rounded result into the 16-bit parameters, which
// stages 1-2 all-gather as 16-bit words.
// Reductions start as soon as a unit's (or bucket's) gradients are final, so they overlap
// the backward pass of earlier units; stages 0-1 reduce a unit only after its last
// micro-batch (a unit is final once it has been released once per micro-batch of the step,
// which holds for any pipeline schedule's order of backward passes), and so do stages 2-3
// with reduce_once_per_step (pipelines: one reduce-scatter per unit per step). With
// keep_gathered, stage 3 gathers each unit once per step instead of at every use.
//
// Stage 3 and ZeRO-Infinity: the parameter and gradient shards are arrays of the
// ShardStore that holds the optimizer state (fp32 values, or a 16-bit run's words beside its fp32 master
// weights), each in memory or in a file (FileBackedShards). A file-backed parameter
// shard is read ahead of use, read_ahead units along the pass, and all-gathered from the
// read buffer: each rank reads only its own shard (bandwidth-centric partitioning). A
// reduced gradient shard is written as it retires (read, added to and written again while
// micro-batches accumulate); its sums of squares are taken on the way, so the norm needs no
// second read. The update streams parameters, gradients and optimizer state chunk by chunk
// (ShardStore::for_each_run; 16-bit: the master weights too), the clipping factor applied
// on the way. Every element sees the arithmetic of the in-memory run, so losses are bit-identical.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/group.h"
#include "model/gpt.h"
#include "optim/adamw.h"
#include "parallel/dp/compressed_reduce.h"
#include "parallel/dp/file_shards.h"
#include "parallel/dp/grad_sync.h"
#include "parallel/dp/onebit_adam.h"
#include "parallel/dp/quantized_comm.h"
#include "parallel/dp/half_storage.h"
#include "parallel/dp/reducer.h"
#include "parallel/dp/units_in_use.h"
#include "parallel/shard_layout.h"

namespace meshtrain::parallel {

// Units whose gradients are summed over one group of ranks (Megatron's and DeepSpeed's
// parameter groups; MoE's experts reduce over their expert-data-parallel group). ZeRO
// partitions each unit over its group's ranks (ShardLayout's per-unit partition), so a
// group's reduce-scatters, all-gathers and optimizer shards run on its communicator.
struct ParamGroup {
  std::string name;
  comm::Group* reduce = nullptr;  // null: the store's data-parallel group
  std::vector<int> units;         // ascending
  // Ranks that hold other parameters of this group (expert parallelism: the ep group, each
  // rank other experts): the gradient norm sums the group's part over them. Null: none.
  comm::Group* distinct = nullptr;
  // Ranks that hold the same parameters of this group and compute a part of their gradient
  // each (experts replicated over tp: the tp group, each rank on its share of the rows): the
  // parts are summed over them before the group's reduction. ZeRO still partitions over
  // `reduce` only (each replica holds the same shard), and the gradient norm counts the
  // copies once (their tensors are ParamTensor::tp_copy). Null: none.
  comm::Group* replicas = nullptr;
};

struct DpConfig {
  // The four settings every caller gives first (the rest are set by name).
  DpConfig(int zero = 0, double bucket = 25, bool overlap_reductions = true,
           kernels::Precision storage_precision = kernels::Precision::kFp32)
      : zero_stage(zero), bucket_mb(bucket), overlap(overlap_reductions), storage(storage_precision) {}
  int zero_stage = 0;
  double bucket_mb = 25;  // stage 0: gradient bucket size
  bool overlap = true;    // false: start every reduction after backward (for measuring)
  // kFp32: fp32 parameters and gradients in the model's buffers. kBf16 / kFp16: 16-bit
  // parameters and gradients in this store, fp32 master weights in the optimizer.
  kernels::Precision storage = kernels::Precision::kFp32;
  // Stages 2-3: accumulate a unit's gradient over every micro-batch of the step and
  // reduce-scatter it once (torchtitan's FSDP under pipelines), instead of once per
  // micro-batch. The unit's fp32 gradient stays whole from its first backward to its last.
  bool reduce_once_per_step = false;
  // Stage 3: a unit stays gathered from its first use in a step to the step's end (once
  // per step, while the rank's units fit), instead of being gathered for every use.
  bool keep_gathered = false;
  // Stage 3: the shards that live in files under `dir` from the start, and the
  // alignment that file-backed shards need (align_shards: set it when a shard may move to a
  // file later, as a memory budget decides).
  struct Files {
    std::string dir;
    int rank = 0;  // the world rank, for the file names
    bool params = false, grads = false;
    bool direct = true;  // O_DIRECT where the file system supports it
    int read_ahead = 2;  // parameter shards read ahead of use, in units along the pass
    bool optimizer = false;  // any stage: AdamW's moments in files from the start
    size_t chunk = 0;        // their streamed chunk, in elements
  } files;
  bool align_shards = false;
  // Every unit in exactly one group; empty: one group, "dp", of every unit.
  std::vector<ParamGroup> groups;
  // Gradient compression of the reduction (parallel/dp/compressed_reduce.h): PowerSGD at
  // stage 0, 1-bit Adam (parallel/dp/onebit_adam.h) at stages 0-1; fp32 storage, one group.
  Compression compression;
  // ZeRO++'s quantized communication (parallel/dp/quantized_comm.h): stage 3's parameter
  // gathers (qwZ, `weights`) and stages 1-3's gradient reduce-scatters (qgZ, `grads`) travel
  // as int8 blocks of `block` values with one fp32 scale each. The optimizer's state stays
  // exact: the model computes with the decoded weights, and the update is applied to the
  // exact shard. A group of one rank sends nothing and stays exact.
  QuantizedComm quantized;
  // PipeDream-2BW (the 2bw schedule): keep the weights before the last update beside the
  // current ones (stages 0-2, where every rank holds the whole parameters; with 16-bit
  // storage the 16-bit words the model computes with).
  bool weight_versions = false;
};

// Unit u's initial parameters in the model's local layout, written to `out` (the unit's
// numel floats); asked for in unit order, once each.
using InitialUnits = std::function<void(int u, float* out)>;

// The unit a model part asks for after unit u in a pass (-1: none worth fetching), and the
// first unit its backward asks for: the order a ZeRO-3 store prefetches in (and the
// planner's replay of it).
int next_unit_in_pass(const model::ParamLayout& layout, model::Pass pass, int u);
int first_backward_unit(const model::ParamLayout& layout);

// The full buffers a model keeps locally at a ZeRO stage (none with 16-bit storage).
model::Gpt::LocalState model_state_for_stage(int zero_stage,
                                             kernels::Precision storage = kernels::Precision::kFp32);

class DataParallel : public model::ParamStore, public GradSync {
 public:
  // `gpt` must own what the stage keeps full (model_state_for_stage); for stage 3 and for
  // 16-bit storage the initial parameters are taken from `full_params` (every rank passes
  // the same values; fp32, the model's layout).
  // `tp` (may be null) is the tensor-parallel group, for the global gradient norm.
  DataParallel(model::Gpt& gpt, comm::Group& dp, const DpConfig& config,
               const optim::AdamWConfig& adamw, const float* full_params = nullptr,
               comm::Group* tp = nullptr);
  // Stage 3 without the full parameters in memory: each unit's initial values come
  // from `initial` (one unit resident at a time). A shard file that cannot be made is an
  // error, not an abort.
  static Status create_sharded(model::Gpt& gpt, comm::Group& dp, const DpConfig& config,
                               const optim::AdamWConfig& adamw, const InitialUnits& initial,
                               comm::Group* tp, std::unique_ptr<DataParallel>* out);
  ~DataParallel() override;

  int stage() const { return config_.zero_stage; }
  const ShardLayout& shards() const { return shards_; }
  // The rank's shard of the model states: the optimizer state (the whole model's at stage
  // 0), and at stage 3 the parameter and gradient shards; in memory or in files.
  optim::ShardStore& store() { return *store_; }
  const optim::ShardStore& store() const { return *store_; }
  size_t num_groups() const { return groups_.size(); }  // parameter groups (DpConfig::groups)
  // fp32 stage 3's parameter shard (local layout); stages 0-2 keep full params in the model.
  // Null with 16-bit storage (its words are store()'s kShardParams), and while the shard
  // is in a file (read it through store()).
  float* param_shard() { return sharded_params() && !half_ ? store().data(optim::kShardParams) : nullptr; }
  // Stage 3: moves the parameter or gradient shard into a file (a memory budget's
  // decision; needs align_shards).
  Status move_shard_to_file(optim::ShardArray a, const std::string& dir, int rank, bool direct);
  // For a memory budget, bytes setup has not allocated that training will hold:
  // what moving shard `a` to a file adds (parameter shards read ahead, or gradient pieces
  // summed and written, and the update's rotating buffers), what the file-backed shards add
  // now (without the rotating buffers: ShardStore::streaming_bytes), and stages 2-3's
  // gathered units and reductions in flight.
  size_t file_working_bytes(optim::ShardArray a) const;
  size_t offload_working_bytes() const;
  size_t transient_bytes() const;
  bool half_storage() const { return half_ != nullptr; }
  // 16-bit storage: the fp32 parameters of this rank's optimizer state are its master
  // weights (optim::kMasterWeights; the whole model at stage 0, the owned shard otherwise,
  // as checkpoints store them). After they are set, e.g. loaded, this rewrites the 16-bit
  // parameters from them (and gathers them at stages 1-2).
  void params_from_master();

  // Pipeline: this rank's part holds the embedding unit as the first or the last stage, and
  // `tied_peer` (its rank in `pp`) holds the other copy (the LM head is the tied wte). The
  // two copies' reduced gradients are summed in finish_reductions(), so both stay equal
  // after the update; the last stage's copy is left out of the gradient norm, which is
  // reduced over `pp` as well. tied_peer < 0: no copy elsewhere.
  void set_pipeline(comm::Group* pp, int tied_peer);

  // --- one optimizer step (GradSync, then the update) ---
  // The 0-based index of the step that begin_step starts next (compression's schedule).
  void set_step(int64_t k) { step_ = k; }
  // The compressor (null without --compress), and whether this step goes through it.
  CompressedReduction* compression() { return compressed_.get(); }
  OneBitAdam* onebit_adam() { return onebit_.get(); }
  // The compressor's per-rank state (checkpoints: valid at the same layout only): PowerSGD's
  // error and warm-start Q, 1-bit Adam's worker and server errors. Empty without one.
  std::vector<std::pair<float*, size_t>> compressor_state();
  bool compressing() const { return compressing_; }
  void begin_step(int micro_batches) override;  // zeroes gradients
  void end_micro_batch() override;              // waits for the reductions started so far
  void finish_reductions() override;            // after the last backward: every reduction done
  // Global L2 norm of the reduced gradient over dp and tp, tp-replicated parameters
  // counted once.
  double grad_norm();
  // The bytes the norm and the update must move over this rank's elements at least (each
  // array read or written once), for the step profile: 32 per element in fp32; with 16-bit
  // storage 30 (the 16-bit gradient read twice, fp32 master weights and moments, the
  // 16-bit weights written).
  double update_bytes() const;
  // For reports of a non-finite step (--on-nonfinite): per whole-model unit id (`units`
  // entries), 1 when this rank's reduced gradient of it holds a NaN or an infinity.
  std::vector<double> nonfinite_units(int units);
  // Testing (--debug-nonfinite-step): a NaN in each of this rank's reduced gradient
  // segments of whole-model unit `id` (none when the gradients are in files).
  void poison_gradient(int id);
  // Clips on the global norm; with a loss scale S (norm then of the scaled gradients) the
  // gradients are also divided by S.
  void clip(double norm, float max_norm, double loss_scale = 1.0);
  void optimizer_step(float lr, int t);

  // --- weight versions (DpConfig::weight_versions) ---
  // Before an update: the current weights become the previous version (skipped updates
  // too, so a version is always one update old).
  void advance_weight_versions();
  // The previous version set to the current (a resume without the saved version: the
  // delay starts again).
  void reset_weight_versions();
  bool keeps_weight_versions() const { return !previous_params_.empty() || !previous_half_.empty(); }
  // Checkpoints: the previous version laid out as the full parameters (global offsets of
  // this rank's layout). In memory as fp32 (null with 16-bit storage, whose version is read
  // and written through these, converting exactly: the values are 16-bit ones).
  float* previous_params() { return previous_params_.empty() ? nullptr : previous_params_.data(); }
  void read_previous(size_t offset, size_t n, float* dst) const;
  void write_previous(size_t offset, size_t n, const float* src);

  // --- ParamStore ---
  void begin_pass(model::Pass pass) override { pass_ = pass; }
  void use_weights(model::WeightVersion version) override { version_ = version; }
  const float* acquire_params(int u) override;
  void release_params(int u) override;
  const uint16_t* acquired_bf16(int u) const override;
  const float* fp32_tensor(const float* unit, int u, const model::ParamTensor& t,
                           const model::ParamLayout& layout) const override;
  uint16_t* acquired_grads_bf16(int u) override;
  float* fp32_grad_tensor(float* unit, int u, const model::ParamTensor& t,
                          const model::ParamLayout& layout) const override;
  float* acquire_grads(int u) override;
  void release_grads(int u) override;

 private:
  struct GroupParts {
    comm::Group* reduce = nullptr;  // the group's communicator (the spec's, or dp)
    comm::Group* distinct = nullptr;
    std::unique_ptr<BucketAllReduce> buckets;      // stage 0
    std::unique_ptr<ShardReduceScatter> scatter;   // stages 1-3
  };

  DataParallel(model::Gpt& gpt, comm::Group& dp, const DpConfig& config,
               const optim::AdamWConfig& adamw, comm::Group* tp);  // create_sharded: init() follows
  Status init(const float* full_params, const InitialUnits& initial);
  Status init_sharded(const float* full_params, const InitialUnits& initial);
  void init_half(const float* full_params);
  void init_groups();
  // transient_bytes' share of quantized exchanges, from the two largest units' sizes.
  size_t int8_transient_bytes(const size_t padded[2], const size_t shard[2]) const;
  void drop_kept_gathers();  // keep_gathered: every unit kept since its first use
  // Stage 3: the parameter and gradient shards are the store's arrays (fp32 or 16-bit).
  bool sharded_params() const { return config_.zero_stage == 3; }
  // 16-bit gradient words in memory: the store's shard (stage 3) or HalfStorage's.
  // The sum of squares of this rank's reduced gradient in optimizer segment i (from the
  // file's running sums when the gradients are in files).
  double segment_squares(size_t i);
  uint16_t* half_grads() {
    return config_.zero_stage == 3 ? store().words(optim::kShardGrads) : half_->grads();
  }
  bool params_in_file() const { return files_ && files_->params_in_file(); }
  bool grads_in_file() const { return files_ && files_->grads_in_file(); }
  comm::Group& reduce_group(int u) const { return *groups_[group_of_unit_[u]].reduce; }
  // File-backed parameters: unit u and the units after it in this pass (up to read_ahead)
  // that are not gathered, to be read ahead.
  std::vector<int> units_to_read(int u) const;
  const void* param_shard_of(int u, optim::IoBuffer* holder);  // floats or 16-bit words
  // Where a group's reducer puts unit u's reduced shard (stages 1-3).
  void store_reduced(int u, const float* reduced);
  void wait_reductions();
  void zero_grads();
  void sum_tied_embedding();
  // This rank's reduced gradient of unit u: [offset, offset + n) of the reduced gradient
  // (the 16-bit words, the stage-2 shard, stage 3's store array or the model's grads): the
  // whole unit (stage 0), or its owned shard.
  size_t reduced_range(int u, size_t* n) const;
  float* reduced_fp32() {
    return config_.zero_stage == 3 ? store().data(optim::kShardGrads)
           : config_.zero_stage == 2 ? grad_shard_.data() : full_grads();
  }
  FullGradient full_gradient() { return half_ ? half_->full_gradient() : FullGradient{full_grads()}; }
  // Stages 1-2 after an update: every rank updated its shard of the full parameters; gather
  // the rest (16-bit words or fp32).
  void gather_updated_params();
  template <typename T>
  void gather_updated_params(T* params);
  // optimizer_step's parts: a run's parameters and gradients, the hand-over of updated
  // file-backed parameter shards (empty if none), 1-bit Adam's momentum exchange.
  optim::AdamRun update_run(const optim::AdamSegment& s, size_t from, size_t to, const optim::ChunkPointers& a);
  optim::ShardStore::ChunkUpdate hand_over_updated();
  void exchange_momentum();
  // Stage 3: starts all-gathering unit u's shards (16-bit words or fp32).
  void start_gather(int u, UnitsInUse::Unit& unit);
  void free_unit(UnitsInUse::Unit& unit);
  const uint16_t* half_unit(int u) const;  // 16-bit unit u as stored or gathered
  int next_unit(int u) const { return next_unit_in_pass(layout_, pass_, u); }
  float* full_grads() { return gpt_.grads(); }
  float* full_params() { return gpt_.params(); }

  model::Gpt& gpt_;
  comm::Group& dp_;
  comm::Group* tp_;
  DpConfig config_;
  const model::ParamLayout& layout_;
  ShardLayout shards_;
  optim::AdamWConfig adamw_config_;
  std::vector<optim::AdamSegment> segments_;  // the optimizer's runs over this rank's elements
  std::unique_ptr<optim::ShardStore> store_;
  model::Pass pass_ = model::Pass::kForward;
  model::WeightVersion version_ = model::WeightVersion::kCurrent;
  Buffer<float> previous_params_;  // weight_versions: the version before the last update
  Buffer<uint16_t> previous_half_;  // the same with 16-bit storage (its words)
  int micro_batches_ = 1;
  std::vector<int> released_;  // per unit: micro-batches whose gradients were released
  comm::Group* pp_ = nullptr;
  int tied_peer_ = -1;

  Buffer<float> grad_shard_;              // fp32 stage 2 (grads); stage 3's are in the store
  std::unique_ptr<HalfStorage> half_;     // 16-bit storage
  std::unique_ptr<FileBackedShards> files_;  // stage 3
  float grad_coef_ = 1.0f;  // 16-bit and stage 3: the clip and loss-scale factor for the update
  // Per unit while in backward: stages 2-3 the reduce-scatter input, 16-bit stages 0-1
  // the fp32 accumulator of one micro-batch.
  std::vector<Buffer<float>> grad_staging_;
  std::vector<bool> grads_acquired_;  // per unit: between acquire_grads and release_grads
  // Per-unit buffers (views, accumulators, staging, gathers) are reused, within a step and
  // from one step to the next.
  BufferPool<float> pool_;
  BufferPool<uint16_t> pool16_;
  // Stage 3 and 16-bit storage: the units the model uses (gathered, or widened).
  std::unique_ptr<UnitsInUse> in_use_;
  std::vector<GroupParts> groups_;  // after the pool: their reducers return buffers to it
  std::vector<int> group_of_unit_;
  std::unique_ptr<CompressedReduction> compressed_;
  std::unique_ptr<OneBitAdam> onebit_;
  // 1-bit Adam's compressed phase: the gradient is not reduced; the norm is estimated from
  // the ranks' local norms, and the momentum exchanged (optimizer_step).
  bool onebit_phase() const { return compressing_ && onebit_; }
  double onebit_grad_norm();
  void sync_tied_momentum();
  int64_t step_ = 0;
  bool compressing_ = false;  // this step's gradient goes through compressed_
};

}  // namespace meshtrain::parallel
