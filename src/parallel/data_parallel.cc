#include "parallel/data_parallel.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <map>

#include "core/check.h"
#include "compress/int8_blocks.h"
#include "parallel/dp/quantized_comm.h"

namespace meshtrain::parallel {

using model::Pass;

model::Gpt::LocalState model_state_for_stage(int zero_stage, kernels::Precision storage) {
  if (storage != kernels::Precision::kFp32) return model::Gpt::LocalState::kNone;
  if (zero_stage <= 1) return model::Gpt::LocalState::kParamsAndGrads;
  return zero_stage == 2 ? model::Gpt::LocalState::kParamsOnly : model::Gpt::LocalState::kNone;
}

DataParallel::DataParallel(model::Gpt& gpt, comm::Group& dp, const DpConfig& config,
                           const optim::AdamWConfig& adamw, const float* full_params,
                           comm::Group* tp)
    : DataParallel(gpt, dp, config, adamw, tp) {
  // A shard file that cannot be made ends the job here (setup checks the folder first).
  const Status st = init(full_params, nullptr);
  CHECK_MSG(st.is_ok(), st.message().c_str());
}

Status DataParallel::create_sharded(model::Gpt& gpt, comm::Group& dp, const DpConfig& config,
                                    const optim::AdamWConfig& adamw, const InitialUnits& initial,
                                    comm::Group* tp, std::unique_ptr<DataParallel>* out) {
  std::unique_ptr<DataParallel> store(new DataParallel(gpt, dp, config, adamw, tp));
  CHECK_MSG(store->config_.zero_stage == 3, "initial units are for ZeRO-3");
  RETURN_IF_ERROR(store->init(nullptr, initial));
  *out = std::move(store);
  return Status::ok();
}

// Units of a group with a communicator of its own are partitioned over it (MoE experts over
// their expert-data-parallel group); the rest over dp.
PartitionOf group_partition(const model::ParamLayout& layout, const comm::Group& dp,
                            const std::vector<ParamGroup>& groups) {
  std::map<size_t, UnitPartition> by_offset;
  for (const ParamGroup& g : groups)
    if (g.reduce)
      for (int u : g.units) by_offset[layout.units()[u].offset] = {g.reduce->size(), g.reduce->rank()};
  if (by_offset.empty()) return nullptr;
  const UnitPartition whole{dp.size(), dp.rank()};
  return [by_offset, whole](const model::ParamUnit& u) {
    auto it = by_offset.find(u.offset);
    return it == by_offset.end() ? whole : it->second;
  };
}

DataParallel::DataParallel(model::Gpt& gpt, comm::Group& dp, const DpConfig& config,
                           const optim::AdamWConfig& adamw, comm::Group* tp)
    : gpt_(gpt),
      dp_(dp),
      tp_(tp && tp->size() > 1 ? tp : nullptr),
      config_(config),
      layout_(gpt.layout()),
      shards_(gpt.layout(), dp.size(), dp.rank(), config.align_shards ? optim::ShardStore::kAlign : 1,
              group_partition(gpt.layout(), dp, config.groups)),
      adamw_config_(adamw) {}

Status DataParallel::init(const float* full_params, const InitialUnits& initial) {
  const int stage = config_.zero_stage;
  CHECK(stage >= 0 && stage <= 3);
  const bool half = config_.storage != kernels::Precision::kFp32;
  CHECK_MSG(gpt_.has_local_params() == (!half && stage < 3) &&
                gpt_.has_local_grads() == (!half && stage < 2),
            "the model's local buffers do not match the ZeRO stage and storage precision");
  const DpConfig::Files& files = config_.files;
  CHECK_MSG(!(files.params || files.grads) || (stage == 3 && config_.align_shards && !files.dir.empty()),
            "file-backed shards need ZeRO-3, align_shards and a folder");
  CHECK_MSG(!config_.quantized.weights || stage == 3, "quantized weight gathers need ZeRO-3");
  CHECK_MSG(!config_.quantized.grads || stage >= 1, "quantized gradient reduce-scatters need ZeRO 1-3");
  CHECK(config_.quantized.block >= 1);
  // Moments that go to files are made there: a model larger than memory never holds them.
  const optim::ShardStore::StateFiles state_files{files.dir, files.rank, files.direct, files.chunk};
  segments_ = stage == 0 ? optim::full_segments(layout_) : shards_.adam_segments(layout_, stage == 3, stage >= 2);
  store_ = std::make_unique<optim::ShardStore>(stage == 0 ? layout_.total() : shards_.local_total());
  RETURN_IF_ERROR(store_->add_state(half, files.optimizer ? &state_files : nullptr));
  grad_staging_.resize(layout_.num_units());
  grads_acquired_.assign(layout_.num_units(), false);
  if (stage == 3 || half)
    in_use_ = std::make_unique<UnitsInUse>(
        layout_.num_units(), [this](int u, UnitsInUse::Unit& g) { start_gather(u, g); },
        [this](UnitsInUse::Unit& g) { free_unit(g); });
  if (stage == 2 && !half) grad_shard_.allocate(MemCategory::kGrads, shards_.local_total());
  if (stage == 3) {
    // 16-bit: the words live in the store; HalfStorage makes the fp32 views of a unit.
    if (half) half_ = std::make_unique<HalfStorage>(config_.storage, layout_, 0, 0, false);
    RETURN_IF_ERROR(init_sharded(full_params, initial));
  } else if (half) {
    init_half(full_params);
  }
  init_groups();
  if (config_.weight_versions) {
    CHECK_MSG(stage < 3, "weight versions need ZeRO 0-2 (whole parameters on every rank)");
    // 16-bit storage: the previous version of the 16-bit words the model computes with.
    if (half) previous_half_.allocate(MemCategory::kParams, layout_.total());
    else previous_params_.allocate(MemCategory::kParams, layout_.total());
    reset_weight_versions();
  }
  gpt_.set_param_store(this);
  return Status::ok();
}

void DataParallel::advance_weight_versions() {
  if (!previous_params_.empty()) std::memcpy(previous_params_.data(), full_params(), sizeof(float) * layout_.total());
  if (!previous_half_.empty()) std::memcpy(previous_half_.data(), half_->params(), sizeof(uint16_t) * layout_.total());
}

void DataParallel::reset_weight_versions() { advance_weight_versions(); }

void DataParallel::read_previous(size_t offset, size_t n, float* dst) const {
  CHECK(offset + n <= layout_.total());
  if (!previous_params_.empty()) std::memcpy(dst, previous_params_.data() + offset, n * sizeof(float));
  else kernels::from_half(config_.storage, previous_half_.data() + offset, dst, n);
}

void DataParallel::write_previous(size_t offset, size_t n, const float* src) {
  CHECK(offset + n <= layout_.total());
  if (!previous_params_.empty()) std::memcpy(previous_params_.data() + offset, src, n * sizeof(float));
  else kernels::to_half(config_.storage, src, previous_half_.data() + offset, n);
}

// 16-bit stages 0-2: the initial parameters rounded into the words this rank keeps, and
// the master weights set from them.
void DataParallel::init_half(const float* full_params) {
  CHECK_MSG(full_params, "16-bit storage needs the initial parameters");
  const int stage = config_.zero_stage;
  half_ = std::make_unique<HalfStorage>(config_.storage, layout_, layout_.total(),
                                        stage == 2 ? shards_.local_total() : layout_.total(), stage <= 1);
  kernels::to_half(config_.storage, full_params, half_->params(), layout_.total());
  optim::init_master(store(), segments_, full_params);
}

// Stage 3: the parameter and gradient shards join the optimizer state in the store (fp32 values or
// 16-bit words), in memory or in files, and this rank's part of every unit's initial
// values is written into it (16-bit: rounded, and in full into the master weights).
Status DataParallel::init_sharded(const float* full_params, const InitialUnits& initial) {
  CHECK_MSG(full_params || initial, "ZeRO-3 needs the initial parameters");
  const DpConfig::Files& files = config_.files;
  optim::ShardStore& st = store();
  const size_t width = half_ ? optim::kWord : optim::kFloat;
  if (files.params) RETURN_IF_ERROR(st.add_file(optim::kShardParams, files.dir, files.rank, files.direct, width));
  else st.add(optim::kShardParams, MemCategory::kParams, width);
  if (files.grads) RETURN_IF_ERROR(st.add_file(optim::kShardGrads, files.dir, files.rank, files.direct, width));
  else st.add(optim::kShardGrads, MemCategory::kGrads, width);
  Buffer<float> unit;
  Buffer<uint16_t> words;
  for (int u = 0; u < layout_.num_units(); u++) {
    const float* values = nullptr;
    if (full_params) {
      values = full_params + layout_.units()[u].offset;
    } else {
      unit.allocate(MemCategory::kWorkspace, layout_.units()[u].numel);
      initial(u, unit.data());
      values = unit.data();
    }
    const size_t own = shards_.own_begin(u) - layout_.units()[u].offset;
    const size_t at = shards_.units()[u].local_offset, n = shards_.own_end(u) - shards_.own_begin(u);
    if (half_) {  // the master weights are the values the words are rounded from
      words.allocate(MemCategory::kWorkspace, n);
      kernels::to_half(config_.storage, values + own, words.data(), n);
      st.write(optim::kShardParams, at, n, words.data());
      st.write(optim::kMasterWeights, at, n, values + own);
      words.release();
    } else {
      st.write(optim::kShardParams, at, n, values + own);
    }
    unit.release();
  }
  files_ = std::make_unique<FileBackedShards>(st, shards_, segments_, config_.files.read_ahead,
                                              config_.storage);
  return Status::ok();
}

// Each parameter group gets its reducer: buckets at stage 0, reduce-scatters otherwise
// (stages 2-3 keep one unit's reduction in flight behind the one just started).
void DataParallel::init_groups() {
  std::vector<ParamGroup> specs = config_.groups;
  if (specs.empty()) {
    specs.push_back({"dp", nullptr, {}});
    for (int u = 0; u < layout_.num_units(); u++) specs[0].units.push_back(u);
  }
  group_of_unit_.assign(layout_.num_units(), -1);
  const int stage = config_.zero_stage;
  for (const ParamGroup& spec : specs) {
    GroupParts g;
    g.reduce = spec.reduce ? spec.reduce : &dp_;
    g.distinct = spec.distinct;
    for (int u : spec.units) {
      CHECK_MSG(u >= 0 && u < layout_.num_units() && group_of_unit_[u] < 0, "a unit in no group or in two");
      group_of_unit_[u] = (int)groups_.size();
    }
    if (stage == 0)
      g.buckets = std::make_unique<BucketAllReduce>(*g.reduce, layout_, spec.units, config_.bucket_mb,
                                                    config_.overlap, full_gradient(), pool_, spec.replicas);
    else
      g.scatter = std::make_unique<ShardReduceScatter>(*g.reduce, shards_, stage >= 2 ? 1 : 0, config_.overlap,
                                                       pool_, [this](int u, const float* r) { store_reduced(u, r); },
                                                       spec.replicas, config_.quantized.grads ? config_.quantized.block : 0);
    groups_.push_back(std::move(g));
  }
  for (int u = 0; u < layout_.num_units(); u++) CHECK_MSG(group_of_unit_[u] >= 0, "a unit in no parameter group");
  switch (config_.compression.kind) {
    case Compression::Kind::kPowerSgd:
      CHECK_MSG(stage == 0 && !half_ && groups_.size() == 1, "PowerSGD needs ZeRO 0, fp32 storage and one group");
      compressed_ = std::make_unique<CompressedReduction>(*groups_[0].reduce, layout_, config_.compression);
      break;
    case Compression::Kind::kOneBitAdam:
      CHECK_MSG(stage <= 1 && !half_ && groups_.size() == 1 && config_.compression.start_step >= 1,
                "1-bit Adam needs ZeRO 0-1, fp32 storage, one group and a freeze step >= 1");
      onebit_ = std::make_unique<OneBitAdam>(*groups_[0].reduce, layout_, adamw_config_.beta1,
                                             config_.compression.scale_block,
                                             OneBitAdam::update_bound(adamw_config_.beta1, adamw_config_.beta2));
      break;
    default: break;
  }
}

Status DataParallel::move_shard_to_file(optim::ShardArray a, const std::string& dir, int rank, bool direct) {
  CHECK(sharded_params() && (a == optim::kShardParams || a == optim::kShardGrads));
  CHECK_MSG(config_.align_shards, "a shard moved to a file needs align_shards");
  return store().move_to_file(a, dir, rank, direct);
}

DataParallel::~DataParallel() {
  wait_reductions();
  gpt_.set_param_store(nullptr);
}

// ---------------------------------------------------------------- reductions

// Stage 1: the reduced shard replaces this rank's slice of the full gradient. Stages 2-3:
// it is added to the step's sum so far (its file, 16-bit words, or the fp32 shard).
void DataParallel::store_reduced(int u, const float* reduced) {
  const size_t owned = shards_.own_end(u) - shards_.own_begin(u);
  if (config_.zero_stage == 1) return full_gradient().write(shards_.own_begin(u), owned, reduced);
  const size_t local = shards_.units()[u].local_offset;
  if (grads_in_file()) return files_->add_reduced(u, reduced);
  if (half_) return kernels::add_to_half(config_.storage, half_grads() + local, reduced, owned);
  float* dst = reduced_fp32() + local;
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < owned; i++) dst[i] += reduced[i];
}

