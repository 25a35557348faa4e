// The decoder-only transformer of a GptConfig (GPT-2, Llama, or another mix of the parts
// model/config.h describes) with explicit forward and backward passes over flat parameter
// and gradient buffers. One object per rank holds the rank's part of the model (all of it, or the
// pipeline stages it runs); activations are sized for micro-batches of B x T, one stored
// set per micro-batch in flight.
#pragma once
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "comm/group.h"
#include "core/memory.h"
#include "kernels/ops.h"
#include "model/config.h"
#include "model/moe_routing.h"
#include "model/recompute.h"
#include "model/param_layout.h"
#include "model/param_store.h"
#include "model/context_parallel.h"
#include "model/pipeline_state.h"

namespace meshtrain::model {

// What each block keeps for its backward pass (Korthikanti et al. 2022's trade):
//   kNone: everything; kSelective: all but the attention core's output and log-sum-exp,
//   recomputed from the stored qkv in backward; kFull: only the block's output (the next
//   block's input), the whole block recomputed in backward.
// (model::Recompute, model/recompute.h.)

// The activation inventory of one tensor-parallel rank for B x T micro-batches, in floats
// (activations are fp32), as a Gpt lays it out; computed without a model or an allocation,
// so the planner predicts activation memory with the engine's own accounting. N = B*T token
// rows, Nl = N/t residual-stream rows under sequence parallelism (else N), Cl = C/t,
// NHl = NH/t, Ql = Q/t, Fcl = Fc/t, Fl = F/t (BlockActivations' widths).
struct ActivationInventory {
  // One block's stored tensors per recompute mode (BlockActivations): kNone 4 [Nl,C]
  // residual-stream tensors, their row statistics (4 for LayerNorm, 2 for RMSNorm), qkv
  // [N,Ql], the attention output [N,Cl], its log-sum-exp [N,NHl] and the MLP's [N,Fcl] and
  // [N,Fl]; kSelective all but the attention output and log-sum-exp; kFull the block's
  // output [Nl,C] only.
  int64_t block_none = 0, block_selective = 0, block_full = 0;
  // An MoE layer's block: the dense MLP's two tensors replaced by the router's logits
  // [N,E], the routing (4 [N*k] and [E+1] ints), the counts received [E] (ep x E/ep), the
  // experts' hidden [R,Fcel], [R,Fel], when rows move between ranks (ep > 1, or experts
  // replicated over tp) their received input [R,C], the outputs back at their tokens [Nk,C],
  // and the shared experts' [N,S*Fcsl], [N,S*Fsl] (k = top_k, S = shared, R =
  // moe_expert_rows: the most rows this rank's experts can be sent; Fcel, Fel an expert's
  // widths on this rank, whole when the experts are replicated over tp; Fcsl, Fsl a shared
  // expert's, always split over tp).
  int64_t moe_block_none = 0, moe_block_selective = 0;
  int64_t set_input = 0;  // every set's input [Nl,C]
  // A last-stage set's head: final norm [Nl,C] and its statistics, the gathered head input
  // [N,C] (sequence parallel only), logits [N,Vp/t], log-sum-exp, target logit and loss [N].
  int64_t head = 0;
  // Scratch shared by every set: what recomputation rebuilds (kSelective the attention
  // output and log-sum-exp, kFull one whole block) and the backward pass's gradients of a
  // block's intermediates and tensor-parallel exchange buffers.
  int64_t recompute_selective = 0, recompute_full = 0;
  int64_t gradient_scratch = 0;

