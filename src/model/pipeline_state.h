// What a Gpt keeps between the passes of a pipeline schedule, apart from its layers: the
// activation sets of the micro-batches in flight, the weight-gradient work a zero-bubble
// schedule's B leaves for its W, and zb-v's tied head gradient summed apart. A Gpt owns one
// (Gpt::pipeline()) and fills it as its passes run; the pipeline executor drives it between
// them (how many sets are alive, the Ws, the step's last micro-batch, an evaluation's set).
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "core/memory.h"
#include "model/block_activations.h"
#include "model/cp_split.h"
#include "model/document_rows.h"
#include "model/param_layout.h"
#include "model/param_store.h"

namespace meshtrain::model {

// One micro-batch's activations of one chunk, kept from its forward to its backward.
struct ActivationSet {
  int micro_batch = -1;  // -1: free
  int chunk = -1;        // the chunk it is laid out for
  Buffer<float> data;    // one allocation for every tensor below
  float* input = nullptr;  // [Nl,C] the embedding output or the received activation
  std::vector<BlockActivations> blocks;  // the chunk's layers
  // Last stage only: the final norm, the head and the loss.
  float *lnf = nullptr, *lnf_mean = nullptr, *lnf_rstd = nullptr;  // [Nl,C], [Nl], [Nl]
  float* lnf_full = nullptr;     // [B,T,C] the head's input, all rows
  float* logits = nullptr;       // [B,T,Vp/t] (row stride Gpt's logits_ld()), becomes dlogits in backward
  float* lse = nullptr;          // [B,T] log-sum-exp over the whole vocabulary
  float* target_logit = nullptr; // [B,T]
  float* losses = nullptr;       // [B,T]
  std::vector<int> inputs, targets;
  DocumentRows documents;  // under a document mask or cp: each row's position and visible keys
  std::vector<int> local_inputs, local_targets;  // under cp: this rank's rows of the tokens
  DocumentRows sequence_documents;  // under cp a2a with a document mask: the whole sequences' rows
  CpSplit split;                    // under cp: which rows of each sequence this rank holds
  int64_t step = 0, first_token_row = 0;  // dropout position
  // Whether p points into this set (so it stays until the set is freed).
  bool holds(const void* p) const {
    const char* begin = reinterpret_cast<const char*>(data.data());
    return p >= begin && p < begin + data.size() * sizeof(float);
  }
};

// The pool of activation sets, one per (chunk, micro-batch) in flight, and the one the
// running forward or backward uses. The Gpt lays a set out (its tensors' places in `data`);
// the pool decides which set serves which pass.
class ActivationSets {
 public:
  // Lays set s out for chunk c (allocating it to the chunk's capacity when its size differs).
  using Layout = std::function<void(int c, ActivationSet& s)>;
  // A set for (c, mb), made the current one: the one it already has (a forward again without
  // backward: evaluation), else a free one of `capacity` floats, else a new one; laid out
  // for c unless it already is.
  ActivationSet& open(int c, int mb, size_t capacity, const Layout& layout);
  // The set of (c, mb), made the current one (a backward).
  ActivationSet& use(int c, int mb);
  ActivationSet& find(int c, int mb);
  const ActivationSet& find(int c, int mb) const;
  // Frees the set of (c, mb): after its backward, its W, or a forward that will have no
  // backward (evaluation).
  void release(int c, int mb) { find(c, mb).micro_batch = -1; }
  // Micro-batches whose activations are held (forward done, backward, or W, not yet).
  int in_flight() const;
  ActivationSet& current() { return *current_; }
  const ActivationSet& current() const { return *current_; }
  // A new micro-batch shape: every set is dropped, or, with keep_memory, kept free and laid
  // out again on next use (no backward spans a change of shape).
  void reshape(bool keep_memory);

