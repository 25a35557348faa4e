// AdamW with torch.optim.AdamW semantics over a flat parameter buffer, the learning-rate
// schedule, and global gradient-norm clipping (torch clip_grad_norm_ semantics).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/memory.h"
#include "kernels/ops.h"
#include "model/param_layout.h"
#include "optim/shard_store.h"

namespace meshtrain::optim {

struct AdamWConfig {
  float lr = 6e-4f;
  float min_lr = 6e-5f;
  int warmup_steps = 0;
  float weight_decay = 0.1f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float grad_clip = 1.0f;  // <= 0 disables clipping
};

// lr * (s+1)/W during warmup, then cosine from lr down to min_lr at step N.
float learning_rate(const AdamWConfig& c, int step, int total_steps);
// The same schedule over tokens (Megatron's --lr-warmup-tokens/--lr-decay-tokens, which
// DeepSpeed's curriculum tutorial advises with a sequence-length curriculum): `before`
// tokens trained before this step, `now` in it; warmup over `warmup` tokens, the cosine
// ending at `total`. With every step the same length it equals learning_rate up to rounding.
float learning_rate_by_tokens(const AdamWConfig& c, double before, double now, double warmup, double total);

// L2 norm of the whole gradient, accumulated in double in a fixed order (the same result
// for any thread count, which bitwise-exact resume relies on).
double grad_norm(const float* grads, size_t n);
double sum_of_squares(const float* x, size_t n);  // the same fixed-order sum
double sum_of_squares(kernels::Precision p, const uint16_t* x, size_t n);  // 16-bit values

// sum_of_squares of n values that arrive in order, in pieces of any size: the same double,
// bit for bit (its 64 chunks and 8 lanes, kept between pieces). For gradients written to a
// file piece by piece, so that the norm needs no second read.
class SumOfSquaresStream {
 public:
  explicit SumOfSquaresStream(size_t n);
  void add(const float* x, size_t count);
  double total() const;  // once all n values arrived

 private:
  static constexpr size_t kChunks = 64, kLanes = 8;
  size_t n_, chunk_, seen_ = 0;
  double lane_[kLanes] = {}, partial_[kChunks] = {};
};
// The factor clip_grads multiplies the gradients by: min(1, max/(norm/S + 1e-6)) / S.
float clip_coefficient(double norm, float max_norm, double loss_scale = 1.0);
// Scales grads by max/(norm + 1e-6) when norm > max; returns the scale applied (1 if none).
// With a loss scale S the gradients hold S times their value and `norm` is theirs: they
// are divided by S and clipped on norm/S in the same pass.
float clip_grads(float* grads, size_t n, double norm, float max_norm, double loss_scale = 1.0);

// A run of elements updated alike: param/grad/moment offsets into their own buffers (a
// ZeRO shard keeps moments locally while parameters may live in a full buffer).
struct AdamSegment {
  size_t param_offset = 0, grad_offset = 0, state_offset = 0, count = 0;
  bool decay = false;
  bool tp_copy = false;  // another tensor-parallel rank holds these elements and counts them
  int unit = -1;               // the layout unit the elements belong to
};

// One segment per tensor, all offsets the tensor's offset in the flat layout.
std::vector<AdamSegment> full_segments(const model::ParamLayout& layout);

// The optimizer's state arrays (of its ShardStore), each indexed by AdamSegment::state_offset.
using StateKind = ShardArray;

class AdamW {
 public:
  // Moments for every parameter of the layout (single rank, data parallel).
  AdamW(const AdamWConfig& config, const model::ParamLayout& layout, bool master_weights = false);
  // Moments of `state_size` elements for the given segments (a ZeRO shard). With
  // master_weights the optimizer also keeps the fp32 parameters (mixed precision: the model
  // holds 16-bit copies, see step_mixed).
  // `files`: the moments start in files there (never in memory; a folder that takes no
  // files is a bug here: callers check it first). The master weights start in memory
  // (init_master), to be moved by offload().
  struct StateFiles {
    std::string dir;
    int rank = 0;
    bool direct = true;
    size_t chunk = 0;  // streamed elements (ShardStore::set_chunk)
  };
  AdamW(const AdamWConfig& config, std::vector<AdamSegment> segments, size_t state_size,
        bool master_weights = false, const StateFiles* files = nullptr);
  // One update with step number t (1-based, for bias correction) at learning rate lr.
  void step(float* params, const float* grads, float lr, int t);
  // 1-bit Adam's compressed phase (Tang et al. 2021; parallel/dp/onebit_adam.h): m holds
  // this step's momentum already divided by the frozen denominator (u = m / d, averaged over
  // the ranks by the caller) and v is not touched; the update is step()'s otherwise:
  // p = p (1 - lr wd) - lr / (1 - β1^t) u. In memory only (setup refuses offload).
  void step_preconditioned(float* params, float lr, int t);

