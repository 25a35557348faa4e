#include "parallel/data_parallel.h"

#include <cmath>
#include <cstring>

#include "core/check.h"

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
  CHECK_MSG(store->sharded_params(), "initial units are for fp32 ZeRO-3");
  RETURN_IF_ERROR(store->init(nullptr, initial));
  *out = std::move(store);
  return Status::ok();
}

DataParallel::DataParallel(model::Gpt& gpt, comm::Group& dp, const DpConfig& config,
                           const optim::AdamWConfig& adamw, comm::Group* tp)
    : gpt_(gpt),
      dp_(dp),
      tp_(tp && tp->size() > 1 ? tp : nullptr),
      config_(config),
      layout_(gpt.layout()),
      shards_(gpt.layout(), dp.size(), dp.rank(), config.align_shards ? optim::ShardStore::kAlign : 1),
      adamw_config_(adamw) {}

Status DataParallel::init(const float* full_params, const InitialUnits& initial) {
  const int stage = config_.zero_stage;
  CHECK(stage >= 0 && stage <= 3);
  const bool half = half_storage();
  CHECK_MSG(gpt_.has_local_params() == (!half && stage < 3) &&
                gpt_.has_local_grads() == (!half && stage < 2),
            "the model's local buffers do not match the ZeRO stage and storage precision");
  const DpConfig::Files& files = config_.files;
  CHECK_MSG(!(files.params || files.grads) || (sharded_params() && config_.align_shards && !files.dir.empty()),
            "file-backed shards need fp32 ZeRO-3, align_shards and a folder");
  const int n = layout_.num_units();
  // Moments that go to files are made there: a model larger than memory never holds them.
  const optim::AdamW::StateFiles state_files{files.dir, files.rank, files.direct, files.chunk};
  const optim::AdamW::StateFiles* in_files = files.optimizer ? &state_files : nullptr;
  if (stage == 0) {
    adamw_ = std::make_unique<optim::AdamW>(adamw_config_, optim::full_segments(layout_), layout_.total(), half,
                                            in_files);
    build_buckets();
  } else {
    adamw_ = std::make_unique<optim::AdamW>(adamw_config_, shards_.adam_segments(layout_, stage == 3, stage >= 2),
                                            shards_.local_total(), half, in_files);
  }
  grad_staging_.resize(n);
  gathered_.resize(n);
  if (stage == 2 && !half) grad_shard_.allocate(MemCategory::kGrads, shards_.local_total());
  if (stage < 3 && !half) {
    gpt_.set_param_store(this);
    return Status::ok();
  }
  if (sharded_params()) {
    RETURN_IF_ERROR(init_sharded(full_params, initial));
    gpt_.set_param_store(this);
    return Status::ok();
  }
  CHECK_MSG(full_params, "ZeRO-3 and 16-bit storage need the initial parameters");
  // The initial parameters as the optimizer addresses them: the full buffer, or stage 3's
  // shard (a temporary copy to start the master weights from).
  const float* initial_params = full_params;
  Buffer<float> shard;
  if (stage == 3) {
    shard.allocate(MemCategory::kWorkspace, shards_.local_total());
    for (int u = 0; u < n; u++)
      std::memcpy(shard.data() + shards_.units()[u].local_offset, full_params + shards_.own_begin(u),
                  sizeof(float) * (shards_.own_end(u) - shards_.own_begin(u)));
    initial_params = shard.data();
  }
  const size_t params = stage == 3 ? shards_.local_total() : layout_.total();
  params16_.allocate(MemCategory::kParams, params);
  kernels::to_half(storage(), initial_params, params16_.data(), params);
  grads16_.allocate(MemCategory::kGrads, stage >= 2 ? shards_.local_total() : layout_.total());
  adamw_->init_master(initial_params);
  if (storage() == kernels::Precision::kBf16) {
    packed_params_ = std::make_unique<PackedUnits>(
        layout_, [](const model::ParamTensor& t) { return !t.gemm_weight; });
    if (stage <= 1)
      packed_grads_ = std::make_unique<PackedUnits>(
          layout_, [](const model::ParamTensor& t) { return !t.gemm_grad; });
  }
  gpt_.set_param_store(this);
  return Status::ok();
}