void DataParallel::wait_reductions() {
  for (GroupParts& g : groups_)
    if (g.scatter) g.scatter->wait_all();
}

// ---------------------------------------------------------------- step protocol

void DataParallel::zero_grads() {
  if (grads_in_file()) files_->begin_step();
  else if (config_.zero_stage == 3) zero_bytes(store().data(optim::kShardGrads), store().width(optim::kShardGrads) * store().size());
  else if (half_) half_->zero_grads();
  else if (config_.zero_stage < 2) gpt_.zero_grads();
  else zero_bytes(grad_shard_.data(), grad_shard_.bytes());
}

void DataParallel::set_pipeline(comm::Group* pp, int tied_peer) {
  pp_ = pp && pp->size() > 1 ? pp : nullptr;
  tied_peer_ = pp_ ? tied_peer : -1;
  CHECK_MSG(tied_peer_ < 0 || layout_.has_embedding(), "a tied peer needs the embedding unit");
}

void DataParallel::drop_kept_gathers() {
  if (config_.zero_stage == 3) in_use_->drop_idle(config_.keep_gathered);
}

void DataParallel::free_unit(UnitsInUse::Unit& g) {
  if (files_) files_->give_back(std::move(g.source));
  pool_.give(std::move(g.data));
  if (!g.half.empty()) pool16_.give(std::move(g.half));
}