  int64_t block(Recompute mode, bool moe = false) const;
  int64_t recompute_scratch(Recompute mode) const;
};
ActivationInventory activation_inventory(const GptConfig& config, int B, int T, int tp, bool sequence_parallel,
                                         int ep = 1, double capacity_factor = 0,
                                         ExpertTp expert_tp = ExpertTp::kSplit, int cp = 1);

// The most rows one rank's experts of an MoE layer can receive in a B x T micro-batch on
// each of ep ranks: every rank's tokens each sending min(k, E/ep) of its choices here
// (dropless), or, with a capacity factor, each rank's sequences at most the capacity per
// expert. The worst case is reserved: the activation memory does not depend on the routing.
// With the experts replicated over `replicas` tp ranks, each computes on its share of every
// source's rows: at most ceil(R / replicas) + ep of them (each share rounds up by a row).
// Under cp, T is a rank's rows of each sequence and the capacity the whole sequence's
// (T x cp rows).
int64_t moe_expert_rows(const GptConfig& config, int B, int T, int ep, double capacity_factor, int replicas = 1,
                        int cp = 1);

// FLOPs the model executed (matmuls and attention, 2 per multiply-add), split into the
// model's own forward/backward and the forward work repeated by recomputation.
struct FlopCounts {
  double model = 0, recompute = 0;
};

class Gpt {
 public:
  // Which full buffers the model owns itself; the rest comes from a ParamStore set before
  // running (ZeRO-2 shards gradients, ZeRO-3 also parameters).
  enum class LocalState { kParamsAndGrads, kParamsOnly, kNone };
  // With a tensor-parallel group `tp` of size t, this rank holds and computes its slice:
  // heads and MLP columns split Megatron-style, the vocabulary split for the embedding and
  // the cross-entropy (see ParamLayout's TpSplit). Null: the whole model.
  // With sequence_parallel (tp > 1), LayerNorms, residual adds and the residual stream work
  // on 1/t of the tokens (rows [r*N/t, (r+1)*N/t) of the B*T rows); the tp all-reduces
  // become an all-gather before each column-parallel linear and a reduce-scatter after each
  // row-parallel one (Korthikanti et al. 2022).
  // `part`: the pipeline stages this rank runs (see ModelPart; empty: the whole model).
  // `ep`: the expert-parallel group (MoE), over which each MoE layer's experts are split,
  // E/ep per rank, tokens dispatched to them and combined back by all-to-all (null: one).
  // `expert_tp`: the routed experts split over tp like the dense MLP, or whole on every tp
  // rank (ExpertTp, docs/moe.md).
  explicit Gpt(const GptConfig& config, LocalState local = LocalState::kParamsAndGrads,
               comm::Group* tp = nullptr, bool sequence_parallel = false,
               const ModelPart& part = {}, comm::Group* ep = nullptr,
               ExpertTp expert_tp = ExpertTp::kSplit);
  // Dropout with probability p on the embedding output and on each block's two residual
  // branches (attention and MLP outputs, after their bias). Masks come from a counter-based
  // hash of (seed, step, site, global token row, column) and are never stored.
  void set_dropout(float p, uint64_t seed) { dropout_p_ = p, dropout_seed_ = seed; }
  float dropout_probability() const { return dropout_p_; }
  // Where the next micro-batch sits: optimizer step and the global index of its first token
  // row (row j of the global batch, token i: j*T + i).
  void set_batch_position(int64_t step, int64_t first_token_row) {
    step_ = step, first_token_row_ = first_token_row;
  }
  // The precision of every linear layer's and the head's GEMMs (kernels::Precision): bf16
  // rounds both operands to bfloat16 and accumulates in fp32, and so do the attention
  // core's four products at bf16. Parameters, gradients, activations, LayerNorm, softmax
  // and the loss stay fp32.
  void set_precision(kernels::Precision p) { precision_ = p; }
  // Document masks (model/document_rows.h): attention stays inside each document of a
  // packed row, ended by token `separator`, and positions restart at each; -1: off. Every
  // pipeline stage then needs the micro-batch's tokens (forward_chunk's inputs).
  void set_document_mask(int separator) { doc_separator_ = separator; }
  bool document_mask() const { return doc_separator_ >= 0; }
  // Context parallelism (model/context_parallel.h): each sequence split over the ranks of
  // `groups.cp` (null or size 1: off). The B x T micro-batches passed in stay whole; this
  // rank runs its T/cp rows of each, and the losses it returns are the whole sequences'.
  // Set before reserve_activations.
  void set_context_parallel(const CpGroups& groups, CpComm comm = CpComm::kRing);
  int cp_size() const { return cp_ ? cp_->size() : 1; }
  kernels::Precision precision() const { return precision_; }
  // Recomputation policy for blocks l with l % every == 0 (others keep everything).
  void set_recompute(Recompute mode, int every = 1);
  const FlopCounts& flops() const { return flops_; }
  // Lays out the activations for a B x T micro-batch (as the first forward would) and
  // returns the bytes kept for backward by one micro-batch in flight through every chunk
  // (the per-block inventory plus the head's) plus the recomputation scratch, without the
  // backward pass's gradient scratch; the tracker's "activations" peak includes all three.
  int64_t stored_activation_bytes(int B, int T);
  // Sizes the activation memory for B x T once: forwards with B rows of up to T tokens (a
  // sequence-length curriculum's short steps, evaluations) lay their tensors out in it
  // instead of allocating anew at each length, whose first touch costs more than the step
  // (0.2-0.7 s per new length on the Brown runs of docs/curriculum.md). 0: none.
  void reserve_activations(int B, int T) { reserved_B_ = B, reserved_T_ = T / cp_size(), B_ = T_ = 0; }
  // Bytes of one micro-batch's stored set for chunk c, and of the scratch shared by all
  // sets (recomputation and backward). Sets of equal size are one pool, so the activation
  // peak = sum over set sizes of (most sets of that size alive at once) x size + shared.
  int64_t activation_set_bytes(int c) const;
  int64_t shared_activation_bytes() const { return (int64_t)shared_.bytes(); }
  void reset_flops() { flops_ = FlopCounts{}; }
  // MoE layers: the balancing losses and capacity, and what routing did since the last reset
  // (per layer l: moe_stats()[l], empty for dense layers and layers this rank does not run).
  void set_moe_training(const MoeTraining& t) { moe_training_ = t, B_ = T_ = 0; }
  const MoeTraining& moe_training() const { return moe_training_; }
  const std::vector<MoeRouteStats>& moe_stats() const { return moe_stats_; }
  void reset_moe_stats();
  // Under cp with a document mask: the step's worst micro-batch, the keys its most loaded
  // rank's rows see over the mean, for the split it ran and for the causal split (1: even).
  struct CpBalance {
    double used = 0, causal = 0;
  };
  const CpBalance& cp_balance() const { return cp_balance_; }
  void reset_cp_balance() { cp_balance_ = {}; }
  // Aux-loss-free balancing (MoeTraining::bias_speed > 0): the routing bias of every MoE
  // layer, [layers x E] (dense layers' rows unused), held for all layers on every rank and
  // the same everywhere: the trainer updates it from the job's loads after each step.
  std::vector<float>& moe_bias();

