// Everything a training run is configured by. The CLI fills it; run_training() consumes it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/ops.h"
#include "model/config.h"
#include "model/moe_routing.h"
#include "optim/adamw.h"
#include "optim/loss_scale.h"
#include "parallel/layout.h"
#include "train/curriculum.h"

namespace meshtrain::train {

struct TrainOptions {
  // Model: a preset, then explicit shape flags override it (0 = keep the preset's).
  std::string model_preset = "tiny";
  int layers = 0, heads = 0, dim = 0, vocab = 0;
  int seq_len = 0;  // T; 0 = the preset's
  // Architecture: a family's parts over the shape ("" = the preset's), then single parts
  // (-1 / 0 = keep).
  std::string arch;
  int kv_heads = -1, ffn_dim = -1;
  double rope_theta = 0;
  std::string init_from;  // any model file checkpoint::open_model_file() reads
  // Mixture of Experts (docs/moe.md): the architecture (experts 0: dense), then the
  // training settings of model::MoeTraining.
  int moe_experts = 0, moe_top_k = 2, moe_every = 1, moe_shared_experts = 0, moe_ffn_dim = 0;
  std::string moe_score = "softmax";  // softmax | sigmoid
  bool moe_renormalize = true;
  double moe_capacity_factor = 0;  // 0: dropless
  float moe_aux_loss = 0.01f, moe_z_loss = 0;
  std::string moe_balance = "sequence";  // sequence | micro-batch (layout-dependent)
  float moe_bias_speed = 0;  // aux-loss-free balancing's bias step (0: off)

  // Data: DIR/train.bin and DIR/val.bin.
  std::string data_dir = "data/brown";
  int micro_batch = 4;  // B, rows per micro-batch on each data-parallel rank
  int grad_accum = 0;   // A (0: 1, or derived from global_batch); G = B*A*dp rows
  int global_batch = 0; // G; when set, A = G/(B*dp) is derived for any layout
  // Document masks: attention inside each packed document, positions restarting at each.
  bool doc_mask = false;
  int doc_separator = -1;  // the token ending a document; -1: the data's tokenizer's end-of-text

  // Layout: world = pp x dp x tp (tp fastest). dp = 0: world/(tp*pp).
  int tp = 1, pp = 1, dp = 0;
  int cp = 1;                      // context parallelism: each sequence over cp ranks
  std::string cp_comm = "ring";    // ring | a2a | all-gather | hybrid
  int cp_a2a = 1;                  // hybrid: ranks in each all-to-all group
  int ep = 1;  // expert parallelism, carved out of dp (MoE models)
  // Which axis varies fastest over the world's ranks, then the next (comm/mesh.h): the
  // default keeps tp neighbours on one host; dp-tp-pp puts dp neighbours there instead.
  std::string rank_order = "tp-dp-pp";
  // The routed experts' tensor parallelism (Megatron's expert-tp): tp, each expert split over
  // the tp ranks like the dense MLP, or 1, each whole on every tp rank. 0: tp.
  int expert_tp = 0;
  // "auto": the layout flags are chosen by the planner (train/auto_plan.h) for `ranks`
  // ranks (from a plain shell; under mpirun the world's size).
  std::string plan;
  int ranks = 0;
  bool sp = false;            // sequence parallelism (needs tp > 1)
  std::string recompute = "none";  // none | selective | full
  int recompute_every = 1;         // apply it to blocks l with l % k == 0
  float dropout = 0;               // embedding and residual-branch dropout
  // Pipeline (pp > 1): schedule gpipe | 1f1b | interleaved, v chunks per rank (interleaved),
  // layers per stage (p*v entries; empty: balanced by cost).
  std::string schedule = "1f1b";
  int virtual_stages = 1;
  std::vector<int> stage_layers;
  std::string trace_file;     // Chrome trace of every rank (empty: none)
  bool profile = false;       // the step profile (train/step_profile.h) over steps after the first
  // Offload (ZeRO-Infinity): a comma list of optimizer=, params=, grads= each cpu or nvme.
  // cpu is host memory (where the state already lives on this CPU engine); nvme is files
  // under offload_dir. params and grads need ZeRO-3 (parse_offload in setup).
  std::string offload;
  std::string offload_dir;
  double offload_chunk_mb = 16;  // per state array and buffer
  bool offload_page_cache = false;  // stream through the page cache instead of O_DIRECT
  int offload_read_ahead = 2;    // ZeRO-3 parameter shards read ahead of use, in units
  // > 0: what does not fit goes to files: the optimizer state first, then (ZeRO-3) the
  // gradient shard, then the parameter shard.
  double memory_budget_gb = 0;
  // GEMM operand precision: fp32 | bf16 (bf16 x bf16 -> fp32 GEMMs; state stays fp32).
  std::string precision = "fp32";
  optim::LossScaleConfig loss_scale;  // fp16's dynamic loss scaling
  int zero = 0;               // ZeRO stage 0-3
  // ZeRO-3 parameters: "step" gathers each unit once per step and keeps it to the step's
  // end, "use" at every forward and backward use, "auto" step under pipelines, else use.
  std::string zero3_gather = "auto";
  double bucket_mb = 25;      // stage-0 gradient bucket size
  // Gradient compression of the data-parallel reduction (docs/compression.md): "none" or
  // "powersgd" (rank powersgd_rank, from step compress_start on; the steps before it reduce
  // plainly, as torch's start_powerSGD_iter).
  std::string compress = "none";
  int compress_start = 0;
  int powersgd_rank = 4;
  // ZeRO++'s quantized communication (parallel/dp/quantized_comm.h): ZeRO-3's parameter
  // gathers (qwZ) and ZeRO 1-3's gradient reduce-scatters (qgZ) as int8 blocks.
  bool zero_quantized_weights = false, zero_quantized_gradients = false;
  bool overlap = true;        // reductions overlap backward (false: after it, for measuring)
  double comm_timeout = 300;  // seconds before a stuck collective aborts the job (0: never)
  // Testing aid: this rank stops participating at this step (watchdog test).
  int debug_stall_rank = -1, debug_stall_step = -1;
  // A step whose loss or gradient norm is not finite (fp32, bf16; fp16 overflow is the loss
  // scaler's): "stop" ends the run before the update, naming the step and the units;
  // "skip" leaves the weights and moments as they were and goes on.
  std::string on_nonfinite = "stop";
  // "skip" gives up after this many skipped steps in a row (a diverged run, not a spike).
  int max_skipped_steps = 5;
  // Testing aid: at this step every rank's gradient of whole-model unit debug_nonfinite_unit
  // gets a NaN (0: never).
  int debug_nonfinite_step = 0, debug_nonfinite_unit = 1;
  int steps = 20;       // N
  uint64_t seed = 1337;
  int threads = 0;      // 0 = all cores