void DataParallel::begin_step(int micro_batches) {
  CHECK(micro_batches >= 1);
  drop_kept_gathers();  // parameters gathered since (by an evaluation, say) are current, but freed
  zero_grads();
  micro_batches_ = micro_batches;
  grad_coef_ = 1.0f;
  released_.assign(layout_.num_units(), 0);
  compressing_ = (compressed_ || onebit_) && step_ >= config_.compression.start_step;
  if (compressing_) return;  // reduced once, after backward (finish_reductions)
  for (GroupParts& g : groups_)
    if (g.buckets) g.buckets->begin_step();
}

void DataParallel::end_micro_batch() { wait_reductions(); }

void DataParallel::finish_reductions() {
  if (compressing_ && compressed_) compressed_->reduce(full_grads());
  for (GroupParts& g : groups_)
    if (g.buckets && !compressing_) g.buckets->finish();
  wait_reductions();
  if (grads_in_file()) files_->fill_unwritten();  // a unit no backward reached has a zero gradient
  if (tied_peer_ >= 0) sum_tied_embedding();
  drop_kept_gathers();  // the update changes the parameters: the next step gathers afresh
  if (params_in_file()) files_->drop_reads();
  if (grads_in_file()) files_->wait_writes();  // the last writes: exposed, if any
}