  const GptConfig& config() const { return config_; }
  // RoPE's cos and sin [max_seq_len, hs/2] (empty for learned positions), for the decoder.
  const float* rope_cos() const { return rope_cos_.data(); }
  const float* rope_sin() const { return rope_sin_.data(); }
  const ParamLayout& layout() const { return layout_; }
  bool has_local_params() const { return local_ != nullptr; }
  bool has_local_grads() const { return local_ && local_->has_grads(); }
  float* params();
  const float* params() const;
  float* grads();
  size_t num_elements() const { return layout_.total(); }
  // Redirects parameter and gradient access (ZeRO stores, reduction hooks); null restores
  // the local buffers.
  void set_param_store(ParamStore* store);
  // Where the parameters are read from: the local buffers' store, or the one set.
  ParamStore* param_store() const { return store_; }

  // GPT-2 initialisation for every architecture: N(0, 0.02), residual projections (attention
  // and MLP outputs) N(0, 0.02/sqrt(2L)), zero biases, unit norm weights; padded vocabulary
  // rows stay zero.
  void init_weights(uint64_t seed);
  // Sets this rank's parameters from whole-model weights in the tp = 1 layout.
  void set_from_global(const float* global_params);

  // Runs the whole model on inputs[B,T] and returns the mean loss over targets[B,T].
  // Keeps the activations for backward().
  float forward(const int* inputs, const int* targets, int B, int T);
  // Logits only (no targets): returns a pointer to logits[B,T,Vp] valid until the next call.
  const float* forward_logits(const int* inputs, int B, int T);
  // Accumulates into grads() the gradient of (loss_scale * sum of token losses) of the
  // last forward(); loss_scale = 1/(tokens in the global batch) gives the mean.
  void backward(float loss_scale);
  void zero_grads();

