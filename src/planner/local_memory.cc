#include "planner/local_memory.h"

#include <algorithm>
#include <array>
#include <vector>

#include "compress/int8_blocks.h"
#include "core/memory.h"
#include "parallel/data_parallel.h"
#include "parallel/pp/schedule.h"
#include "planner/memory.h"

namespace meshtrain::planner {

namespace pp = parallel::pp;

namespace {

// Current and peak bytes per tracker category and of their sum (core/memory.h).
struct Tracker {
  std::array<double, kNumMemCategories> current{}, peak{}, at_total_peak{};
  double total = 0, total_peak = 0;
  void alloc(MemCategory c, double bytes) {
    const int i = (int)c;
    current[i] += bytes;
    total += bytes;
    peak[i] = std::max(peak[i], current[i]);
    if (total > total_peak) total_peak = total, at_total_peak = current;
  }
  void free(MemCategory c, double bytes) {
    current[(int)c] -= bytes;
    total -= bytes;
  }
};

// core/memory.h's BufferPool<float>: spares kept for exact reuse, dropped when a buffer of
// the same category and another size is asked for, at most `max` kept, none under 64 KiB.
class Pool {
 public:
  explicit Pool(Tracker* t, size_t max = 6) : t_(t), max_(max) {}
  size_t take(MemCategory c, size_t count) {
    for (size_t i = 0; i < spares_.size(); i++)
      if (spares_[i].first == c && spares_[i].second == count) {
        spares_.erase(spares_.begin() + (long)i);
        return count;
      }
    for (size_t i = 0; i < spares_.size();)
      if (spares_[i].first == c) {
        t_->free(c, 4.0 * spares_[i].second);
        spares_.erase(spares_.begin() + (long)i);
      } else {
        i++;
      }
    t_->alloc(c, 4.0 * count);
    return count;
  }
  void give(MemCategory c, size_t count) {
    if (4 * count < 64 * 1024) return t_->free(c, 4.0 * count);
    spares_.push_back({c, count});
    if (spares_.size() > max_) {
      t_->free(spares_.front().first, 4.0 * spares_.front().second);
      spares_.erase(spares_.begin());
    }
  }