size_t DataParallel::reduced_range(int u, size_t* n) const {
  switch (config_.zero_stage) {
    case 0:
      *n = layout_.units()[u].numel;
      return layout_.units()[u].offset;
    case 1:
      *n = shards_.own_end(u) - shards_.own_begin(u);
      return shards_.own_begin(u);
    default:
      *n = shards_.own_end(u) - shards_.own_begin(u);
      return shards_.units()[u].local_offset;
  }
}

// The first and the last stage exchange their (data-parallel reduced) embedding gradients
// and both add the other's: Megatron's embedding all-reduce, as one point-to-point swap.
// Both hold the same shard of the unit (same dp rank, same per-unit partition).
void DataParallel::sum_tied_embedding() {
  size_t n = 0;
  size_t offset = reduced_range(layout_.embedding_unit(), &n);
  if (onebit_phase()) {  // not reduced over dp: the local gradient of the whole unit
    offset = layout_.units()[layout_.embedding_unit()].offset;
    n = layout_.units()[layout_.embedding_unit()].numel;
  }
  Buffer<float> widened, theirs(MemCategory::kComm, n);
  Buffer<uint16_t> words;  // 16-bit gradients read from their file
  float* mine = nullptr;
  uint16_t* mine16 = nullptr;
  if (half_) {  // exchanged and summed in fp32, rounded once (alike on both stages)
    if (grads_in_file()) {
      words.allocate(MemCategory::kComm, n);
      store().read(optim::kShardGrads, offset, n, words.data());
    }
    mine16 = grads_in_file() ? words.data() : half_grads() + offset;
    widened.allocate(MemCategory::kComm, n);
    kernels::from_half(config_.storage, mine16, widened.data(), n);
    mine = widened.data();
  } else if (grads_in_file()) {
    widened.allocate(MemCategory::kComm, n);
    store().read(optim::kShardGrads, offset, n, widened.data());
    mine = widened.data();
  } else {
    mine = reduced_fp32() + offset;
  }
  constexpr int kTiedTag = 7;
  auto recv = pp_->irecv(theirs.data(), n, tied_peer_, kTiedTag);
  auto send = pp_->isend(mine, n, tied_peer_, kTiedTag);
  recv->wait();
  send->wait();
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; i++) mine[i] += theirs[i];
  if (half_) kernels::to_half(config_.storage, mine, mine16, n);
  if (grads_in_file()) {
    const void* stored = half_ ? (const void*)mine16 : (const void*)mine;
    store().write(optim::kShardGrads, offset, n, stored);
    files_->set_squares(layout_.embedding_unit(), stored);
  }
}

double DataParallel::update_bytes() const {
  double n = 0;
  for (const optim::AdamSegment& s : segments_) n += (double)s.count;
  return n * (half_ ? 30.0 : 32.0);
}

double DataParallel::grad_norm() {
  if (onebit_phase()) return onebit_grad_norm();
  // The optimizer's segments are exactly this rank's reduced gradient elements. Stage 0
  // ranks all hold the whole gradient, stages 1-3 a shard each; elements several tp ranks
  // hold (replicated tensors, replicated key/value heads) count on one of them only.
  // The pipeline's last stage holds the second copy of the tied embedding.
  // File-backed gradients: the sums taken as they were written, in the same order.
  // Each group's sum is reduced over its own group of ranks.
  const bool skip_embedding = tied_peer_ >= 0 && pp_->rank() > tied_peer_;
  std::vector<double> local(groups_.size(), 0.0);
  for (size_t i = 0; i < segments_.size(); i++) {
    const optim::AdamSegment& s = segments_[i];
    if (s.tp_copy) continue;
    if (skip_embedding && s.unit == layout_.embedding_unit()) continue;
    local[group_of_unit_[s.unit]] += segment_squares(i);
  }
  double total = 0;
  for (size_t g = 0; g < groups_.size(); g++) {
    if (config_.zero_stage > 0) groups_[g].reduce->all_reduce_f64(&local[g], 1, comm::ReduceOp::kSum);
    // Experts: each ep rank holds others; counted once each (Megatron PR #5916's bug).
    if (groups_[g].distinct) groups_[g].distinct->all_reduce_f64(&local[g], 1, comm::ReduceOp::kSum);
    total += local[g];
  }
  if (tp_) tp_->all_reduce_f64(&total, 1, comm::ReduceOp::kSum);
  if (pp_) pp_->all_reduce_f64(&total, 1, comm::ReduceOp::kSum);
  return std::sqrt(total);
}