  // --- pipeline stages: chunk c of this rank's part, micro-batch mb ---
  int num_chunks() const { return (int)chunks_.size(); }
  const ModelPart::Chunk& chunk(int c) const { return chunks_[c]; }
  bool is_first_stage(int c) const { return chunks_[c].begin == 0; }
  bool is_last_stage(int c) const { return chunks_[c].end == config_.layers; }
  // Elements of the tensor passed between stages: this rank's residual-stream rows x C
  // (1/t of the tokens under sequence parallelism).
  size_t boundary_elements(int B, int T) const;
  // Forward of chunk c on micro-batch mb: from the tokens inputs[B,T] (first stage) or from
  // `input`, the previous stage's output. The last stage also needs targets[B,T] and
  // returns the mean loss over them (others return 0). The activations stay in a set of
  // their own until backward_chunk(c, mb); the output is chunk_output(c, mb).
  float forward_chunk(int c, int mb, const int* inputs, const int* targets, const float* input,
                      int B, int T);
  const float* chunk_output(int c, int mb) const;
  // Backward of chunk c on micro-batch mb: from the loss (last stage, scaled as in
  // backward()) or from `dout`, the gradient of the chunk's output. Frees the set. Except on
  // the first stage, the gradient of the chunk's input is left in input_grad().
  //
  // With defer_weights (a zero-bubble schedule's B), the linear layers' weight and bias
  // gradients are left for the micro-batch's W (pipeline().weight_pass(c, mb, ...)), which
  // adds them in the same order, releases the units' gradients to the store and frees the
  // set. What W reads is kept: each linear layer's output gradient copied out of the
  // scratch, which the next B overwrites, and its input too unless it lies in the
  // micro-batch's set (recomputed activations do not; rows gathered under sp are gathered
  // again from the stored shard); the head's reads stay in the set. A tied head's weight
  // gradient on a rank that also runs the embedding stays in B: the embedding unit's
  // gradient would otherwise be released before the head adds to it.
  void backward_chunk(int c, int mb, const float* dout, float loss_scale, bool defer_weights = false);
  const float* input_grad() const { return dresidual_; }
  // What the passes keep between them for a pipeline schedule (model/pipeline_state.h): the
  // activation sets in flight, the Ws' work, zb-v's tied head gradient. The executor drives
  // it between passes: sets alive, Ws, the step's last micro-batch, an evaluation's set.
  PipelineState& pipeline() { return pipeline_; }
  const PipelineState& pipeline() const { return pipeline_; }

  // FLOPs per token of forward + backward, llm.c's convention: 6N + 6*L*T*C.
  double flops_per_token(int T) const;