 private:
  std::vector<std::unique_ptr<ActivationSet>> sets_;  // a pool, laid out per use (open)
  ActivationSet* current_ = nullptr;  // the set the running forward/backward uses
};

// A zero-bubble schedule's split of the backward pass into B and W: the weight-gradient work
// each B leaves, by (chunk, micro-batch), until its W runs it.
class DeferredWeights {
 public:
  // Weight-gradient work a B left for its W: adds to unit `unit`'s gradients.
  struct Work {
    int unit = -1;
    std::function<void(float* unit_grads)> add;
    // Copies of what it reads that the next B would overwrite: the output gradient (fp32,
    // or at bf16 precision the rounded words the weight GEMM reads), and the input unless
    // it lies in the micro-batch's set (fp32 or bf16).
    Buffer<float> dout, inp;
    Buffer<uint16_t> dout16, inp16;
  };
  // A backward of (c, mb) begins: a B when `defer` (its weight work is kept for (c, mb)'s W),
  // else a whole backward. Either needs the micro-batch's last W to have run.
  void begin_backward(int c, int mb, bool defer);
  void end_backward() { deferring_ = false; }
  // Whether the backward running is a B.
  bool deferring() const { return deferring_; }
  // Keeps work of the running B for its W.
  void keep(Work work) { pending_[running_].push_back(std::move(work)); }
  // The W of (c, mb): its work in the order the B kept it, each unit's gradients acquired
  // from `store` and released to it after the unit's last piece of work.
  void run(int c, int mb, ParamStore& store);
  // Bytes the Bs whose W has not run keep for it (output gradients, inputs not in a set).
  int64_t pending_bytes() const;

 private:
  bool deferring_ = false;
  std::pair<int, int> running_{-1, -1};                       // the running backward's (chunk, micro-batch)
  std::map<std::pair<int, int>, std::vector<Work>> pending_;  // by (chunk, micro-batch)
};

// A rank that runs the embedding and the tied head in different chunks (zb-v's rank 0, in
// the V): their backwards interleave as the schedule's list orders them, and zb-v places
// its list for measured costs, so one gradient taking both would be summed in an order
// that follows the timings. The head's part adds up here instead, in micro-batch order,
// and joins the embedding's gradient at the step's last embedding backward: the same sums
// whatever the list, so runs repeat bit for bit.
class TiedHeadGrad {
 public:
  // Whether this rank's part needs it: a tied head, and the first and last stages in
  // different chunks of `chunks` (of a model of `layers` layers).
  void configure(const std::vector<ModelPart::Chunk>& chunks, int layers, bool untied_head);
  bool separate() const { return separate_; }
  // A pipeline executor's, before each step's passes: the set id of the step's last
  // micro-batch, where the head's gradient summed apart joins the embedding's.
  void set_last_micro_batch(int id) { last_micro_batch_ = id; }
  // Where a head backward adds its weight gradient: the running sum of `numel` floats
  // (zeroed on first use).
  float* sum(size_t numel);
  // After micro-batch mb's embedding backward added to the embedding's gradient `wte`:
  // on the step's last, adds the sum there and zeroes it.
  void join(int mb, float* wte);

 private:
  bool separate_ = false;
  Buffer<float> grad_;  // [this rank's vocabulary rows, C], fp32
  int last_micro_batch_ = -1;
};

// The three, as one Gpt holds them.
class PipelineState {
 public:
  ActivationSets& sets() { return sets_; }
  const ActivationSets& sets() const { return sets_; }
  DeferredWeights& weights() { return weights_; }
  const DeferredWeights& weights() const { return weights_; }
  TiedHeadGrad& tied_head() { return tied_head_; }
  const TiedHeadGrad& tied_head() const { return tied_head_; }
  // A zero-bubble schedule's W of chunk c on micro-batch mb (after its B, backward_chunk
  // with defer_weights): adds the linear layers' weight and bias gradients the B left, in
  // the order it left them, releases the units' gradients to `store` (the Gpt's
  // param_store()) and frees the set.
  void weight_pass(int c, int mb, ParamStore& store);

 private:
  ActivationSets sets_;
  DeferredWeights weights_;
  TiedHeadGrad tied_head_;
};

}  // namespace meshtrain::model