std::vector<std::pair<float*, size_t>> DataParallel::compressor_state() {
  if (compressed_) return {{compressed_->error(), compressed_->error_size()}, {compressed_->q_memory().data(), compressed_->q_memory().size()}};
  if (onebit_) return {{onebit_->worker_error().data(), onebit_->worker_error().size()}, {onebit_->server_error().data(), onebit_->server_error().size()}};
  return {};
}

// 1-bit Adam's compressed phase: no rank has the summed gradient, only its part g_i. The
// norm of the sum is estimated as sqrt(N sum_i |g_i|^2): exact when the parts agree, and
// never below the true norm (Cauchy-Schwarz), so clipping on it is conservative. One scalar
// all-reduce over dp; tp and pp as grad_norm().
double DataParallel::onebit_grad_norm() {
  const bool skip_embedding = tied_peer_ >= 0 && pp_->rank() > tied_peer_;
  double local = 0;
  for (const model::ParamTensor& t : layout_.tensors()) {
    if (t.tp_copy || (skip_embedding && t.unit == layout_.embedding_unit())) continue;
    local += optim::sum_of_squares(full_grads() + t.offset, t.numel);
  }
  comm::Group& dp = *groups_[0].reduce;
  dp.all_reduce_f64(&local, 1, comm::ReduceOp::kSum);
  double total = local * dp.size();
  if (tp_) tp_->all_reduce_f64(&total, 1, comm::ReduceOp::kSum);
  if (pp_) pp_->all_reduce_f64(&total, 1, comm::ReduceOp::kSum);
  return std::sqrt(total);
}

// The tied embedding's two copies (first and last stage) each exchanged their momentum over
// their own dp group, with their own compression errors: the first stage's averaged
// momentum replaces the last's, so both copies take the same update and stay equal.
void DataParallel::sync_tied_momentum() {
  const int E = layout_.embedding_unit();
  const size_t offset = config_.zero_stage == 0 ? layout_.units()[E].offset : shards_.units()[E].local_offset;
  const size_t n = config_.zero_stage == 0 ? layout_.units()[E].numel : shards_.own_end(E) - shards_.own_begin(E);
  constexpr int kTiedMomentumTag = 8;
  float* m = store().data(optim::kMomentM) + offset;
  if (pp_->rank() < tied_peer_) pp_->isend(m, n, tied_peer_, kTiedMomentumTag)->wait();
  else pp_->irecv(m, n, tied_peer_, kTiedMomentumTag)->wait();
}

double DataParallel::segment_squares(size_t i) {
  const optim::AdamSegment& s = segments_[i];
  return grads_in_file() ? files_->squares(i)
         : half_        ? optim::sum_of_squares(config_.storage, half_grads() + s.grad_offset, s.count)
                        : optim::sum_of_squares(reduced_fp32() + s.grad_offset, s.count);
}

std::vector<double> DataParallel::nonfinite_units(int units) {
  std::vector<double> flags(units, 0.0);
  // A segment's sum of squares in double is finite exactly when its elements are.
  for (size_t i = 0; i < segments_.size(); i++)
    if (!std::isfinite(segment_squares(i))) flags[layout_.units()[segments_[i].unit].id] = 1.0;
  return flags;
}

void DataParallel::poison_gradient(int id) {
  if (grads_in_file()) return;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const optim::AdamSegment& s : segments_) {
    if (layout_.units()[s.unit].id != id || s.count == 0) continue;
    if (half_)
      kernels::to_half(config_.storage, &nan, half_grads() + s.grad_offset, 1);
    else
      reduced_fp32()[s.grad_offset] = nan;
  }
}

void DataParallel::clip(double norm, float max_norm, double loss_scale) {
  if (half_ || sharded_params() || onebit_phase()) {
    // Applied by the update: the 16-bit gradients are not re-rounded, and ZeRO-3's may be
    // in a file (the same multiplication, on the way to AdamW); 1-bit Adam's local gradient
    // is multiplied as it enters the momentum.
    grad_coef_ = optim::clip_coefficient(norm, max_norm, loss_scale);
  } else if (config_.zero_stage == 0) {
    optim::clip_grads(full_grads(), layout_.total(), norm, max_norm, loss_scale);
  } else if (config_.zero_stage == 1) {
    for (int u = 0; u < layout_.num_units(); u++)
      optim::clip_grads(full_grads() + shards_.own_begin(u),
                        shards_.own_end(u) - shards_.own_begin(u), norm, max_norm, loss_scale);
  } else {
    optim::clip_grads(grad_shard_.data(), grad_shard_.size(), norm, max_norm, loss_scale);  // stage 2
  }
}

// The store hands its shards to the step run by run: in memory, or streamed from files
// with the parameters written back (the gradients only read).
void DataParallel::optimizer_step(float lr, int t) {
  if (onebit_phase()) exchange_momentum();
  const optim::AdamW adamw(adamw_config_, lr, t, {config_.storage, grad_coef_, onebit_phase()});
  const unsigned arrays = store().arrays();
  store().for_each_run(segments_, arrays, arrays & ~optim::bit(optim::kShardGrads),
                       [&](const optim::AdamSegment& s, size_t from, size_t to, const optim::ChunkPointers& a) {
                         adamw.update(update_run(s, from, to, a));
                       },
                       hand_over_updated());
  gather_updated_params();
}