// fp32 stage 3: the parameter and gradient shards join the optimizer's store, in memory or
// in files, and this rank's part of every unit's initial values is written into it.
Status DataParallel::init_sharded(const float* full_params, const InitialUnits& initial) {
  CHECK_MSG(full_params || initial, "ZeRO-3 needs the initial parameters");
  const DpConfig::Files& files = config_.files;
  optim::ShardStore& st = store();
  const int n = layout_.num_units();
  if (files.params) RETURN_IF_ERROR(st.add_file(optim::kShardParams, files.dir, files.rank, files.direct));
  else st.add(optim::kShardParams, MemCategory::kParams);
  if (files.grads) RETURN_IF_ERROR(st.add_file(optim::kShardGrads, files.dir, files.rank, files.direct));
  else st.add(optim::kShardGrads, MemCategory::kGrads);
  Buffer<float> unit;
  for (int u = 0; u < n; u++) {
    const float* values = nullptr;
    if (full_params) {
      values = full_params + layout_.units()[u].offset;
    } else {
      unit.allocate(MemCategory::kWorkspace, layout_.units()[u].numel);
      initial(u, unit.data());
      values = unit.data();
    }
    const size_t own = shards_.own_begin(u) - layout_.units()[u].offset;
    st.write(optim::kShardParams, shards_.units()[u].local_offset,
             shards_.own_end(u) - shards_.own_begin(u), values + own);
    unit.release();
  }
  reads_.resize(n);
  grad_written_.assign(n, 0);
  segment_squares_.assign(adamw_->segments().size(), 0.0);
  unit_segments_.assign(n, {});
  for (size_t i = 0; i < adamw_->segments().size(); i++) unit_segments_[adamw_->segments()[i].unit].push_back((int)i);
  return Status::ok();
}

Status DataParallel::move_shard_to_file(optim::ShardArray a, const std::string& dir, int rank, bool direct) {
  CHECK(sharded_params() && (a == optim::kShardParams || a == optim::kShardGrads));
  CHECK_MSG(config_.align_shards, "a shard moved to a file needs align_shards");
  return store().move_to_file(a, dir, rank, direct);
}

DataParallel::~DataParallel() {
  wait_pending();
  gpt_.set_param_store(nullptr);
}

// ---------------------------------------------------------------- stage 0 buckets

void DataParallel::build_buckets() {
  // Backward finishes units in descending index order (final norm, blocks L-1..0,
  // embeddings), and consecutive units in that order are adjacent in memory.
  const size_t bucket_elems = std::max<size_t>(1, (size_t)(config_.bucket_mb * 1024 * 1024 / 4));
  bucket_of_unit_.assign(layout_.num_units(), -1);
  Bucket current;
  for (int u = layout_.num_units() - 1; u >= 0; u--) {
    const auto& unit = layout_.units()[u];
    if (current.units.empty()) current.end = unit.offset + unit.numel;
    current.units.push_back(u);
    current.begin = unit.offset;
    bucket_of_unit_[u] = (int)buckets_.size();
    if (current.end - current.begin >= bucket_elems || u == 0) {
      max_bucket_ = std::max(max_bucket_, current.end - current.begin);
      buckets_.push_back(std::move(current));
      current = Bucket{};
    }
  }
}

void DataParallel::start_bucket(size_t b) {
  Bucket& bk = buckets_[b];
  const size_t n = bk.end - bk.begin;
  if (dp_.size() == 1) {  // one rank: the gradient is already the sum (16-bit: no round trip)
    bk.started = true;
    return;
  }
  float* data = nullptr;
  if (half_storage()) {
    // One fp32 copy in flight: finish the earlier buckets (their reductions ran during the
    // backward of this bucket's units) before widening this one.
    for (size_t e = 0; e < buckets_.size(); e++)
      if (e != b) complete_bucket(e);
    bk.staging = pool_.take(MemCategory::kComm, max_bucket_, false);  // one size: reused
    kernels::from_half(storage(), grads16_.data() + bk.begin, bk.staging.data(), n);
    data = bk.staging.data();
  } else {
    data = full_grads() + bk.begin;
  }
  bk.started = true;
  bk.request = dp_.iall_reduce(data, n, comm::ReduceOp::kSum);
  if (!config_.overlap) complete_bucket(b);
}