  optim::AdamWConfig adamw;
  // The learning-rate schedule's unit: "steps" (warmup and cosine over steps) or "tokens"
  // (warmup over --warmup-steps full-length steps' tokens, the cosine over the run's tokens:
  // with a curriculum, short early steps advance it less).
  std::string lr_unit = "steps";
  CurriculumOptions curriculum;  // sequence-length warmup (train/curriculum.h)

  std::string out_dir;   // metrics.jsonl, config.json, checkpoints/ (empty: no files)
  int eval_every = 0;    // 0: only at the end (when val.bin exists)
  int eval_batches = 8;
  int save_every = 0;    // 0: no periodic checkpoints
  int keep_checkpoints = 2;
  bool resume = false;
  bool resume_strict = false;  // --resume refuses a damaged newest checkpoint (else: the newest intact)
  bool overwrite = false;      // start again in an --out that holds a run (its checkpoints go)
  // On SIGINT/SIGTERM the run stops after the current step; it saves a checkpoint then on
  // "sigterm" (the default: schedulers send it before killing), "always" or "never".
  std::string save_on_exit = "sigterm";
  // Checkpoints (but the last) are snapshotted into memory and written by a thread while
  // training goes on; committed at a later step once every rank's shard is on disk.
  bool async_save = false;
  double peak_gflops = 0;  // 0: measured (cached)
  bool quiet = false;
  // Written to OUT/config.toml when non-empty (the CLI's resolved flags).
  std::string resolved_config_toml;
};

nlohmann::json to_json(const TrainOptions& o);

// --precision as the kernels' enum; an unknown name is an error naming the flag.
Status parse_precision_flag(const std::string& name, kernels::Precision* out);

// Which states --offload puts in files (nvme); cpu, and anything unnamed, stays in memory.
using parallel::OffloadTiers;
// Reads --offload (and --offload-dir): a clear error for a bad list. Which tiers need which
// ZeRO stage is a layout rule (parallel/layout.h).
Status parse_offload(const TrainOptions& o, OffloadTiers* out);

// The CLI's edge: the layout the flags describe on `world` ranks (parallel/layout.h). The
// enum-like strings (schedule, recompute, precision, compress, offload, rank order) are
// parsed here, once; dp is derived (world / (tp x pp) when --dp is 0) and the global batch
// resolved from --global-batch or B x A x dp. Errors here are about the flags themselves
// (an unknown name, a world the axes do not divide, --grad-accum against --global-batch);
// every rule joining a legal layout's parts is parallel::validate()'s.
Status to_layout(const TrainOptions& o, int world, parallel::Layout* out);

// What a run does at its edges, parsed once from TrainOptions' words (to_policy): skip or
// stop on a non-finite step (--on-nonfinite), when a stopped run saves (--save-on-exit),
// and what the learning-rate schedule counts (--lr-unit).
enum class OnNonfinite { kStop, kSkip };
enum class SaveOnExit { kSigterm, kAlways, kNever };
enum class LrUnit { kSteps, kTokens };
struct RunPolicy {
  OnNonfinite on_nonfinite = OnNonfinite::kStop;
  SaveOnExit save_on_exit = SaveOnExit::kSigterm;
  LrUnit lr_unit = LrUnit::kSteps;
};
Status to_policy(const TrainOptions& o, RunPolicy* out);

// The MoE layers' training settings from the flags (checked by resolve_model).
model::MoeTraining moe_training(const TrainOptions& o);
// --expert-tp as the layout's choice.
model::ExpertTp expert_tp(const TrainOptions& o);

// Every real-valued flag of train in one place: NaN and infinity are refused by name, and
// each flag's range (--lr >= 0, --beta1 in [0, 1), --grad-clip > 0 or 0 for off, ...).
Status check_real_flags(const TrainOptions& o);

// Resolves preset + flags (+ the --init-from file) into the model shape and T.
Status resolve_model(const TrainOptions& o, model::GptConfig* config, int* seq_len);

}  // namespace meshtrain::train