// Stage 3's parameters and gradients are the store's arrays, beside the state; the other
// stages' are the model's or HalfStorage's buffers, at the segment's own offsets.
optim::AdamRun DataParallel::update_run(const optim::AdamSegment& s, size_t from, size_t to,
                                        const optim::ChunkPointers& a) {
  optim::AdamRun run{to - from, s.decay, a.p[optim::kShardParams], a.p[optim::kShardGrads],
                     a.f(optim::kMomentM), a.f(optim::kMomentV), a.f(optim::kMasterWeights)};
  if (sharded_params()) {
    CHECK(s.param_offset == s.state_offset && s.grad_offset == s.state_offset);
    return run;
  }
  if (half_) {
    run.params = half_->params() + s.param_offset + from;
    run.grads = half_->grads() + s.grad_offset + from;
  } else {
    run.params = full_params() + s.param_offset + from;
    run.grads = reduced_fp32() + s.grad_offset + from;
  }
  return run;
}

// File-backed parameters: the next forward's first units take their new parameter shards
// from the update as it writes them, instead of reading them back from the file before the
// first block.
optim::ShardStore::ChunkUpdate DataParallel::hand_over_updated() {
  if (!params_in_file()) return {};
  std::vector<int> first;
  for (int u = 0; u >= 0 && (int)first.size() < files_->read_ahead(); u = next_unit_in_pass(layout_, Pass::kForward, u))
    first.push_back(u);
  return [hand_over = files_->hand_over(first)](size_t begin, size_t end, const optim::ChunkPointers& a) {
    hand_over(begin, end, a.p[optim::kShardParams]);
  };
}

// 1-bit Adam's compressed phase: the momentum exchange in place of the gradient reduction;
// the store's m becomes the averaged u (AdamW::Rule::preconditioned).
void DataParallel::exchange_momentum() {
  optim::ShardStore& st = store();
  CHECK_MSG(!st.any_in_file(st.arrays()), "1-bit Adam's update needs the moments in memory");
  float* m = st.data(optim::kMomentM);
  if (!onebit_->started()) {
    // At the freeze m is Adam's; a run resumed later in the phase saved u in its place.
    const float bias2_sqrt = std::sqrt(1.0f - std::pow(adamw_config_.beta2, (float)config_.compression.start_step));
    onebit_->start_from(m, st.data(optim::kMomentV), config_.zero_stage == 0, bias2_sqrt, adamw_config_.eps,
                        step_ > config_.compression.start_step);
  }
  onebit_->exchange(full_grads(), grad_coef_, m, config_.zero_stage == 0);
  if (tied_peer_ >= 0) sync_tied_momentum();
}

void DataParallel::params_from_master() {
  CHECK(half_);
  if (config_.zero_stage == 3) return optim::params_from_master(store(), segments_, config_.storage, nullptr);  // the store's shard
  optim::params_from_master(store(), segments_, config_.storage, half_->params());
  gather_updated_params();
}

void DataParallel::gather_updated_params() {
  if (config_.zero_stage == 0 || config_.zero_stage == 3) return;
  if (half_) gather_updated_params(half_->params());
  else gather_updated_params(full_params());
}

template <typename T>
void DataParallel::gather_updated_params(T* params) {
  // Unit by unit with two in flight (the next gather overlaps copying out the last).
  const int n = layout_.num_units();
  std::vector<Buffer<T>> staging(n);
  std::vector<comm::RequestPtr> requests(n);
  auto start = [&](int u) {
    const UnitShard& s = shards_.units()[u];
    staging[u].allocate(MemCategory::kComm, s.padded);
    T* mine = staging[u].data() + (size_t)s.rank * s.shard;
    std::memcpy(mine, params + shards_.own_begin(u),
                sizeof(T) * (shards_.own_end(u) - shards_.own_begin(u)));
    requests[u] = reduce_group(u).iall_gather(mine, staging[u].data(), s.shard);
  };
  start(0);
  for (int u = 0; u < n; u++) {
    if (u + 1 < n) start(u + 1);
    requests[u]->wait();
    const UnitShard& s = shards_.units()[u];
    std::memcpy(params + s.global_offset, staging[u].data(), sizeof(T) * s.numel);
    staging[u].release();
  }
}

// ---------------------------------------------------------------- ParamStore

// 16-bit stages 0-2 gather nothing: the unit is widened in acquire_params.
void DataParallel::start_gather(int u, UnitsInUse::Unit& g) {
  if (config_.zero_stage != 3) return;
  const UnitShard& s = shards_.units()[u];
  const void* shard = param_shard_of(u, &g.source);
  comm::Group& group = reduce_group(u);
  const size_t int8_block = config_.quantized.weights && group.size() > 1 ? config_.quantized.block : 0;
  if (half_) {
    g.half = pool16_.take(MemCategory::kGathered, s.padded, false);
    const auto* words = static_cast<const uint16_t*>(shard);
    g.request = int8_block ? iall_gather_int8(group, config_.storage, words, s.shard, int8_block, g.half.data())
                           : group.iall_gather(words, g.half.data(), s.shard);
  } else {
    g.data = pool_.take(MemCategory::kGathered, s.padded, false);
    const auto* values = static_cast<const float*>(shard);
    g.request = int8_block ? iall_gather_int8(group, values, s.shard, int8_block, g.data.data())
                           : group.iall_gather(values, g.data.data(), s.shard);
  }
}