void DataParallel::complete_bucket(size_t b) {
  Bucket& bk = buckets_[b];
  if (!bk.request) return;
  bk.request->wait();
  bk.request.reset();
  if (bk.staging.empty()) return;
  kernels::to_half(storage(), bk.staging.data(), grads16_.data() + bk.begin, bk.end - bk.begin);
  pool_.give(std::move(bk.staging));
}

// ---------------------------------------------------------------- reduce-scatter

void DataParallel::start_unit_reduce_scatter(int u) {
  const UnitShard& s = shards_.units()[u];
  Pending p;
  p.unit = u;
  if (config_.zero_stage >= 2) {
    p.send = std::move(grad_staging_[u]);
  } else {  // stage 1: the full gradient stays; reduce a zero-padded copy of the unit
    p.send = pool_.take(MemCategory::kComm, s.padded, true);
    if (half_storage())
      kernels::from_half(storage(), grads16_.data() + s.global_offset, p.send.data(), s.numel);
    else
      std::memcpy(p.send.data(), full_grads() + s.global_offset, sizeof(float) * s.numel);
  }
  p.recv = pool_.take(MemCategory::kComm, s.shard, false);
  p.request = dp_.ireduce_scatter(p.send.data(), p.recv.data(), s.shard, comm::ReduceOp::kSum);
  pending_.push_back(std::move(p));
  // Stages 2-3: the unit before this one retires now (its reduction had this unit's
  // backward to finish; a file-backed gradient is written while the next one runs), so two
  // units' staging buffers are in flight, not the whole model's gradient at the
  // micro-batch's end. Each unit's shard is added to alone: the order changes no bit.
  while (config_.zero_stage >= 2 && pending_.size() > 1) {
    retire(pending_.front());
    pending_.erase(pending_.begin());
  }
  if (!config_.overlap) retire(pending_.back()), pending_.pop_back();
}

void DataParallel::retire(Pending& p) {
  p.request->wait();
  const int u = p.unit;
  const size_t owned = shards_.own_end(u) - shards_.own_begin(u);
  if (config_.zero_stage == 1) {
    // The reduced shard replaces this rank's slice of the full gradient.
    if (half_storage())
      kernels::to_half(storage(), p.recv.data(), grads16_.data() + shards_.own_begin(u), owned);
    else
      std::memcpy(full_grads() + shards_.own_begin(u), p.recv.data(), sizeof(float) * owned);
  } else if (half_storage()) {
    kernels::add_to_half(storage(), grads16_.data() + shards_.units()[u].local_offset,
                         p.recv.data(), owned);
  } else if (grads_in_file()) {
    store_reduced_grads(u, p.recv.data());
  } else {
    float* dst = reduced_fp32() + shards_.units()[u].local_offset;
    const float* src = p.recv.data();
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < owned; i++) dst[i] += src[i];
  }
  pool_.give(std::move(p.send));
  pool_.give(std::move(p.recv));
}

void DataParallel::wait_pending() {
  for (auto& p : pending_) retire(p);
  pending_.clear();
}

// ---------------------------------------------------------------- step protocol

void DataParallel::zero_grads() {
  if (half_storage()) zero_bytes(grads16_.data(), grads16_.bytes());
  else if (config_.zero_stage < 2) gpt_.zero_grads();
  else if (grads_in_file()) grad_written_.assign(layout_.num_units(), 0);
  else zero_bytes(reduced_fp32(), sizeof(float) * shards_.local_total());
}

void DataParallel::set_pipeline(comm::Group* pp, int tied_peer) {
  pp_ = pp && pp->size() > 1 ? pp : nullptr;
  tied_peer_ = pp_ ? tied_peer : -1;
  CHECK_MSG(tied_peer_ < 0 || layout_.has_embedding(), "a tied peer needs the embedding unit");
}

void DataParallel::drop_kept_gathers() {
  if (config_.zero_stage != 3) return;
  for (auto& g : gathered_) {
    if (!g || g->refs > 0 || !(config_.keep_gathered || g->held)) continue;
    if (g->request) g->request->wait();  // a prefetch never used
    give_read_buffer(std::move(g->source));
    pool_.give(std::move(g->data));
    if (!g->half.empty()) pool16_.give(std::move(g->half));
    g.reset();
  }
}