 private:
  void ensure_activations(int B, int T);
  size_t set_floats(int c, const ActivationInventory& inventory) const;
  // What a set for chunk c holds: set_floats at this length, or at the reserved one when
  // this length fits in it (reserve_activations).
  size_t set_capacity(int c) const;
  bool within_reserve() const { return reserved_B_ == B_ && T_ <= reserved_T_; }
  template <typename Take>
  void take_block(BlockActivations& a, Take& take, bool with_core, bool with_output, bool moe) const;
  void layout_set(int c, ActivationSet& s);
  void tp_all_reduce(float* x, size_t n, comm::ReduceOp op = comm::ReduceOp::kSum);
  // Conjugate pair on the token rows: all of them from this rank's share (identity without
  // sequence parallelism), and this rank's share of their sum over tp (an all-reduce in
  // place without; a reduce-scatter into `local` with). Both return where the result is.
  const float* gather_rows(const float* local, float* full);
  const float* reduce_rows(float* full_partial, float* local);
  // LayerNorm backward whose weight gradients are partial under sequence parallelism.
  // The block's norm (LayerNorm or RMSNorm; bias and mean unused by RMSNorm) on `rows` rows.
  void norm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                    const float* bias, int rows) const;
  // The norm's backward; its weight gradients are partial under sequence parallelism.
  void norm_backward_tp(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean,
                        const float* rstd, int rows);
  // RoPE on q and k of a block's qkv (inverse: on their gradients); no-op for learned positions.
  void rotate_qk(float* qkv, int B, int T, bool inverse) const;
  // Each row's position under a document mask or cp (the set's), else null: row t is at t.
  const int* row_positions() const;
  bool rows_placed() const { return document_mask() || cp_; }  // the set's documents hold each row's place
  // The whole sequences' document rows (a2a under a document mask), else null.
  const DocumentRows* sequence_documents() const;
  // Places the opened set's rows: their positions and keys; under cp, takes this rank's rows
  // of inputs and targets into it and points them there.
  void place_rows(ActivationSet& s, const int*& inputs, const int*& targets, int B, int T);
  // The tensor between stages for B rows of Tl tokens on this rank.
  size_t local_boundary_elements(int B, int Tl) const;
  // The attention core of block activations a (out atty, att_lse from qkv), and its
  // backward into dqkv_: causal, or by each row's key range under a document mask.
  void attend(BlockActivations& a, int B, int T);
  void attend_backward(const BlockActivations& a, int B, int T);
  double attention_flops(int B, int T) const;  // the forward's, for the step profile
  kernels::AttentionBlock ranged_block(const float* qkv, int B, int T) const;
  void vocab_parallel_loss(int N);
  // Row stride of a set's logits: the real columns (vn) packed, not the padded Vl. The
  // bf16 head GEMM writing 50257 columns at a stride of 50304 floats (a multiple of 512
  // bytes, so rows alias in the cache) ran 30% slower than at a stride of 50257.
  int logits_ld() const { return vn_ > 0 ? vn_ : Vl_; }
  // Pieces of a chunk's forward and backward on the current set.
  void embedding_forward(const int* inputs, int B, int T);
  const float* blocks_forward(int c, const float* residual, int B, int T);
  void head_forward(const float* residual, int B, int T);
  void head_backward(int c, int B, int T, float loss_scale);
  void embedding_backward(int B, int T);
  // The activation set the running forward or backward uses.
  ActivationSet& set() { return pipeline_.sets().current(); }
  const ActivationSet& set() const { return pipeline_.sets().current(); }
  BlockActivations& acts(int l) { return set().blocks[l - chunks_[cur_chunk_].begin]; }
  int cur_chunk_ = 0;