 private:
  Tracker* t_;
  size_t max_;
  std::vector<std::pair<MemCategory, size_t>> spares_;
};

// parallel::DataParallel's buffers for fp32 storage (the ParamStore calls the model makes,
// the reductions, the parameter all-gather after the step), data_parallel.cc. When it
// reduces and gathers is the layout's parallel::DpStep, as the engine's DpConfig takes it:
// under a pipeline ZeRO-2/3 reduce once per step, and ZeRO-3 may keep units gathered to the
// step's end.
class StoreReplay {
 public:
  StoreReplay(const model::ParamLayout& layout, const parallel::ShardLayout& shards, int zero, int micro_batches,
              const parallel::DpStep& step, const parallel::QuantizedComm& quantized, Tracker* t)
      : layout_(layout), shards_(shards), zero_(zero), m_(micro_batches),
        once_(step.reduce_once_per_step && zero >= 2), keep_(step.keep_gathered && zero == 3), quantized_(quantized),
        t_(t), pool_(t) {
    const int n = layout.num_units();
    gathered_.assign(n, false);
    decoding_.assign(n, 0);
    refs_.assign(n, 0);
    staging_.assign(n, false);
    released_.assign(n, 0);
  }
  void begin_step() { std::fill(released_.begin(), released_.end(), 0); }
  void begin_pass(bool forward) { forward_ = forward; }
  void acquire_params(int u) {
    if (zero_ < 3) return;
    gather(u);
    decoded(u);  // the wait
    refs_[u]++;
    if (int next = next_unit(u); next >= 0) gather(next);
  }
  void release_params(int u) {
    if (zero_ < 3) return;
    if (--refs_[u] > 0 || keep_) return;  // kept to the step's end
    drop(u);
  }
  // finish_reductions: the units kept gathered are freed (ZeRO-3 under a pipeline).
  void drop_kept() {
    for (size_t u = 0; u < gathered_.size(); u++)
      if (gathered_[u] && refs_[u] == 0) drop((int)u);
  }
  void acquire_grads(int u) {
    if (zero_ < 2 || staging_[u]) return;
    pool_.take(MemCategory::kComm, shards_.units()[u].padded);
    staging_[u] = true;
  }
  void release_grads(int u) {
    if (zero_ >= 2 && !once_) return reduce_scatter(u);
    if (zero_ >= 2) return ++released_[u] == m_ ? reduce_scatter(u) : void();
    if (++released_[u] < m_) return;
    if (zero_ == 1) reduce_scatter(u);  // stage 0 (fp32) reduces in place
  }
  void end_micro_batch() {
    for (const Pending& p : pending_) retire(p);
    pending_.clear();
  }
  // The tied embedding's reduced gradient exchanged between the first and last stage.
  void tied_exchange() {
    const int E = layout_.embedding_unit();
    const double n = zero_ == 0 ? (double)layout_.units()[E].numel
                                : (double)(shards_.own_end(E) - shards_.own_begin(E));
    t_->alloc(MemCategory::kComm, 4 * n);
    t_->free(MemCategory::kComm, 4 * n);
  }
  // Stages 1-2: every unit's updated parameters all-gathered, two units' buffers at once.
  void gather_updated_params() {
    if (zero_ != 1 && zero_ != 2) return;
    const auto& units = shards_.units();
    t_->alloc(MemCategory::kComm, 4.0 * units[0].padded);
    for (size_t u = 0; u < units.size(); u++) {
      if (u + 1 < units.size()) t_->alloc(MemCategory::kComm, 4.0 * units[u + 1].padded);
      t_->free(MemCategory::kComm, 4.0 * units[u].padded);
    }
  }

 private:
  // A quantized exchange's int8 blocks (parallel/dp/quantized_comm.cc), fresh buffers that
  // live until it is decoded: a gather's shard sent and N received, a reduce-scatter's N
  // chunks sent and N received.
  double int8_bytes(const parallel::UnitShard& s, int buffers) const {
    return (double)buffers * (double)compress::int8_bytes(s.shard, quantized_.block);
  }
  void gather(int u) {
    if (gathered_[u]) return;
    const parallel::UnitShard& s = shards_.units()[u];
    pool_.take(MemCategory::kGathered, s.padded);
    gathered_[u] = true;
    if (quantized_.weights && s.world > 1) t_->alloc(MemCategory::kComm, decoding_[u] = int8_bytes(s, s.world + 1));
  }
  void decoded(int u) {
    if (decoding_[u] > 0) t_->free(MemCategory::kComm, decoding_[u]);
    decoding_[u] = 0;
  }
  void drop(int u) {
    decoded(u);  // a prefetch never used is waited for first
    pool_.give(MemCategory::kGathered, shards_.units()[u].padded);
    gathered_[u] = false;
  }
  int next_unit(int u) const {
    return parallel::next_unit_in_pass(layout_, forward_ ? model::Pass::kForward : model::Pass::kBackward, u);
  }
  void reduce_scatter(int u) {
    const auto& s = shards_.units()[u];
    if (zero_ >= 2) {
      staging_[u] = false;  // the staging buffer becomes the send buffer
    } else {
      pool_.take(MemCategory::kComm, s.padded);
    }
    pool_.take(MemCategory::kComm, s.shard);
    const double int8 = quantized_.grads && s.world > 1 ? int8_bytes(s, 2 * s.world) : 0;
    if (int8 > 0) t_->alloc(MemCategory::kComm, int8);
    pending_.push_back({s.padded, s.shard, int8});
    // Stages 2-3 retire the unit before this one as this one's reduction starts.
    while (zero_ >= 2 && pending_.size() > 1) {
      retire(pending_.front());
      pending_.erase(pending_.begin());
    }
  }
  struct Pending {
    size_t send, recv;
    double int8;
  };
  void retire(const Pending& p) {
    if (p.int8 > 0) t_->free(MemCategory::kComm, p.int8);
    pool_.give(MemCategory::kComm, p.send);
    pool_.give(MemCategory::kComm, p.recv);
  }