void DataParallel::begin_step(int micro_batches) {
  CHECK(micro_batches >= 1);
  drop_kept_gathers();  // parameters gathered since (by an evaluation, say) are current, but freed
  zero_grads();
  micro_batches_ = micro_batches;
  grad_coef_ = 1.0f;
  released_.assign(layout_.num_units(), 0);
  for (auto& b : buckets_) b.ready = 0, b.started = false;
}

void DataParallel::end_micro_batch() { wait_pending(); }

void DataParallel::finish_reductions() {
  for (size_t b = 0; b < buckets_.size(); b++) {
    if (!buckets_[b].started) start_bucket(b);  // not started: units never released
    complete_bucket(b);
  }
  wait_pending();
  if (grads_in_file())  // a unit no backward reached this step has a zero gradient
    for (int u = 0; u < layout_.num_units(); u++) {
      if (grad_written_[u]) continue;
      Buffer<float> zero(MemCategory::kComm, shards_.units()[u].shard);
      store_reduced_grads(u, zero.data());
    }
  if (tied_peer_ >= 0) sum_tied_embedding();
  drop_kept_gathers();  // the update changes the parameters: the next step gathers afresh
  drop_reads();
  if (grads_in_file()) store().wait_all(), last_grad_write_ = 0;  // the last writes: exposed, if any
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
  const size_t offset = reduced_range(layout_.embedding_unit(), &n);
  Buffer<float> widened, theirs(MemCategory::kComm, n);
  float* mine = nullptr;
  if (grads_in_file()) {
    widened.allocate(MemCategory::kComm, n);
    store().read(optim::kShardGrads, offset, n, widened.data());
    mine = widened.data();
  } else if (half_storage()) {  // exchanged and summed in fp32, rounded once (alike on both stages)
    widened.allocate(MemCategory::kComm, n);
    kernels::from_half(storage(), grads16_.data() + offset, widened.data(), n);
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
  if (half_storage()) kernels::to_half(storage(), mine, grads16_.data() + offset, n);
  if (grads_in_file()) {
    store().write(optim::kShardGrads, offset, n, mine);
    sum_squares_of_unit(layout_.embedding_unit(), mine);
  }
}

double DataParallel::grad_norm() {
  // The optimizer's segments are exactly this rank's reduced gradient elements. Stage 0
  // ranks all hold the whole gradient, stages 1-3 a shard each; elements several tp ranks
  // hold (replicated tensors, replicated key/value heads) count on one of them only.
  // The pipeline's last stage holds the second copy of the tied embedding.
  // File-backed gradients: the sums taken as they were written, in the same order.
  const bool skip_embedding = tied_peer_ >= 0 && pp_->rank() > tied_peer_;
  double local = 0;
  const auto& segments = adamw_->segments();
  for (size_t i = 0; i < segments.size(); i++) {
    const optim::AdamSegment& s = segments[i];
    if (s.tp_copy) continue;
    if (skip_embedding && s.unit == layout_.embedding_unit()) continue;
    local += grads_in_file() ? segment_squares_[i]
             : half_storage() ? optim::sum_of_squares(storage(), grads16_.data() + s.grad_offset, s.count)
                              : optim::sum_of_squares(reduced_fp32() + s.grad_offset, s.count);
  }
  if (config_.zero_stage > 0) dp_.all_reduce_f64(&local, 1, comm::ReduceOp::kSum);
  if (tp_) tp_->all_reduce_f64(&local, 1, comm::ReduceOp::kSum);
  if (pp_) pp_->all_reduce_f64(&local, 1, comm::ReduceOp::kSum);
  return std::sqrt(local);
}

void DataParallel::clip(double norm, float max_norm, double loss_scale) {
  if (half_storage() || sharded_params()) {
    // Applied by the update: the 16-bit gradients are not re-rounded, and ZeRO-3's may be
    // in a file (the same multiplication, on the way to AdamW).
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

void DataParallel::optimizer_step(float lr, int t) {
  const int stage = config_.zero_stage;
  if (half_storage()) {
    adamw_->step_mixed(storage(), params16_.data(), grads16_.data(), grad_coef_, lr, t);
    gather_updated_params(params16_.data());
    return;
  }
  if (stage == 3) {
    drop_reads();
    if (!params_in_file()) return adamw_->step_shard(grad_coef_, lr, t);
    // The next forward's first units take their new parameter shards from the update as it
    // writes them, instead of reading them back from the file before the first block.
    std::vector<int> first;
    for (int u = 0; u >= 0 && (int)first.size() < std::max(1, config_.files.read_ahead); u = next_unit_in(Pass::kForward, u))
      first.push_back(u);
    for (int u : first) reads_[u].buffer = take_read_buffer(shards_.units()[u].shard);
    adamw_->step_shard(grad_coef_, lr, t, [&](size_t begin, size_t end, const float* params) {
      for (int u : first) {
        const UnitShard& s = shards_.units()[u];
        const size_t lo = std::max(begin, s.local_offset), hi = std::min(end, s.local_offset + s.shard);
        if (lo < hi) std::memcpy(reads_[u].buffer.data() + (lo - s.local_offset), params + (lo - begin), sizeof(float) * (hi - lo));
      }
    });
    return;
  }
  float* params = full_params();
  const float* grads = stage == 2 ? grad_shard_.data() : full_grads();
  adamw_->step(params, grads, lr, t);
  gather_updated_params(params);
}

void DataParallel::params_from_master() {
  CHECK(half_storage());
  adamw_->params_from_master(storage(), params16_.data());
  gather_updated_params(params16_.data());
}

template <typename T>
void DataParallel::gather_updated_params(T* params) {
  if (config_.zero_stage == 0 || config_.zero_stage == 3) return;
  // Unit by unit with two in flight (the next gather overlaps copying out the last).
  const int n = layout_.num_units();
  std::vector<Buffer<T>> staging(n);
  std::vector<comm::RequestPtr> requests(n);
  auto start = [&](int u) {
    const UnitShard& s = shards_.units()[u];
    staging[u].allocate(MemCategory::kComm, s.padded);
    T* mine = staging[u].data() + (size_t)dp_.rank() * s.shard;
    std::memcpy(mine, params + shards_.own_begin(u),
                sizeof(T) * (shards_.own_end(u) - shards_.own_begin(u)));
    requests[u] = dp_.iall_gather(mine, staging[u].data(), s.shard);
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

// Starts making unit u's fp32 parameters available: stage 3 starts gathering the shards
// (16-bit or fp32); 16-bit stages 0-2 widen in acquire_params.
DataParallel::Gathered& DataParallel::gather(int u) {
  if (!gathered_[u]) {
    const UnitShard& s = shards_.units()[u];
    auto g = std::make_unique<Gathered>();
    if (config_.zero_stage == 3 && half_storage()) {
      g->half = pool16_.take(MemCategory::kGathered, s.padded, false);
      g->request = dp_.iall_gather(params16_.data() + s.local_offset, g->half.data(), s.shard);
    } else if (config_.zero_stage == 3) {
      g->data = pool_.take(MemCategory::kGathered, s.padded, false);
      g->request = dp_.iall_gather(param_shard_of(u, &g->source), g->data.data(), s.shard);
    }
    gathered_[u] = std::move(g);
  }
  return *gathered_[u];
}

// ---------------------------------------------------------------- file-backed shards

void DataParallel::read_ahead(int u) {
  for (int k = 0; k < std::max(1, config_.files.read_ahead) && u >= 0; k++, u = next_unit(u)) {
    ShardRead& r = reads_[u];
    if (gathered_[u] || !r.buffer.empty()) continue;  // gathered, or its read issued
    const UnitShard& s = shards_.units()[u];
    r.buffer = take_read_buffer(s.shard);
    r.ticket = store().read_async(optim::kShardParams, s.local_offset, s.shard, r.buffer.data());
  }
}

const float* DataParallel::param_shard_of(int u, optim::IoBuffer* holder) {
  const UnitShard& s = shards_.units()[u];
  if (!params_in_file()) return store().data(optim::kShardParams) + s.local_offset;
  read_ahead(u);  // issued now, unless it was already
  ShardRead& r = reads_[u];
  store().wait(r.ticket);
  *holder = std::move(r.buffer);  // the all-gather's source until it completes
  r = ShardRead{};
  return holder->data();
}

void DataParallel::drop_reads() {
  if (!params_in_file()) return;
  for (ShardRead& r : reads_) {
    if (r.buffer.empty()) continue;
    store().wait(r.ticket);
    give_read_buffer(std::move(r.buffer));
    r = ShardRead{};
  }
}

optim::IoBuffer DataParallel::take_read_buffer(size_t n) {
  for (size_t i = 0; i < read_spares_.size(); i++)
    if (read_spares_[i].capacity() >= n) {
      optim::IoBuffer b = std::move(read_spares_[i]);
      read_spares_.erase(read_spares_.begin() + (ptrdiff_t)i);
      return b;
    }
  return optim::IoBuffer(MemCategory::kGathered, n);
}

void DataParallel::give_read_buffer(optim::IoBuffer&& b) {
  if (b.empty()) return;
  read_spares_.push_back(std::move(b));
  // As many as can be in flight: the read-ahead and the shard being gathered.
  if ((int)read_spares_.size() > std::max(1, config_.files.read_ahead) + 1) read_spares_.erase(read_spares_.begin());
}

// In pieces of the store's chunk, so a unit of any size needs two piece buffers: one being
// summed while the one before is written (one write in flight).
void DataParallel::store_reduced_grads(int u, const float* reduced) {
  const UnitShard& s = shards_.units()[u];
  const size_t owned = shards_.own_end(u) - shards_.own_begin(u), piece = store().chunk();
  const auto& segments = adamw_->segments();
  std::vector<optim::SumOfSquaresStream> squares;
  for (int i : unit_segments_[u]) squares.emplace_back(segments[i].count);
  for (size_t b = 0; b < owned; b += piece) {
    const size_t n = std::min(piece, owned - b);
    // Two buffers alternate: the other one's write was waited for before this one's began.
    optim::IoBuffer& buffer = grad_pieces_[next_piece_ ^= 1];
    if (buffer.capacity() < piece) buffer = optim::IoBuffer(MemCategory::kComm, piece);
    float* g = buffer.data();
    const float* r = reduced + b;
    if (grad_written_[u]) {
      store().wait(store().read_async(optim::kShardGrads, s.local_offset + b, n, g));
#pragma omp parallel for simd schedule(static)
      for (size_t i = 0; i < n; i++) g[i] += r[i];
    } else {  // the in-memory shard starts at zero: the same addition
#pragma omp parallel for simd schedule(static)
      for (size_t i = 0; i < n; i++) g[i] = 0.0f + r[i];
    }
    // The piece's part of each segment, in order (segments tile the unit's owned range).
    for (size_t k = 0; k < squares.size(); k++) {
      const size_t from = segments[unit_segments_[u][k]].grad_offset - s.local_offset;
      const size_t lo = std::max(from, b), hi = std::min(from + segments[unit_segments_[u][k]].count, b + n);
      if (lo < hi) squares[k].add(g + (lo - b), hi - lo);
    }
    if (last_grad_write_) store().wait(last_grad_write_);
    last_grad_write_ = store().write_async(optim::kShardGrads, s.local_offset + b, n, (const float*)g);
  }
  grad_written_[u] = 1;
  for (size_t k = 0; k < squares.size(); k++) segment_squares_[unit_segments_[u][k]] = squares[k].total();
}

// Parameters: the shards read ahead and the one being gathered; gradients: the piece being
// summed and the one being written.
size_t DataParallel::io_buffer_bytes(optim::ShardArray a) const {
  size_t max_shard = 0;
  for (const UnitShard& s : shards_.units()) max_shard = std::max(max_shard, s.shard);
  const size_t unit = optim::ShardStore::aligned(max_shard) + optim::ShardStore::kAlign;
  const size_t floats = a == optim::kShardParams ? (size_t)(std::max(1, config_.files.read_ahead) + 1) * unit
                                                 : 2 * piece_floats();
  return floats * sizeof(float);
}

size_t DataParallel::piece_floats() const {
  return optim::ShardStore::aligned(adamw_->store().chunk()) + optim::ShardStore::kAlign;
}

size_t DataParallel::file_working_bytes(optim::ShardArray a) const {
  if (!sharded_params()) return 0;
  return io_buffer_bytes(a) + 3 * piece_floats() * sizeof(float);  // and the update's rotating buffers
}

size_t DataParallel::offload_working_bytes() const {
  size_t bytes = 0;
  for (optim::ShardArray a : {optim::kShardParams, optim::kShardGrads})
    if (sharded_params() && adamw_->store().in_file(a)) bytes += io_buffer_bytes(a);
  return bytes;
}

size_t DataParallel::transient_bytes() const {
  if (config_.zero_stage < 2 || half_storage()) return 0;
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
  size_t floats = padded[0] + padded[1] + shard[0] + shard[1];  // the reductions in flight
  if (config_.zero_stage == 3) floats += config_.keep_gathered ? all : padded[0] + padded[1];
  return floats * sizeof(float);
}

void DataParallel::sum_squares_of_unit(int u, const float* shard) {
  const size_t base = shards_.units()[u].local_offset;
  for (int i : unit_segments_[u]) {
    const optim::AdamSegment& seg = adamw_->segments()[i];
    segment_squares_[i] = optim::sum_of_squares(shard + (seg.grad_offset - base), seg.count);
  }
}

int DataParallel::first_backward_unit() const {
  const int E = layout_.has_embedding() ? layout_.embedding_unit() : -1, last = layout_.num_units() - 1;
  return E >= 0 && !layout_.has_untied_head() && layout_.has_final_norm() ? E : last;
}

int DataParallel::next_unit(int u) const { return next_unit_in(pass_, u); }

// The unit the model will ask for after u in a pass (-1: none worth fetching).
int DataParallel::next_unit_in(model::Pass pass, int u) const {
  // A pipeline stage may hold neither the embedding nor the final norm: its units are then
  // blocks in order. The last unit index is the final norm's when the part holds it.
  const int E = layout_.has_embedding() ? layout_.embedding_unit() : -1, last = layout_.num_units() - 1;
  const bool tied_head = E >= 0 && !layout_.has_untied_head() && layout_.has_final_norm();
  if (pass == Pass::kForward) return u == last ? -1 : u + 1;  // E, B_0.., F
  if (tied_head && u == E) return last;                        // the tied head, then the final norm
  return u - 1 > E ? u - 1 : -1;                               // F, B_{L-1}..B_0
}

DataParallel::PackedUnits::PackedUnits(const model::ParamLayout& layout,
                                       bool (*keep)(const model::ParamTensor&)) {
  runs.resize(layout.num_units());
  size.assign(layout.num_units(), 0);
  offset.assign(layout.tensors().size(), 0);
  for (size_t i = 0; i < layout.tensors().size(); i++) {
    const model::ParamTensor& t = layout.tensors()[i];
    if (!keep(t)) continue;
    const int u = layout.unit_of(t);
    const size_t from = layout.offset_in_unit(t);
    offset[i] = size[u];
    if (!runs[u].empty() && runs[u].back().from + runs[u].back().n == from) runs[u].back().n += t.numel;
    else runs[u].push_back({from, size[u], t.numel});
    size[u] += t.numel;
  }
}

size_t DataParallel::PackedUnits::offset_of(const model::ParamLayout& layout,
                                            const model::ParamTensor& t) const {
  const ptrdiff_t i = &t - layout.tensors().data();
  CHECK(i >= 0 && i < (ptrdiff_t)layout.tensors().size());
  return offset[i];
}

const uint16_t* DataParallel::half_unit(int u) const {
  return config_.zero_stage == 3 ? gathered_[u]->half.data() : params16_.data() + layout_.units()[u].offset;
}

size_t DataParallel::fp32_unit_size(int u) const {
  return packed_params_ ? packed_params_->size[u] : layout_.units()[u].numel;
}

void DataParallel::widen(int u, float* out) const {
  const uint16_t* half = half_unit(u);
  if (!packed_params_) {
    kernels::from_half(storage(), half, out, layout_.units()[u].numel);
    return;
  }
  for (const PackedRun& r : packed_params_->runs[u])
    kernels::from_half(storage(), half + r.from, out + r.to, r.n);
}

const float* DataParallel::fp32_tensor(const float* unit, int u, const model::ParamTensor& t,
                                       const model::ParamLayout& layout) const {
  if (!packed_params_) return ParamStore::fp32_tensor(unit, u, t, layout);
  CHECK_MSG(!t.gemm_weight, "bf16 storage keeps no fp32 copy of a GEMM weight: read acquired_bf16");
  return unit + packed_params_->offset_of(layout_, t);
}

uint16_t* DataParallel::acquired_grads_bf16(int u) {
  if (!packed_grads_) return nullptr;
  CHECK_MSG(!grad_staging_[u].empty(), "acquired_grads_bf16 of a unit whose gradients are not acquired");
  return grads16_.data() + layout_.units()[u].offset;
}

float* DataParallel::fp32_grad_tensor(float* unit, int u, const model::ParamTensor& t,
                                      const model::ParamLayout& layout) const {
  if (!packed_grads_) return ParamStore::fp32_grad_tensor(unit, u, t, layout);
  CHECK_MSG(!t.gemm_grad, "a linear weight's gradient goes to acquired_grads_bf16");
  return unit + packed_grads_->offset_of(layout_, t);
}

const float* DataParallel::acquire_params(int u) {
  const int stage = config_.zero_stage;
  if (stage < 3 && !half_storage()) return full_params() + layout_.units()[u].offset;
  Gathered& g = gather(u);
  if (g.request) g.request->wait();
  give_read_buffer(std::move(g.source));
  if (half_storage() && g.data.empty()) {
    g.data = pool_.take(MemCategory::kGathered, fp32_unit_size(u), false);
    widen(u, g.data.data());
    if (!packed_params_) pool16_.give(std::move(g.half));  // else the bf16 GEMMs read it until release
  }
  g.refs++;
  if (stage == 3)  // prefetch: the next unit's gather overlaps this unit's compute
    if (int next = next_unit(u); next >= 0) {
      if (params_in_file()) read_ahead(next);  // and the reads of the units after it start
      gather(next);
    }
  return g.data.data();
}

void DataParallel::release_params(int u) {
  if (config_.zero_stage < 3 && !half_storage()) return;
  CHECK(gathered_[u] && gathered_[u]->refs > 0);
  if (--gathered_[u]->refs > 0) return;
  if (config_.zero_stage == 3 && config_.keep_gathered) return;  // until the step ends
  // File-backed parameters: the unit the backward starts with stays from the forward's end
  // to its use, rather than being read again (dropped with the kept units otherwise).
  if (params_in_file() && pass_ == Pass::kForward && u == first_backward_unit()) {
    gathered_[u]->held = true;
    return;
  }
  pool_.give(std::move(gathered_[u]->data));
  if (!gathered_[u]->half.empty()) pool16_.give(std::move(gathered_[u]->half));
  gathered_[u].reset();
}

const uint16_t* DataParallel::acquired_bf16(int u) const {
  if (!packed_params_) return nullptr;
  CHECK_MSG(gathered_[u] && gathered_[u]->refs > 0, "acquired_bf16 of a unit not acquired");
  return half_unit(u);
}

float* DataParallel::acquire_grads(int u) {
  const int stage = config_.zero_stage;
  if (stage < 2 && !half_storage()) return full_grads() + layout_.units()[u].offset;
  if (grad_staging_[u].empty()) {
    const size_t n = packed_grads_ ? packed_grads_->size[u] : layout_.units()[u].numel;
    grad_staging_[u] = stage >= 2 ? pool_.take(MemCategory::kComm, shards_.units()[u].padded, true)
                                  : pool_.take(MemCategory::kWorkspace, n, true);
  }
  return grad_staging_[u].data();
}

void DataParallel::release_grads(int u) {
  const int stage = config_.zero_stage;
  if (stage >= 2) {  // per micro-batch, or once the unit's last micro-batch is done
    if (!config_.reduce_once_per_step || ++released_[u] == micro_batches_) start_unit_reduce_scatter(u);
    return;
  }
  if (half_storage()) {  // this micro-batch's fp32 gradient into the 16-bit accumulation
    uint16_t* g16 = grads16_.data() + layout_.units()[u].offset;
    const float* g = grad_staging_[u].data();
    if (packed_grads_) {  // the linear weights' GEMMs have added theirs already
      for (const PackedRun& r : packed_grads_->runs[u]) kernels::add_to_half(storage(), g16 + r.from, g + r.to, r.n);
    } else {
      kernels::add_to_half(storage(), g16, g, layout_.units()[u].numel);
    }
    pool_.give(std::move(grad_staging_[u]));
  }
  if (++released_[u] < micro_batches_) return;  // stages 0-1 accumulate until the last
  if (stage == 1) {
    start_unit_reduce_scatter(u);
    return;
  }
  Bucket& b = buckets_[bucket_of_unit_[u]];
  if (++b.ready == (int)b.units.size() && config_.overlap) start_bucket(bucket_of_unit_[u]);
}

}  // namespace meshtrain::parallel