  // Gradient of tensor t of unit u, whose fp32 gradient buffer acquire_grads(u) returned as
  // `unit_base` (ParamStore::fp32_grad_tensor), and where a linear weight's GEMM adds its
  // gradient: the store's 16-bit gradient when it takes them there, else the same fp32.
  float* grad(int u, float* unit_base, const ParamTensor& t) const {
    return store_->fp32_grad_tensor(unit_base, u, t, layout_);
  }
  kernels::GradOutput weight_grad(int u, float* unit_base, const ParamTensor& t) const;
  // Parameter tensor t of unit u, whose fp32 parameters acquire_params(u) returned as
  // `unit_base` (the store decides where t lies in it: ParamStore::fp32_tensor).
  const float* param(int u, const float* unit_base, const ParamTensor& t) const {
    return store_->fp32_tensor(unit_base, u, t, layout_);
  }
  // A GEMM weight: from the store's bf16 copy of the unit when it keeps one
  // (ParamStore::acquired_bf16), else fp32.
  kernels::GemmInput gemm_weight(int u, const float* unit_base, const ParamTensor& t) const;
  // The MLP's hidden activation, GELU(fch) or SwiGLU(fch): written by activation_into,
  // read by the down projection's GEMMs. bf16 GEMMs get it as bf16 words, rounded once where
  // the activation writes it.
  kernels::GemmInput activation_into(BlockActivations& a, int N) const;
  kernels::GemmInput activate(const float* fc, float* out, int rows, int F) const;
  kernels::GemmInput hidden_input(const float* out) const;
  void activation_backward(float* dfc, const float* fc, const float* dout, int rows, int F) const;
  // An MoE layer's MLP on block l (unit u) from a.ln2: leaves the branch output, before
  // the tp reduction, in partial_ (all N rows); backward leaves the input gradient there.
  void moe_forward(int l, int u, const float* unit, BlockActivations& a, int B, int T, bool recomputing);
  void moe_route_rows(BlockActivations& a, int N, int T, MoeRouteStats* stats, const float* bias);
  void moe_backward(int l, int u, const float* unit, float* gunit, BlockActivations& a, int B, int T);
  void moe_choice_grads(const BlockActivations& a, const float* dout, int N);
  void moe_experts_backward(int l, BlockActivations& a, const std::vector<int>& offsets, float* dy, const float* rows);
  void moe_router_backward(int l, int u, const float* unit, float* gunit, const BlockActivations& a, const float* x,
                           int N, int T);
  // Expert parallelism (ep > 1): rows in dispatch order (by global expert) to this rank's
  // experts, arriving expert-major in `out`, and back, where `rows` is scratch afterwards.
  // Under tp each tp rank carries only its share of the rows over ep; the tp group
  // completes them for split experts, and replicated experts compute on that share alone
  // (docs/moe.md, "Dispatch under tensor parallelism"). The way there is
  // split so that compute can run while the all-to-all is in flight: begin (`pack`: scratch
  // of the dispatch's size, which the all-to-all reads until end) returns its request and
  // the rows this rank sends to and receives from other ep ranks; end completes it into `out`.
  void moe_count_received(BlockActivations& a);
  struct MoeDispatch {
    comm::RequestPtr request;
    int64_t sent = 0, received = 0;
  };
  MoeDispatch moe_to_experts_begin(const BlockActivations& a, const float* rows, float* pack);
  void moe_to_experts_end(const BlockActivations& a, MoeDispatch& d, float* out);
  void moe_from_experts(const BlockActivations& a, float* rows, float* out);
  void moe_tp_exchange(float* staging, const std::vector<int>& segment_start, bool reduce, float* scratch);
  // What shapes an MoE layer's exchange: P ep ranks of El experts, the T tp ranks sharing
  // the rows (1 when rows stay here) and this one t, whether it computes on its share
  // alone (replicated experts), and the rows each ep rank sent for each of its experts.
  struct MoeExchange {
    int P = 1, El = 0, T = 1, t = 0;
    bool replicated = false;
    const int* received = nullptr;
  };
  MoeExchange moe_exchange(const BlockActivations& a) const;
  std::vector<int> moe_expert_offsets(const BlockActivations& a) const;
  double moe_flops(int N, int dispatched) const;
  kernels::GemmInput mlp_hidden(const BlockActivations& a) const;
  void block_forward(int l, const float* residual, int B, int T, bool recomputing = false);
  Recompute recompute_of(int l) const;
  void count_block_flops(int l, int B, int T, bool recomputing, bool attention_only);
  // A linear layer's backward on unit u: the input gradient now (if dinp), the weight and
  // bias gradients now, or deferred to the micro-batch's W (backward_chunk). `local_rows`:
  // under sequence parallelism, the sequence shard that `inp` was all-gathered from; a W
  // gathers it again when it lies in the micro-batch's set, instead of keeping a copy of
  // every row (the tp ranks run the same lists, so they meet in that all-gather).
  void linear_backward(float* dinp, int u, float* gunit, const ParamTensor& w, const ParamTensor* b,
                       const float* dout, kernels::GemmInput inp, kernels::GemmInput weight, int N, int C, int OC,
                       const float* local_rows = nullptr);
  void block_backward(int l, const float* block_in, int B, int T);
  void add_kv_replica_grads(kernels::GradOutput dqkv_weight, float* dqkv_bias, const float* inp, int N);

  GptConfig config_;
  ParamLayout layout_;
  std::unique_ptr<LocalParamStore> local_;
  ParamStore* store_ = nullptr;