std::vector<int> DataParallel::units_to_read(int u) const {
  std::vector<int> units;
  for (int k = 0; k < files_->read_ahead() && u >= 0; k++, u = next_unit(u))
    if (!in_use_->find(u)) units.push_back(u);
  return units;
}

const void* DataParallel::param_shard_of(int u, optim::IoBuffer* holder) {
  if (!params_in_file())
    return reinterpret_cast<const char*>(store().data(optim::kShardParams)) +
           shards_.units()[u].local_offset * store().width(optim::kShardParams);
  files_->read(units_to_read(u));  // issued now, unless they were already
  return files_->take(u, holder);
}

// ---------------------------------------------------------------- memory budget

size_t DataParallel::file_working_bytes(optim::ShardArray a) const {
  if (!files_) return 0;
  return files_->io_buffer_bytes(a) + 3 * files_->piece_bytes();  // and the update's rotating buffers
}

size_t DataParallel::offload_working_bytes() const {
  size_t bytes = 0;
  if (params_in_file()) bytes += files_->io_buffer_bytes(optim::kShardParams);
  if (grads_in_file()) bytes += files_->io_buffer_bytes(optim::kShardGrads);
  return bytes;
}

size_t DataParallel::transient_bytes() const {
  if (config_.zero_stage < 2) {
    // Stage 1 reduces every unit at the step's end, all at once: quantized, each one's N
    // blocks sent and N received are on top of the fp32 gradient it keeps.
    size_t bytes = 0;
    if (config_.quantized.grads)
      for (const UnitShard& s : shards_.units())
        if (s.world > 1) bytes += 2 * (size_t)s.world * compress::int8_bytes(s.shard, config_.quantized.block);
    return bytes;
  }
  // The two largest units bound two consecutive ones: gathered (the one in use and the one
  // prefetched, ZeRO-3), and in the reduction (the staging and received shard of the unit
  // retiring and of the one just started).
  size_t padded[2] = {0, 0}, shard[2] = {0, 0}, all = 0;
  for (const UnitShard& s : shards_.units()) {
    all += s.padded;
    if (s.padded > padded[0]) padded[1] = padded[0], padded[0] = s.padded;
    else if (s.padded > padded[1]) padded[1] = s.padded;
    if (s.shard > shard[0]) shard[1] = shard[0], shard[0] = s.shard;
    else if (s.shard > shard[1]) shard[1] = s.shard;
  }
  const size_t reducing = padded[0] + padded[1] + shard[0] + shard[1];  // fp32, either storage
  const size_t gathered = config_.zero_stage < 3 ? 0 : config_.keep_gathered ? all : padded[0] + padded[1];
  const size_t int8 = int8_transient_bytes(padded, shard);
  if (!half_) return (reducing + gathered) * sizeof(float) + int8;
  // 16-bit: gathered as words, and widened to fp32 while in use (this unit and the next).
  return (reducing + padded[0] + padded[1]) * sizeof(float) + gathered * sizeof(uint16_t) + int8;
}

size_t DataParallel::int8_transient_bytes(const size_t padded[2], const size_t shard[2]) const {
  // The two largest units' exchanges in flight (quantized_comm.cc): a gather's block of the
  // shard sent and the N received (16-bit: the shard widened to fp32 to quantize it), and a
  // reduce-scatter's N blocks sent and N received.
  const size_t block = config_.quantized.block, ranks = padded[0] / std::max<size_t>(shard[0], 1);
  if (ranks <= 1) return 0;  // a group of one rank is exact
  size_t bytes = 0;
  for (int k = 0; k < 2; k++) {
    const size_t chunk = compress::int8_bytes(shard[k], block);
    if (config_.quantized.weights) bytes += (ranks + 1) * chunk + (half_ ? shard[k] * sizeof(float) : 0);
    if (config_.quantized.grads) bytes += 2 * ranks * chunk;
  }
  return bytes;
}

// ---------------------------------------------------------------- unit order

int first_backward_unit(const model::ParamLayout& layout) {
  const int E = layout.has_embedding() ? layout.embedding_unit() : -1, last = layout.num_units() - 1;
  return E >= 0 && !layout.has_untied_head() && layout.has_final_norm() ? E : last;
}

int next_unit_in_pass(const model::ParamLayout& layout, model::Pass pass, int u) {
  // A pipeline stage may hold neither the embedding nor the final norm: its units are then
  // blocks in order. The last unit index is the final norm's when the part holds it.
  const int E = layout.has_embedding() ? layout.embedding_unit() : -1, last = layout.num_units() - 1;
  const bool tied_head = E >= 0 && !layout.has_untied_head() && layout.has_final_norm();
  if (pass == Pass::kForward) return u == last ? -1 : u + 1;  // E, B_0.., F
  if (tied_head && u == E) return last;                        // the tied head, then the final norm
  return u - 1 > E ? u - 1 : -1;                               // F, B_{L-1}..B_0
}

