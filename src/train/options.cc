#include "train/options.h"

#include <cmath>
#include <cstdio>
#include <limits>

#include "checkpoint/model_file.h"

namespace meshtrain::train {

nlohmann::json to_json(const TrainOptions& o) {
  return {{"model", o.model_preset},
          {"layers", o.layers},
          {"heads", o.heads},
          {"dim", o.dim},
          {"vocab", o.vocab},
          {"seq_len", o.seq_len},
          {"arch", o.arch},
          {"kv_heads", o.kv_heads},
          {"ffn_dim", o.ffn_dim},
          {"rope_theta", o.rope_theta},
          {"init_from", o.init_from},
          {"moe_experts", o.moe_experts},
          {"moe_top_k", o.moe_top_k},
          {"moe_every", o.moe_every},
          {"moe_shared_experts", o.moe_shared_experts},
          {"moe_ffn_dim", o.moe_ffn_dim},
          {"moe_score", o.moe_score},
          {"moe_renormalize", o.moe_renormalize},
          {"moe_capacity_factor", o.moe_capacity_factor},
          {"moe_aux_loss", o.moe_aux_loss},
          {"moe_z_loss", o.moe_z_loss},
          {"moe_balance", o.moe_balance},
          {"moe_bias_speed", o.moe_bias_speed},
          {"data", o.data_dir},
          {"micro_batch", o.micro_batch},
          {"grad_accum", o.grad_accum},
          {"global_batch", o.global_batch},
          {"tp", o.tp},
          {"cp", o.cp},
          {"cp_comm", o.cp_comm},
          {"cp_a2a", o.cp_a2a},
          {"pp", o.pp},
          {"dp", o.dp},
          {"ep", o.ep},
          {"expert_tp", o.expert_tp},
          {"schedule", o.schedule},
          {"virtual_stages", o.virtual_stages},
          {"stage_layers", o.stage_layers},
          {"trace", o.trace_file},
          {"offload", o.offload},
          {"offload_dir", o.offload_dir},
          {"offload_chunk_mb", o.offload_chunk_mb},
          {"offload_page_cache", o.offload_page_cache},
          {"offload_read_ahead", o.offload_read_ahead},
          {"plan", o.plan},
          {"ranks", o.ranks},
          {"memory_budget", o.memory_budget_gb},
          {"sp", o.sp},
          {"recompute", o.recompute},
          {"recompute_every", o.recompute_every},
          {"dropout", o.dropout},
          {"doc_mask", o.doc_mask},
          {"doc_separator", o.doc_separator},
          {"precision", o.precision},
          {"loss_scale", o.loss_scale.initial},
          {"loss_scale_window", o.loss_scale.growth_interval},
          {"loss_scale_backoff", o.loss_scale.backoff},
          {"loss_scale_min", o.loss_scale.min_scale},
          {"zero", o.zero},
          {"zero3_gather", o.zero3_gather},
          {"bucket_mb", o.bucket_mb},
          {"compress", o.compress},
          {"compress_start", o.compress_start},
          {"powersgd_rank", o.powersgd_rank},
          {"overlap", o.overlap},
          {"comm_timeout", o.comm_timeout},
          {"async_save", o.async_save},
          {"rank_order", o.rank_order},
          {"on_nonfinite", o.on_nonfinite},
          {"max_skipped_steps", o.max_skipped_steps},
          {"save_on_exit", o.save_on_exit},
          {"steps", o.steps},
          {"seed", o.seed},
          {"threads", o.threads},
          {"lr", o.adamw.lr},
          {"min_lr", o.adamw.min_lr},
          {"warmup_steps", o.adamw.warmup_steps},
          {"lr_unit", o.lr_unit},
          {"curriculum", o.curriculum.kind},
          {"curriculum_start", o.curriculum.start},
          {"curriculum_steps", o.curriculum.steps},
          {"curriculum_schedule", o.curriculum.schedule},
          {"curriculum_step", o.curriculum.step},
          {"curriculum_root", o.curriculum.root},
          {"curriculum_discrete", o.curriculum.discrete},
          {"weight_decay", o.adamw.weight_decay},
          {"beta1", o.adamw.beta1},
          {"beta2", o.adamw.beta2},
          {"eps", o.adamw.eps},
          {"grad_clip", o.adamw.grad_clip},
          {"out", o.out_dir},
          {"eval_every", o.eval_every},
          {"eval_batches", o.eval_batches},
          {"save_every", o.save_every},
          {"keep_checkpoints", o.keep_checkpoints},
          {"peak_gflops", o.peak_gflops}};
}

Status parse_precision_flag(const std::string& name, kernels::Precision* out) {
  if (kernels::parse_precision(name, out).is_ok()) return Status::ok();
  return Status::error("--precision must be fp32, bf16 or fp16, got '" + name + "'");
}

model::MoeTraining moe_training(const TrainOptions& o) {
  model::MoeTraining t;
  t.capacity_factor = o.moe_capacity_factor, t.aux_loss = o.moe_aux_loss, t.z_loss = o.moe_z_loss;
  t.balance = o.moe_balance == "micro-batch" ? model::MoeBalance::kMicroBatch : model::MoeBalance::kSequence;
  t.bias_speed = o.moe_bias_speed;
  return t;
}

model::ExpertTp expert_tp(const TrainOptions& o) {
  return o.expert_tp == 1 ? model::ExpertTp::kReplicated : model::ExpertTp::kSplit;
}

namespace {

// --global-batch, or B x A x dp; A from --global-batch must agree with --grad-accum.
Status resolve_batch(const TrainOptions& o, int dp, parallel::Layout* l) {
  l->micro_batch = o.micro_batch;
  if (o.global_batch <= 0) {
    l->global_batch = o.micro_batch * std::max(1, o.grad_accum) * dp;
    return Status::ok();
  }
  l->global_batch = o.global_batch;
  const long long rows = (long long)o.micro_batch * dp;
  if (rows < 1 || o.global_batch % rows != 0 || o.grad_accum <= 0) return Status::ok();  // (a layout rule)
  const long long A = o.global_batch / rows;
  if (o.grad_accum != A)
    return Status::error("--grad-accum " + std::to_string(o.grad_accum) + " conflicts with --global-batch " +
                         std::to_string(o.global_batch) + " = micro-batch " + std::to_string(o.micro_batch) +
                         " x dp " + std::to_string(dp) + " x grad-accum " + std::to_string(A));
  return Status::ok();
}

// The enum-like choices, parsed once.
Status parse_choices(const TrainOptions& o, parallel::Layout* l) {
  RETURN_IF_ERROR(parallel::pp::parse_schedule_kind(o.schedule, &l->schedule));
  if (model::parse_recompute(o.recompute, &l->recompute).is_ok() == false)
    return Status::error("--recompute must be none, selective or full, got '" + o.recompute + "'");
  RETURN_IF_ERROR(parse_precision_flag(o.precision, &l->precision));
  RETURN_IF_ERROR(parallel::parse_compression_kind(o.compress, &l->compression.kind));
  l->compression.start_step = o.compress_start;
  l->compression.rank = o.powersgd_rank;
  RETURN_IF_ERROR(parse_offload(o, &l->offload));
  RETURN_IF_ERROR(comm::parse_rank_order(o.rank_order, &l->order));
  return Status::ok();
}

}  // namespace

Status to_policy(const TrainOptions& o, RunPolicy* out) {
  RunPolicy& p = *out;
  if (o.on_nonfinite == "stop" || o.on_nonfinite == "skip")
    p.on_nonfinite = o.on_nonfinite == "skip" ? OnNonfinite::kSkip : OnNonfinite::kStop;
  else
    return Status::error("--on-nonfinite must be stop or skip, got '" + o.on_nonfinite + "'");
  if (o.save_on_exit == "sigterm") p.save_on_exit = SaveOnExit::kSigterm;
  else if (o.save_on_exit == "always") p.save_on_exit = SaveOnExit::kAlways;
  else if (o.save_on_exit == "never") p.save_on_exit = SaveOnExit::kNever;
  else return Status::error("--save-on-exit must be sigterm, always or never, got '" + o.save_on_exit + "'");
  if (o.lr_unit == "steps" || o.lr_unit == "tokens")
    p.lr_unit = o.lr_unit == "tokens" ? LrUnit::kTokens : LrUnit::kSteps;
  else
    return Status::error("--lr-unit must be steps or tokens, got '" + o.lr_unit + "'");
  return Status::ok();
}

Status to_layout(const TrainOptions& o, int world, parallel::Layout* out) {
  parallel::Layout l;
  comm::MeshShape shape;
  RETURN_IF_ERROR(comm::resolve_mesh(world, o.tp, o.pp, o.dp, &shape, o.cp));
  l.tp = shape.tp, l.pp = shape.pp, l.dp = shape.dp, l.cp = shape.cp, l.ep = o.ep;
  RETURN_IF_ERROR(model::parse_cp_comm(o.cp_comm, &l.cp_comm));
  l.cp_a2a = o.cp_a2a;
  if (o.expert_tp != 0 && o.expert_tp != 1 && o.expert_tp != o.tp)
    return Status::error("--expert-tp must be 1 (each expert whole on every tp rank) or --tp (" +
                         std::to_string(o.tp) + ", each split over them), got " + std::to_string(o.expert_tp));
  // Whole experts on tp ranks only mean something with tp > 1.
  l.expert_tp = o.tp > 1 ? expert_tp(o) : model::ExpertTp::kSplit;
  RETURN_IF_ERROR(resolve_batch(o, l.dp, &l));
  RETURN_IF_ERROR(parse_choices(o, &l));
  l.virtual_stages = o.virtual_stages;
  // zb-v always runs two chunks in a V: --virtual-stages unset (1) means 2.
  if (l.schedule == parallel::pp::ScheduleKind::kZbV && o.virtual_stages == 1) l.virtual_stages = 2;
  l.stage_layers = o.stage_layers;
  l.zero = o.zero, l.sp = o.sp;
  RETURN_IF_ERROR(parallel::parse_zero3_gather(o.zero3_gather, &l.zero3_gather));
  l.quantized.weights = o.zero_quantized_weights, l.quantized.grads = o.zero_quantized_gradients;
  l.memory_budget = o.memory_budget_gb > 0;
  l.uneven_steps = o.curriculum.kind != "none";
  *out = l;
  return Status::ok();
}

namespace {

// The MoE architecture flags over a new model (validated with the rest by model::validate).
Status apply_moe_flags(const TrainOptions& o, model::GptConfig* c) {
  if (o.moe_score != "softmax" && o.moe_score != "sigmoid")
    return Status::error("--moe-score must be softmax or sigmoid, got '" + o.moe_score + "'");
  if (o.moe_experts == 0) {
    if (o.moe_top_k != 2 || o.moe_every != 1 || o.moe_shared_experts != 0 || o.moe_ffn_dim != 0 ||
        o.moe_score != "softmax" || !o.moe_renormalize)
      return Status::error("--moe-top-k, --moe-every, --moe-shared-experts, --moe-ffn-dim, --moe-score and "
                           "--moe-no-renormalize describe the experts of --moe-experts, which is not given");
    return Status::ok();
  }
  model::MoeConfig& m = c->moe;
  m.experts = o.moe_experts, m.top_k = o.moe_top_k, m.every = o.moe_every, m.shared_experts = o.moe_shared_experts;
  m.expert_ffn = o.moe_ffn_dim;
  m.score = o.moe_score == "sigmoid" ? model::MoeScore::kSigmoid : model::MoeScore::kSoftmax;
  m.renormalize = o.moe_renormalize;
  return Status::ok();
}

Status check_moe_training(const TrainOptions& o, const model::GptConfig& c) {
  if (!(o.moe_capacity_factor >= 0) || o.moe_capacity_factor > 1e6)
    return Status::error("--moe-capacity-factor must be > 0 (or 0 for dropless), got " +
                         std::to_string(o.moe_capacity_factor));
  if (!(o.moe_aux_loss >= 0) || !(o.moe_z_loss >= 0) || !std::isfinite(o.moe_aux_loss) || !std::isfinite(o.moe_z_loss))
    return Status::error("--moe-aux-loss and --moe-z-loss must be finite and >= 0");
  if (o.moe_balance != "sequence" && o.moe_balance != "micro-batch")
    return Status::error("--moe-balance must be sequence or micro-batch, got '" + o.moe_balance + "'");
  if (!c.is_moe() && o.moe_capacity_factor > 0)
    return Status::error("--moe-capacity-factor needs a Mixture-of-Experts model (--moe-experts)");
  if (!c.is_moe() && o.moe_balance != "sequence")
    return Status::error("--moe-balance needs a Mixture-of-Experts model (--moe-experts)");
  if (!(o.moe_bias_speed >= 0) || !std::isfinite(o.moe_bias_speed))
    return Status::error("--moe-bias-speed must be finite and >= 0, got " + std::to_string(o.moe_bias_speed));
  if (!c.is_moe() && o.moe_bias_speed > 0)
    return Status::error("--moe-bias-speed needs a Mixture-of-Experts model (--moe-experts)");
  return Status::ok();
}

}  // namespace

namespace {

// A real-valued flag's check: finite, and within its range ("lo" and "hi" closed unless
// the flag says otherwise). NaN fails every comparison, so each test is written to pass.
struct RealRule {
  const char* flag;
  double value, lo, hi;
  bool lo_open, hi_open;
  const char* meaning;  // what the range means, for the message
};

Status check_rule(const RealRule& r) {
  const bool above = r.lo_open ? r.value > r.lo : r.value >= r.lo;
  const bool below = r.hi_open ? r.value < r.hi : r.value <= r.hi;
  if (std::isfinite(r.value) && above && below) return Status::ok();
  char got[48];
  std::snprintf(got, sizeof got, "%g", r.value);
  return Status::error(std::string(r.flag) + " must be " + r.meaning + ", got " + got);
}

}  // namespace

Status check_real_flags(const TrainOptions& o) {
  constexpr double kMax = std::numeric_limits<double>::max();
  const optim::AdamWConfig& a = o.adamw;
  const optim::LossScaleConfig& ls = o.loss_scale;
  const RealRule rules[] = {
      {"--lr", a.lr, 0, kMax, false, false, "a finite number >= 0"},
      {"--min-lr", a.min_lr, 0, kMax, false, false, "a finite number >= 0"},
      {"--weight-decay", a.weight_decay, 0, kMax, false, false, "a finite number >= 0"},
      {"--beta1", a.beta1, 0, 1, false, true, "in [0, 1) (--beta1 and --beta2 are moment decays)"},
      {"--beta2", a.beta2, 0, 1, false, true, "in [0, 1) (--beta1 and --beta2 are moment decays)"},
      {"--eps", a.eps, 0, kMax, true, false, "a finite number > 0"},
      {"--grad-clip", a.grad_clip, 0, kMax, false, false, "a finite norm > 0, or 0 for no clipping"},
      {"--dropout", o.dropout, 0, 1, false, true, "in [0, 1)"},
      {"--comm-timeout", o.comm_timeout, 0, kMax, false, false, "a finite number of seconds >= 0 (0: never)"},
      {"--bucket-mb", o.bucket_mb, 0, kMax, true, false, "a finite size > 0"},
      {"--offload-chunk-mb", o.offload_chunk_mb, 0, kMax, true, false, "a finite size > 0"},
      {"--memory-budget", o.memory_budget_gb, 0, kMax, false, false, "a finite number of GB >= 0 (0: none)"},
      {"--peak-gflops", o.peak_gflops, 0, kMax, false, false, "a finite number >= 0 (0: measured)"},
      {"--rope-theta", o.rope_theta, 0, kMax, false, false, "a finite number >= 0 (0: the preset's)"},
      {"--loss-scale", ls.initial, 0, kMax, true, false, "a finite number > 0"},
      {"--loss-scale-min", ls.min_scale, 0, kMax, true, false, "a finite number > 0"},
      {"--loss-scale-backoff", ls.backoff, 0, 1, true, true, "in (0, 1)"},
      {"--curriculum-root", o.curriculum.root, -kMax, kMax, false, false, "a finite number"},
  };
  for (const RealRule& r : rules) RETURN_IF_ERROR(check_rule(r));
  return Status::ok();
}

Status resolve_model(const TrainOptions& o, model::GptConfig* config, int* seq_len) {
  for (auto [flag, v] : {std::pair{"--layers", o.layers}, {"--heads", o.heads}, {"--dim", o.dim},
                         {"--seq-len", o.seq_len}, {"--vocab", o.vocab}})
    if (v < 0)
      return Status::error(std::string(flag) + " must be >= 1 (or 0 for the preset's), got " +
                           std::to_string(v));
  if (o.kv_heads < -1 || o.kv_heads == 0) return Status::error("--kv-heads must be >= 1, got " + std::to_string(o.kv_heads));
  if (o.ffn_dim < -1 || o.ffn_dim == 0) return Status::error("--ffn-dim must be >= 1, got " + std::to_string(o.ffn_dim));
  if (o.rope_theta < 0) return Status::error("--rope-theta must be > 1");
  model::GptConfig c;
  if (!o.init_from.empty()) {
    if (!o.arch.empty() || o.kv_heads > 0 || o.ffn_dim > 0 || o.rope_theta > 0 || o.moe_experts != 0)
      return Status::error("--arch, --kv-heads, --ffn-dim, --rope-theta and --moe-experts describe a new model; with --init-from " +
                           o.init_from + " the model is the file's");
    RETURN_IF_ERROR(checkpoint::model_file_config(o.init_from, o.heads, &c));
    auto conflict = [&](const char* flag, int given, int actual) -> Status {
      if (given > 0 && given != actual)
        return Status::error(std::string(flag) + " " + std::to_string(given) + " conflicts with " +
                             o.init_from + ", which has " + std::to_string(actual));
      return Status::ok();
    };
    RETURN_IF_ERROR(conflict("--layers", o.layers, c.layers));
    RETURN_IF_ERROR(conflict("--dim", o.dim, c.dim));
    RETURN_IF_ERROR(conflict("--vocab", o.vocab, c.vocab));
    *seq_len = o.seq_len > 0 ? o.seq_len : c.max_seq_len;
  } else {
    RETURN_IF_ERROR(model::preset_config(o.model_preset, &c));
    if (o.layers > 0) c.layers = o.layers;
    if (o.heads > 0) c.heads = o.heads;
    if (o.dim > 0) c.dim = o.dim;
    c.vocab = o.vocab > 0 ? o.vocab : 50257;
    if (o.seq_len > 0) c.max_seq_len = o.seq_len;
    *seq_len = c.max_seq_len;
    // The family's parts over the final shape (Llama's MLP width follows --dim), then the
    // single parts given.
    if (!o.arch.empty()) RETURN_IF_ERROR(model::apply_arch(o.arch, &c));
    if (o.kv_heads > 0) c.kv_heads = o.kv_heads;
    if (o.ffn_dim > 0) c.ffn_dim = o.ffn_dim;
    if (o.rope_theta > 0) {
      if (c.positions != model::Positions::kRope)
        return Status::error("--rope-theta needs rotary positions (--arch llama, or a Llama preset)");
      c.rope_theta = o.rope_theta;
    }
    RETURN_IF_ERROR(apply_moe_flags(o, &c));
  }
  RETURN_IF_ERROR(check_moe_training(o, c));
  RETURN_IF_ERROR(model::validate(c));
  if (*seq_len < 1) return Status::error("--seq-len must be >= 1");
  if (*seq_len > c.max_seq_len)
    return Status::error("--seq-len " + std::to_string(*seq_len) +
                         " is longer than the model's " + std::to_string(c.max_seq_len) +
                         " position embeddings");
  *config = c;
  return Status::ok();
}

Status parse_offload(const TrainOptions& o, OffloadTiers* out) {
  *out = {};
  if (o.offload.empty()) return Status::ok();
  size_t at = 0;
  bool seen[3] = {};
  while (at <= o.offload.size()) {
    const size_t comma = std::min(o.offload.find(',', at), o.offload.size());
    const std::string item = o.offload.substr(at, comma - at);
    at = comma + 1;
    const size_t eq = item.find('=');
    const std::string key = item.substr(0, eq), tier = eq == std::string::npos ? "" : item.substr(eq + 1);
    const int k = key == "optimizer" ? 0 : key == "params" ? 1 : key == "grads" ? 2 : -1;
    if (k < 0 || (tier != "cpu" && tier != "nvme"))
      return Status::error("--offload: '" + item + "' is not optimizer=, params= or grads= with cpu or nvme "
                           "(e.g. --offload params=nvme,grads=nvme,optimizer=nvme)");
    if (seen[k]) return Status::error("--offload names " + key + " twice");
    seen[k] = true;
    bool& flag = k == 0 ? out->optimizer : k == 1 ? out->params : out->grads;
    flag = tier == "nvme";
  }
  if (out->any() && o.offload_dir.empty()) return Status::error("--offload ...=nvme needs --offload-dir DIR");
  return Status::ok();
}

}  // namespace meshtrain::train