  const model::ParamLayout& layout_;
  const parallel::ShardLayout& shards_;
  int zero_, m_;
  bool once_, keep_;
  parallel::QuantizedComm quantized_;
  Tracker* t_;
  Pool pool_;
  bool forward_ = true;
  std::vector<bool> gathered_, staging_;
  std::vector<int> refs_, released_;
  std::vector<double> decoding_;  // per unit: a quantized gather's bytes until decoded
  std::vector<Pending> pending_;
};

// Context parallelism's buffers (model/context_parallel.h), communication memory each
// attention class sizes on first use and keeps: the ring's two k, v blocks, two dk, dv
// sums and one step's share of them, and one block's partial output and log-sum-exp; Ulysses' traded q, k, v (sent,
// received, laid out) and output over the whole sequences, and in the backward their
// gradients; all-gather's own k, v rows, every rank's, the whole sequence's, and in the
// backward the whole sequence's gradients. Also the attention kernel's keys per call: the
// ring attends to one block (T/cp keys) at a time, the others to the whole sequence.
struct CpReplay {
  int cp = 1;
  model::CpComm comm = model::CpComm::kRing;
  double B = 0, T = 0, NHl = 0, NKVl = 0, hs = 0;
  int a2a = 1;  // hybrid: its all-to-all groups' size (the ring runs over cp / a2a of them)
  bool forward_done = false, backward_done = false;

  bool hybrid() const { return cp > 1 && comm == model::CpComm::kHybrid; }
  // The keys one ranged call sees: the ring's block (hybrid: its group's rows), else the
  // whole sequence.
  double kernel_keys() const {
    if (cp > 1 && comm == model::CpComm::kRing) return T / cp;
    return hybrid() ? T * a2a / cp : T;
  }
  // A rank's k and v rows (floats), and Ulysses' columns per traded row over n ranks: W of
  // q, k, v for its heads (query heads over n, key/value heads too or one), Cq of the output.
  double kv() const { return B * T / cp * 2 * NKVl * hs; }
  double a2a_kv_heads(int n) const { return NKVl >= n ? NKVl / n : 1; }
  double a2a_w(int n) const { return (NHl / n + 2 * a2a_kv_heads(n)) * hs; }
  double a2a_cq(int n) const { return NHl / n * hs; }
  // The ring's first forward over `rows` rows of NH query and NKV key/value heads: five k, v
  // blocks (two in flight, two dK/dV sums, one step's share), a partial output and its lse.
  double ring_first(double rows, double NH, double NKV) const { return 5 * rows * 2 * NKV * hs + rows * NH * hs + rows * NH; }
  // Floats each pass allocates the first time it runs.
  double first_forward() const {
    if (cp <= 1) return 0;
    const double group_rows = B * T * a2a / cp;  // hybrid's traded rows
    switch (comm) {
      case model::CpComm::kRing: return ring_first(B * T / cp, NHl, NKVl);
      case model::CpComm::kAllGather: return kv() + 2 * cp * kv();
      case model::CpComm::kA2a: return B * T * (3 * a2a_w(cp) + a2a_cq(cp));
      case model::CpComm::kHybrid:
        return group_rows * (3 * a2a_w(a2a) + a2a_cq(a2a)) + ring_first(group_rows, NHl / a2a, a2a_kv_heads(a2a));
    }
    return 0;
  }
  double first_backward() const {
    if (cp <= 1) return 0;
    switch (comm) {
      case model::CpComm::kRing: return 0;
      case model::CpComm::kAllGather: return cp * kv();
      case model::CpComm::kA2a: return B * T * (a2a_w(cp) + a2a_cq(cp));
      case model::CpComm::kHybrid: return B * T * a2a / cp * (a2a_w(a2a) + a2a_cq(a2a));
    }
    return 0;
  }
};

// One pipeline rank's model part and the buffers its model, store and executor allocate
// over two training steps (the second is the steady state: every activation set and pool
// spare exists), model/gpt.cc, parallel/pp/executor.cc.
struct RankReplay {
  const model::GptConfig& config;
  const model::ParamLayout& layout;
  const model::ModelPart& part;  // empty: the whole model
  const model::ActivationInventory& inv;
  model::Recompute recompute;
  int B, T, threads, zero, p, m, v, rank;
  pp::ScheduleKind schedule;
  StoreReplay* store;
  Tracker* t;
  CpReplay cp;