const uint16_t* DataParallel::half_unit(int u) const {
  if (config_.zero_stage == 3) return in_use_->find(u)->half.data();
  const bool previous = version_ == model::WeightVersion::kPrevious && !previous_half_.empty();
  return (previous ? previous_half_.data() : half_->params()) + layout_.units()[u].offset;
}

const float* DataParallel::fp32_tensor(const float* unit, int u, const model::ParamTensor& t,
                                       const model::ParamLayout& layout) const {
  if (!half_) return ParamStore::fp32_tensor(unit, u, t, layout);
  return unit + half_->param_offset(u, t);
}

uint16_t* DataParallel::acquired_grads_bf16(int u) {
  if (!half_ || !half_->packs_grads()) return nullptr;
  CHECK_MSG(grads_acquired_[u], "acquired_grads_bf16 of a unit whose gradients are not acquired");
  return half_->unit_grads(u);
}

float* DataParallel::fp32_grad_tensor(float* unit, int u, const model::ParamTensor& t,
                                      const model::ParamLayout& layout) const {
  if (!half_ || config_.zero_stage >= 2) return ParamStore::fp32_grad_tensor(unit, u, t, layout);
  return unit + half_->grad_offset(u, t);
}

const float* DataParallel::acquire_params(int u) {
  const int stage = config_.zero_stage;
  if (stage < 3 && !half_) {
    const bool previous = version_ == model::WeightVersion::kPrevious && !previous_params_.empty();
    return (previous ? previous_params_.data() : full_params()) + layout_.units()[u].offset;
  }
  UnitsInUse::Unit& g = in_use_->acquire(u);
  if (files_) files_->give_back(std::move(g.source));
  if (half_ && g.data.empty()) {
    g.data = pool_.take(MemCategory::kGathered, half_->fp32_unit_size(u), false);
    half_->widen(u, half_unit(u), g.data.data());
    if (!half_->packs_params()) pool16_.give(std::move(g.half));  // else the bf16 GEMMs read it until release
  }
  if (stage == 3)  // prefetch: the next unit's gather overlaps this unit's compute
    if (int next = next_unit(u); next >= 0) {
      if (params_in_file()) files_->read(units_to_read(next));  // and the reads of the units after it start
      in_use_->start(next);
    }
  return g.data.data();
}

void DataParallel::release_params(int u) {
  if (config_.zero_stage < 3 && !half_) return;
  UnitsInUse::Stay stay = UnitsInUse::Stay::kFree;
  if (config_.zero_stage == 3 && config_.keep_gathered) {
    stay = UnitsInUse::Stay::kKeep;  // until the step ends
  } else if (params_in_file() && pass_ == Pass::kForward && u == first_backward_unit(layout_)) {
    // File-backed parameters: the unit the backward starts with stays from the forward's
    // end to its use, rather than being read again (dropped with the kept units otherwise).
    stay = UnitsInUse::Stay::kHold;
  }
  in_use_->release(u, stay);
}

const uint16_t* DataParallel::acquired_bf16(int u) const {
  if (!half_ || !half_->packs_params()) return nullptr;
  CHECK_MSG(in_use_->find(u) && in_use_->find(u)->users > 0, "acquired_bf16 of a unit not acquired");
  return half_unit(u);
}

float* DataParallel::acquire_grads(int u) {
  const int stage = config_.zero_stage;
  if (stage < 2 && !half_) return full_grads() + layout_.units()[u].offset;
  grads_acquired_[u] = true;  // (a unit of GEMM weights only stages no fp32 gradient: empty)
  if (grad_staging_[u].empty())
    grad_staging_[u] = stage >= 2 ? groups_[group_of_unit_[u]].scatter->staging(u)
                                  : pool_.take(MemCategory::kWorkspace, half_->fp32_grad_size(u), true);
  return grad_staging_[u].data();
}

void DataParallel::release_grads(int u) {
  const int stage = config_.zero_stage;
  GroupParts& g = groups_[group_of_unit_[u]];
  if (stage >= 2 || half_) grads_acquired_[u] = false;
  if (stage >= 2) {  // per micro-batch, or once the unit's last micro-batch is done
    if (!config_.reduce_once_per_step || ++released_[u] == micro_batches_) g.scatter->start(u, std::move(grad_staging_[u]));
    return;
  }
  if (half_) {  // this micro-batch's fp32 gradient into the 16-bit accumulation
    half_->add_unit_grads(u, grad_staging_[u].data());
    pool_.give(std::move(grad_staging_[u]));
  }
  if (++released_[u] < micro_batches_) return;  // stages 0-1 accumulate until the last
  if (compressing_) return;  // reduced after backward (PowerSGD), or not at all (1-bit Adam)
  if (stage == 1) g.scatter->start_from(u, full_gradient());
  else g.buckets->unit_final(u);
}

}  // namespace meshtrain::parallel