  std::vector<ModelPart::Chunk> chunks_;
  int B_ = 0, T_ = 0;
  ActivationInventory inventory_;  // for B_ x T_ (activation_inventory)
  int reserved_B_ = 0, reserved_T_ = 0;  // reserve_activations
  ActivationInventory reserved_;         // for the reserved shape, while within_reserve()
  PipelineState pipeline_;  // the activation sets, among the rest (pipeline())
  // Scratch shared by every set: recomputed tensors, the gradients of activations reused
  // by every block in backward, and buffers for the tensor-parallel exchanges.
  Buffer<float> shared_;
  float *dresidual_, *dln_, *datty_, *dqkv_, *dfch_, *dfch_gelu_;
  float* kv_exchange_ = nullptr;  // [kv heads, N, 2hs] replicated heads' k, v gradients
  int kv_replicas_ = 1;           // tp ranks holding each key/value head
  float* partial_;   // [B,T,C] a row-parallel linear's output before the tp reduction
  float* gathered_;  // [B,T,C] an all-gathered residual-stream tensor (sequence parallel)
  bool sp_ = false;
  int Nl_ = 0;  // token rows of the residual stream on this rank
  void dropout(float* x, int rows, int site) const;  // rows = this rank's residual rows
  void branch_with_dropout(float* x, const float* bias, int rows, int site);
  void residual_add(float* out, const float* residual, const float* branch, int rows) const;  // out = residual + branch
  const float* dropout_grad(const float* dresidual, int site);  // masked copy, or dresidual
  float dropout_p_ = 0;
  uint64_t dropout_seed_ = 0;
  int doc_separator_ = -1;  // set_document_mask
  comm::Group* cp_ = nullptr;  // set_context_parallel (null: off)
  CpBalance cp_balance_;
  std::unique_ptr<RingAttention> ring_;        // --cp-comm ring
  std::unique_ptr<UlyssesAttention> ulysses_;  // --cp-comm a2a, and hybrid (with its ring across)
  std::unique_ptr<GatherAttention> gather_;    // --cp-comm all-gather
  int64_t step_ = 0, first_token_row_ = 0;
  float* dbranch_ = nullptr;  // [Nl, C] a residual branch's gradient after the dropout mask
  kernels::Precision precision_ = kernels::Precision::kFp32;
  Recompute recompute_ = Recompute::kNone;
  int recompute_every_ = 1;
  BlockActivations scratch_{};  // where recomputed tensors live (one set, shared by blocks)
  BlockActivations moe_scratch_{};  // the same for MoE layers (aliasing scratch_'s memory)
  // MoE layers' shared scratch: dispatched input rows [Nk,C], their output gradients (then
  // input gradients) [Nk,C], the experts' (or shared experts') hidden gradients, the
  // weights' gradients [N*k] and the router logits' [N,E].
  float *moe_rows_ = nullptr, *moe_dy_ = nullptr, *moe_dact_ = nullptr, *moe_dfch_ = nullptr;
  float* moe_xchg_ = nullptr;  // [R,C] (ep_ set) rows as they arrive from an all-to-all
  // The group rows are dispatched over: the ep group when ep > 1, a group of one when the
  // experts are replicated over tp without ep (each tp rank still takes its share), else null.
  comm::Group* ep_ = nullptr;
  std::unique_ptr<comm::Group> own_ep_;  // that group of one
  float *moe_dweight_ = nullptr, *moe_dlogits_ = nullptr;
  int Fcel_ = 0, Fel_ = 0;  // one routed expert's first-projection rows and hidden width on this rank
  int Fcsl_ = 0, Fsl_ = 0;  // one shared expert's (always split over tp)
  // The tp ranks that hold each routed expert whole and share its rows: tp when the experts
  // are replicated over tp, else 1.
  int expert_replicas() const { return layout_.experts_replicated() ? tp_size_ : 1; }
  MoeTraining moe_training_;
  std::vector<MoeRouteStats> moe_stats_;
  std::vector<float> moe_bias_;
  float loss_scale_ = 0;  // of the running backward (the balance losses' gradient scale)
  FlopCounts flops_;

  comm::Group* tp_ = nullptr;  // null when tp = 1
  int tp_size_ = 1, tp_rank_ = 0;
  // This rank's slice: attention width Cl = C/t with NHl query and NKVl key/value heads,
  // fused qkv width Ql, the MLP's first projection Fcl and hidden width Fl, vocabulary rows
  // [vb, vb + Vl) of which vn are real tokens.
  int Cl_, NHl_, NKVl_, Ql_, Fcl_, Fl_, Vl_, vb_, vn_;
  std::vector<float> rope_cos_, rope_sin_;  // [max_seq_len, hs/2] (RoPE only)
};

}  // namespace meshtrain::model