  std::vector<model::ModelPart::Chunk> chunks() const {
    return part.chunks.empty() ? std::vector<model::ModelPart::Chunk>{{0, config.layers}} : part.chunks;
  }
  bool first(int c) const { return chunks()[c].begin == 0; }
  bool last(int c) const { return chunks()[c].end == config.layers; }
  double set_floats(int c) const {
    double n = (double)inv.set_input;
    for (int l = chunks()[c].begin; l < chunks()[c].end; l++) n += (double)inv.block(recompute);
    if (last(c)) n += (double)inv.head;
    return n;
  }
  // Attention's per-thread score buffers (kernels/cpu/attention.cc, attention_ranged.cc),
  // alive during the call, after cp's buffers the first time.
  void attention(bool forward) {
    bool& done = forward ? cp.forward_done : cp.backward_done;
    if (!done) t->alloc(MemCategory::kComm, 4.0 * (forward ? cp.first_forward() : cp.first_backward()));
    done = true;
    const double bytes = 4.0 * threads * (forward ? 1 : 2) * kAttentionBlock * cp.kernel_keys();
    t->alloc(MemCategory::kWorkspace, bytes);
    t->free(MemCategory::kWorkspace, bytes);
  }
  void block_forward(int l) {
    const int u = layout.block_unit(l);
    store->acquire_params(u);
    attention(true);
    store->release_params(u);
  }
  void forward(int c) {
    store->begin_pass(true);
    const bool hold = first(c) && last(c);
    const int E = layout.has_embedding() ? layout.embedding_unit() : -1;
    if (hold) store->acquire_params(E);
    if (first(c)) store->acquire_params(E), store->release_params(E);
    for (int l = chunks()[c].begin; l < chunks()[c].end; l++) block_forward(l);
    if (last(c)) {  // the final norm, and the head: wte when tied, else in the final unit
      const int F = layout.final_unit();
      store->acquire_params(F), store->release_params(F);
      if (!layout.has_untied_head()) store->acquire_params(E), store->release_params(E);
    }
    if (hold) store->release_params(E);
  }
  void backward(int c) {
    store->begin_pass(false);
    if (last(c)) {
      const int F = layout.final_unit();
      if (!layout.has_untied_head()) {  // the tied head's gradient goes into wte's
        const int E = layout.embedding_unit();
        store->acquire_params(E), store->acquire_grads(E), store->release_params(E);
        if (!layout.has_layer(0)) store->release_grads(E);
      }
      store->acquire_params(F), store->acquire_grads(F), store->release_params(F), store->release_grads(F);
    }
    for (int l = chunks()[c].end - 1; l >= chunks()[c].begin; l--) {
      const int u = layout.block_unit(l);
      if (recompute == model::Recompute::kFull) block_forward(l);
      store->acquire_params(u), store->acquire_grads(u);
      if (recompute == model::Recompute::kSelective) attention(true);
      attention(false);
      store->release_params(u), store->release_grads(u);
    }
    if (first(c)) {
      const int E = layout.embedding_unit();
      store->acquire_grads(E), store->release_grads(E);
    }
  }