  // --- mixed precision (master_weights) ---
  // Sets the fp32 master weights from fp32 parameters addressed like step()'s.
  void init_master(const float* params);
  // One update of the master weights from 16-bit gradients (format p) multiplied by
  // grad_coef (clipping and 1/loss scale), then params = the master rounded to format p.
  // Element by element the arithmetic is step()'s on the widened, scaled gradient.
  void step_mixed(kernels::Precision p, uint16_t* params, const uint16_t* grads, float grad_coef,
                  float lr, int t);
  // params = the master weights rounded to format p (after a checkpoint load); null: the
  // store's own 16-bit parameter shard (ZeRO-3), wherever it lives.
  void params_from_master(kernels::Precision p, uint16_t* params);
  bool has_master() const { return master_; }
  int state_kinds() const { return master_ ? 3 : 2; }

  // ZeRO-3: one update of the store's own parameter and gradient shards (kShardParams,
  // kShardGrads, addressed like the state: every segment's three offsets are equal), the
  // gradients multiplied by grad_coef first (clipping; 1: unchanged). `storage`: kFp32,
  // fp32 shards (the arithmetic of clip_grads and step()), or the 16-bit format of the
  // shards of a run with master weights (step_mixed's). Element by element the same,
  // wherever the arrays live.
  // `updated`, if set, sees each chunk's new parameters [begin, end) (floats or 16-bit
  // words) as they are written.
  using ChunkHook = std::function<void(size_t begin, size_t end, const void* params)>;
  void step_shard(kernels::Precision storage, float grad_coef, float lr, int t, const ChunkHook& updated = {});

  // Moves the state (zero so far, or as set by init_master) not yet in files into files under `dir`,
  // streamed `chunk` elements at a time by every step (optim/shard_store.h); the in-memory
  // arrays are freed. The update arithmetic is the same element by element, so losses are
  // bit-identical.
  // `direct`: O_DIRECT streaming where supported (else through the page cache).
  Status offload(const std::string& dir, int rank, size_t chunk, bool direct = true);
  bool offloaded() const { return store_.in_file(kMomentM); }
  // Where the state lives, with the ZeRO-3 shards when the data-parallel store adds them.
  ShardStore& store() { return store_; }
  const ShardStore& store() const { return store_; }

  // A state array in memory (null when offloaded: use read_state / write_state).
  float* state(StateKind k) { return store_.data(k); }
  const float* state(StateKind k) const { return store_.data(k); }
  float* m() { return state(kMomentM); }
  float* v() { return state(kMomentV); }
  const float* m() const { return state(kMomentM); }
  const float* v() const { return state(kMomentV); }
  // Whole-array copies wherever the state lives, for checkpoints.
  void read_state(StateKind k, float* dst);
  void read_state(StateKind k, size_t begin, size_t count, float* dst);  // a range
  void write_state(StateKind k, size_t begin, size_t count, const float* src);
  void write_state(StateKind k, const float* src);
  size_t size() const { return size_; }
  const std::vector<AdamSegment>& segments() const { return segments_; }

 private:
  struct Coefficients;
  Coefficients coefficients(float lr, int t) const;
  static void mixed_block(kernels::Precision p, const Coefficients& c, float decay, float grad_coef,
                          const uint16_t* g16, uint16_t* p16, float* w, float* m, float* v, size_t n);
  // Calls update(segment, from, to, arrays) for every segment's elements [from, to) in state
  // order, arrays[a] pointing at element `from`'s entry of each store array in `mask` (in
  // memory or in a streamed chunk); file arrays in write_mask are written back.
  // after_chunk(begin, end, arrays), if set, follows the runs of each chunk (in memory: once,
  // over the whole store).
  template <typename Update>
  void for_each_run(unsigned mask, unsigned write_mask, Update update,
                    const ShardStore::ChunkUpdate& after_chunk = {});
  unsigned state_mask() const;

  AdamWConfig config_;
  std::vector<AdamSegment> segments_;
  size_t size_;
  bool master_ = false;
  ShardStore store_;  // m, v, master; ZeRO-3's parameter and gradient shards
};

}  // namespace meshtrain::optim