  // Activation sets: one per (micro-batch, chunk) alive, sets of equal size pooled.
  std::vector<std::pair<double, bool>> sets;  // floats, in use
  std::vector<std::array<int, 3>> open;       // (mb, chunk, set index)
  void open_set(int mb, int c) {
    const double n = set_floats(c);
    for (size_t i = 0; i < sets.size(); i++)
      if (!sets[i].second && sets[i].first == n) {
        sets[i].second = true;
        open.push_back({mb, c, (int)i});
        return;
      }
    t->alloc(MemCategory::kActivations, 4 * n);
    sets.push_back({n, true});
    open.push_back({mb, c, (int)sets.size() - 1});
  }
  void close_set(int mb, int c) {
    for (size_t i = 0; i < open.size(); i++)
      if (open[i][0] == mb && open[i][1] == c) {
        sets[open[i][2]].second = false;
        open.erase(open.begin() + (long)i);
        return;
      }
  }

  void step(bool first_step) {
    if (first_step)  // ensure_activations: the recomputation and gradient scratch
      t->alloc(MemCategory::kActivations,
               4.0 * ((double)inv.recompute_scratch(recompute) + (double)inv.gradient_scratch));
    store->begin_step();
    if (p == 1) {
      for (int a = 0; a < m; a++) {
        open_set(0, 0);
        forward(0);
        backward(0);
        close_set(0, 0);
        store->end_micro_batch();
      }
    } else {
      pipeline();
    }
    store->end_micro_batch();  // finish_reductions: every reduction retired
    if (p > 1 && (rank == 0 || rank == p - 1) && layout.has_embedding() && !layout.has_untied_head())
      store->tied_exchange();
    store->drop_kept();
    store->gather_updated_params();
  }

  // PipelineExecutor::train_step: receives posted ahead for the next two computes, the
  // received tensor kept until the next one is taken, gradient sends copied until they
  // complete (here: by the end of the following action).
  void pipeline() {
    std::vector<pp::Action> actions;
    (void)pp::make_schedule(schedule, p, m, v, rank, &actions);
    const double n = 4.0 * (double)inv.set_input;  // boundary elements, fp32
    std::vector<std::array<int, 3>> inbox;           // (kind, mb, chunk)
    bool received = false;
    int pending_copies = 0, copies_due = 0;
    size_t posted = 0;
    auto take = [&](int kind, int mb, int c) {
      for (size_t i = 0; i < inbox.size(); i++)
        if (inbox[i] == std::array<int, 3>{kind, mb, c}) {
          inbox.erase(inbox.begin() + (long)i);
          if (received) t->free(MemCategory::kComm, n);  // the previous one, replaced
          received = true;
          return;
        }
    };
    for (size_t i = 0; i < actions.size(); i++) {
      for (int computes = 0; posted < actions.size(); posted++) {
        const pp::Action& a = actions[posted];
        const bool compute = a.kind == pp::ActionKind::kForward || a.kind == pp::ActionKind::kBackward;
        if (compute && posted > i && ++computes > 2) break;
        if (a.kind == pp::ActionKind::kRecvActivation || a.kind == pp::ActionKind::kRecvGrad) {
          t->alloc(MemCategory::kComm, n);
          inbox.push_back({a.kind == pp::ActionKind::kRecvActivation ? 0 : 1, a.microbatch, a.chunk});
        }
      }
      const pp::Action& a = actions[i];
      switch (a.kind) {
        case pp::ActionKind::kForward:
          if (!first(a.chunk)) take(0, a.microbatch, a.chunk);
          open_set(a.microbatch, a.chunk);
          forward(a.chunk);
          break;
        case pp::ActionKind::kBackward:
          if (!last(a.chunk)) take(1, a.microbatch, a.chunk);
          backward(a.chunk);
          close_set(a.microbatch, a.chunk);
          store->end_micro_batch();
          break;
        case pp::ActionKind::kSendGrad:
          t->alloc(MemCategory::kComm, n);
          pending_copies++;
          break;
        default:
          break;
      }
      // Copies sent before this action are done by its end.
      for (; copies_due > 0; copies_due--, pending_copies--) t->free(MemCategory::kComm, n);
      copies_due = pending_copies;
    }
    for (; pending_copies > 0; pending_copies--) t->free(MemCategory::kComm, n);
    if (received) t->free(MemCategory::kComm, n);
  }
};

}  // namespace

// What `train --compress` keeps per rank (parallel/dp/compressed_reduce.h, onebit_adam.h),
// counted with the optimizer state: PowerSGD's error (4 B a parameter; its Q is small);
// 1-bit Adam's worker error, 1/d and its reused exchange buffer over every rank's chunk
// (4 B each; the buffer is "comm" in the engine's tracker), its mask (1 B), and its server
// error (one chunk).
double compressor_state_bytes(const model::ParamLayout& layout, const Layout& l) {
  using Kind = parallel::Compression::Kind;
  if (l.compression.kind == Kind::kPowerSgd) return 4.0 * (double)layout.total();
  if (l.compression.kind != Kind::kOneBitAdam) return 0;
  size_t chunk = 0;
  for (const model::ParamUnit& u : layout.units()) chunk += (u.numel + l.dp - 1) / l.dp;
  return (double)chunk * (13.0 * l.dp + 4);
}

RankMemory replay_rank_memory(const model::GptConfig& config, const model::ParamLayout& layout,
                              const parallel::ShardLayout& shards, const model::ModelPart& part,
                              const model::ActivationInventory& inv, model::Recompute recompute, const Layout& l,
                              int m, int T, int threads, int rank) {
  const StateBytes state = model_state_bytes(shards, layout.total(), kFp32State, l.zero);
  Tracker tracker;
  tracker.alloc(MemCategory::kParams, state.params);
  if (parallel::pp::never_flushes(l.schedule)) tracker.alloc(MemCategory::kParams, state.params);  // 2bw's previous version
  tracker.alloc(MemCategory::kGrads, state.grads);
  tracker.alloc(MemCategory::kOptim, state.optim + compressor_state_bytes(layout, l));
  StoreReplay store(layout, shards, l.zero, m, parallel::dp_step(l), l.quantized, &tracker);
  CpReplay cp{l.cp, l.cp_comm, (double)l.micro_batch, (double)T, (double)config.heads / l.tp,
              (double)config.kv_heads_per_rank(l.tp), (double)config.head_dim(),
              l.cp_comm == model::CpComm::kHybrid ? l.cp_a2a : 1};
  RankReplay replay{config, layout, part, inv, recompute, l.micro_batch, T, threads, l.zero, l.pp, m,
                    l.virtual_stages, rank, l.schedule, &store, &tracker, cp, {}, {}};
  replay.step(true);
  replay.step(false);
  RankMemory out;
  auto peak = [&](MemCategory k) { return tracker.peak[(int)k]; };
  out.peaks = {peak(MemCategory::kParams), peak(MemCategory::kGrads), peak(MemCategory::kOptim),
               peak(MemCategory::kActivations), peak(MemCategory::kWorkspace), peak(MemCategory::kComm),
               peak(MemCategory::kGathered), tracker.total_peak};
  auto at = [&](MemCategory k) { return tracker.at_total_peak[(int)k]; };
  out.at_peak = {at(MemCategory::kParams), at(MemCategory::kGrads), at(MemCategory::kOptim),
                 at(MemCategory::kActivations),
                 at(MemCategory::kWorkspace) + at(MemCategory::kComm) + at(MemCategory::kGathered)};
  return out;
}

}  // namespace meshtrain::planner
