#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <thread>

#include "checkpoint/checkpoint.h"
#include "checkpoint/model_file.h"
#include "comm/strings.h"
#include "core/check.h"
#include "core/file_io.h"
#include "data/tokenizer_files.h"
#include "data/training_data.h"
#include "parallel/pp/stages.h"
#include "machine/describe.h"
#include "machine/peak.h"
#include "model/config_json.h"
#include "model/initial_weights.h"
#include "train/memory_check.h"
#include "train/run.h"
#include "trace/trace.h"

namespace meshtrain::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

Status write_text(const std::string& path, const std::string& text) {
  return write_file_synced(path, text.data(), text.size());
}

size_t offload_chunk(const TrainOptions& o) {
  return std::max<size_t>(1, (size_t)(o.offload_chunk_mb * 1024 * 1024 / sizeof(float)));
}

// The offload folder takes files (checked before any state is made in it).
Status check_offload_dir(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  const std::string probe = (fs::path(dir) / (".meshtrain_probe_" + std::to_string(::getpid()))).string();
  FILE* f = std::fopen(probe.c_str(), "w");
  if (!f) return Status::error("--offload-dir " + dir + ": cannot create files there: " + std::strerror(errno));
  std::fclose(f);
  fs::remove(probe, ec);
  return Status::ok();
}

// --compress's own settings. Which layouts it runs with (ZeRO stage, precision, offload) is
// parallel/layout.h's.
Status check_compression(const TrainOptions& o) {
  using Kind = parallel::Compression::Kind;
  Kind kind;
  RETURN_IF_ERROR(parallel::parse_compression_kind(o.compress, &kind));
  if (o.compress_start < 0) return Status::error("--compress-start must be >= 0");
  if (o.powersgd_rank < 1) return Status::error("--powersgd-rank must be >= 1");
  if (kind == Kind::kNone && o.compress_start != 0)
    return Status::error("--compress-start needs --compress powersgd or onebit-adam");
  if (kind != Kind::kPowerSgd && o.powersgd_rank != 4) return Status::error("--powersgd-rank needs --compress powersgd");
  if (kind == Kind::kOneBitAdam && o.compress_start < 1)
    return Status::error("--compress onebit-adam needs --compress-start >= 1: plain Adam steps estimate the "
                         "variance before it is frozen (Tang et al. suggest 15-25% of the run)");
  return Status::ok();
}

Status check_options(const TrainOptions& o) {
  auto positive = [](const char* flag, int v) -> Status {
    if (v < 1) return Status::error(std::string(flag) + " must be >= 1, got " + std::to_string(v));
    return Status::ok();
  };
  RETURN_IF_ERROR(check_real_flags(o));  // every real-valued flag (train/options.h)
  RETURN_IF_ERROR(positive("--micro-batch", o.micro_batch));
  if (o.grad_accum < 0) return Status::error("--grad-accum must be >= 1, got " + std::to_string(o.grad_accum));
  RETURN_IF_ERROR(positive("--steps", o.steps));
  RunPolicy policy;  // --on-nonfinite, --save-on-exit, --lr-unit
  RETURN_IF_ERROR(to_policy(o, &policy));
  RETURN_IF_ERROR(positive("--max-skipped-steps", o.max_skipped_steps));
  if (o.resume_strict && !o.resume) return Status::error("--resume-strict goes with --resume");
  if (o.overwrite && o.out_dir.empty()) return Status::error("--overwrite needs --out DIR");
  RETURN_IF_ERROR(positive("--eval-batches", o.eval_batches));
  if (o.global_batch < 0) return Status::error("--global-batch must be >= 1 (or 0: B*A*dp)");
  if (o.threads < 0) return Status::error("--threads must be >= 0");
  if (o.keep_checkpoints < 0) return Status::error("--keep-checkpoints must be >= 0 (0 keeps all)");
  if (o.eval_every < 0 || o.save_every < 0) return Status::error("--eval-every/--save-every must be >= 0");
  if (o.resume && o.out_dir.empty()) return Status::error("--resume needs --out DIR");
  if (o.save_every > 0 && o.out_dir.empty()) return Status::error("--save-every needs --out DIR");
  RETURN_IF_ERROR(check_compression(o));
  if (o.recompute_every < 1) return Status::error("--recompute-every must be >= 1");
  if (o.doc_separator < -1) return Status::error("--doc-separator must be a token id >= 0");
  if (o.doc_separator >= 0 && !o.doc_mask) return Status::error("--doc-separator goes with --doc-mask");
  const auto& ls = o.loss_scale;
  if (!(ls.min_scale > 0) || !(ls.initial >= ls.min_scale))
    return Status::error("--loss-scale must be >= --loss-scale-min > 0");
  if (!(ls.backoff > 0 && ls.backoff < 1)) return Status::error("--loss-scale-backoff must be in (0, 1)");
  if (ls.growth_interval < 1) return Status::error("--loss-scale-window must be >= 1");
  OffloadTiers tiers;
  RETURN_IF_ERROR(parse_offload(o, &tiers));
  if (o.memory_budget_gb > 0 && o.offload_dir.empty())
    return Status::error("--memory-budget needs --offload-dir DIR (where the state goes when it does not fit)");
  if (o.offload_read_ahead < 1) return Status::error("--offload-read-ahead must be >= 1");
  if (tiers.any() || o.memory_budget_gb > 0) RETURN_IF_ERROR(check_offload_dir(o.offload_dir));
  const auto& a = o.adamw;
  if (a.warmup_steps < 0) return Status::error("--warmup-steps must be >= 0");
  return Status::ok();
}

// The layout from the flags (train/options.h's to_layout: names parsed, dp derived, the batch
// resolved); its rules are checked with the model's shape in prepare_local.
Status resolve_layout(const TrainOptions& o, comm::Group& world, Run* run) {
  parallel::Layout& l = run->layout;
  RETURN_IF_ERROR(to_layout(o, world.size(), &l));
  RETURN_IF_ERROR(to_policy(o, &run->policy));
  run->mesh_shape = l.mesh();
  BatchShape& b = run->shape;
  b.B = l.micro_batch;
  b.dp = l.dp;
  b.dp_rank = comm::Mesh::coordinates(world.rank(), run->mesh_shape).dp;
  b.A = std::max(1, l.micro_batches());
  return Status::ok();
}

int default_threads(int ranks_on_node) {
  int cores = (int)std::max(1u, std::thread::hardware_concurrency());
  return std::max(1, cores / std::max(1, ranks_on_node));
}

int local_ranks() {
  if (const char* s = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE")) return std::atoi(s);
  return 1;
}

// The trace is written after the last step; its folder is made (and checked) before the first.
Status check_trace_path(const std::string& file) {
  std::error_code ec;
  if (fs::is_directory(file, ec)) return Status::error("--trace " + file + " is a directory, not a file");
  const fs::path parent = fs::path(file).parent_path();
  if (!parent.empty()) fs::create_directories(parent, ec);
  if (!parent.empty() && !fs::is_directory(parent, ec))
    return Status::error("--trace: cannot create the folder " + parent.string());
  return Status::ok();
}

// Model and optimizer state: initialised, loaded from a model file, or resumed.
// This rank's slice of the initial weights: from --init-from (a whole model, sliced for
// tensor parallelism) or the seeded initialisation (identical to tp = 1's).
Status initial_weights(const TrainOptions& o, model::Gpt* gpt) {
  if (o.init_from.empty()) {
    gpt->init_weights(o.seed);
    return Status::ok();
  }
  if (gpt->layout().tp() == 1 && gpt->layout().is_whole_model())
    return checkpoint::load_model_file(o.init_from, gpt);
  model::Gpt whole(gpt->config(), model::Gpt::LocalState::kParamsOnly);
  RETURN_IF_ERROR(checkpoint::load_model_file(o.init_from, &whole));
  gpt->set_from_global(whole.params());
  return Status::ok();
}

json scaler_json(const optim::DynamicLossScaler& s) {
  const auto st = s.state();
  return {{"scale", st.scale}, {"good_in_row", st.good_in_row}, {"skipped", st.skipped},
          {"floor_skips_in_row", st.floor_skips_in_row}};
}

// The loss scaler continues where the checkpoint left it (a checkpoint of an fp32 or bf16
// run has none: the scaler starts afresh).
Status restore_scaler(const std::string& dir, optim::DynamicLossScaler* scaler) {
  json index;
  RETURN_IF_ERROR(checkpoint::read_checkpoint_index(dir, &index));
  const json ts = index.value("train_state", json::object());
  if (!ts.contains("loss_scaler")) return Status::ok();
  try {
    const json& j = ts["loss_scaler"];
    scaler->restore({j.at("scale").get<double>(), j.at("good_in_row").get<int64_t>(),
                     j.at("skipped").get<int64_t>(), j.at("floor_skips_in_row").get<int64_t>()});
  } catch (const std::exception& e) {
    return Status::error(dir + "/index.json: invalid loss scaler state: " + e.what());
  }
  return Status::ok();
}

// Steps --on-nonfinite skip left out (AdamW's t counts the applied ones); none when absent.
Status restore_nonfinite_skips(const std::string& dir, NonfinitePolicy* policy) {
  json index;
  RETURN_IF_ERROR(checkpoint::read_checkpoint_index(dir, &index));
  const json ts = index.value("train_state", json::object());
  if (!ts.contains("nonfinite_skipped")) return Status::ok();
  if (!ts["nonfinite_skipped"].is_number_integer() || ts["nonfinite_skipped"].get<int64_t>() < 0)
    return Status::error(dir + "/index.json: train_state.nonfinite_skipped must be an integer >= 0");
  policy->skipped = ts["nonfinite_skipped"].get<int64_t>();
  return Status::ok();
}

// Aux-loss-free balancing's biases, one list of E per MoE layer, in the checkpoint's
// train_state: every rank holds all of them, so any layout reads them back.
json expert_bias_json(Run& run) {
  const model::GptConfig& c = run.config;
  const int E = c.moe.experts;
  json layers = json::object();
  const std::vector<float>& bias = run.gpt->moe_bias();
  for (int l = 0; l < c.layers; l++)
    if (c.is_moe_layer(l)) layers[std::to_string(l)] = std::vector<float>(bias.begin() + (size_t)l * E, bias.begin() + (size_t)(l + 1) * E);
  return layers;
}

// The layout a checkpoint was written at, as the resume line names it ("tp 2, pp 2, dp 2";
// with experts "ep 2" and, when whole on each tp rank, "expert-tp 1").
std::string writers_layout(const std::string& dir) {
  checkpoint::CheckpointIndex index;
  if (!checkpoint::read_checkpoint_index(dir, &index).is_ok()) return "";
  std::string out = "tp " + std::to_string(index.tp_size) + ", pp " + std::to_string(index.pp_size) + ", dp " +
                    std::to_string(index.dp_size);
  if (index.ep_size > 1) out += ", ep " + std::to_string(index.ep_size);
  if (index.expert_layout() == model::ExpertTp::kReplicated) out += ", expert-tp 1";
  return out;
}

// The compressor's per-rank state (error feedback, PowerSGD's warm start) comes back at the
// layout that wrote it; at another it cannot be re-sliced and restarts from zero (the
// startup line says which). 1-bit Adam's compressed phase keeps u = m / d in the
// optimizer's m (parallel/dp/onebit_adam.h): such a checkpoint resumes only with the same
// --compress onebit-adam --compress-start, and a plain one not inside that phase.
Status restore_rank_arrays(const std::string& dir, const TrainOptions& o, Run* run) {
  json index;
  RETURN_IF_ERROR(checkpoint::read_checkpoint_index(dir, &index));
  const json ts = index.value("train_state", json::object());
  const bool saved_u = ts.contains("onebit_adam_freeze");
  const bool want_u = o.compress == "onebit-adam" && run->start_step > o.compress_start;
  if (saved_u && (!want_u || ts["onebit_adam_freeze"] != o.compress_start))
    return Status::error(dir + " was written in 1-bit Adam's compressed phase (variance frozen after step " +
                         ts["onebit_adam_freeze"].dump() + "): resume it with --compress onebit-adam --compress-start " +
                         ts["onebit_adam_freeze"].dump());
  if (want_u && !saved_u)
    return Status::error(dir + " is at step " + std::to_string(run->start_step) +
                         ", past --compress-start " + std::to_string(o.compress_start) +
                         ", but was not written by 1-bit Adam's compressed phase (its moments are Adam's)");
  const std::vector<std::pair<float*, size_t>> arrays = run->dp->compressor_state();
  const comm::MeshShape& m = run->mesh_shape;
  const std::string here = "tp " + std::to_string(m.tp) + ", pp " + std::to_string(m.pp) + ", dp " + std::to_string(m.dp);
  if (arrays.empty() || run->resumed_layout != here) return Status::ok();
  return checkpoint::load_rank_arrays(dir, run->mesh->world().rank(), arrays, &run->rank_arrays_restored);
}

// A checkpoint without biases (saved with balancing off) starts them at zero.
Status restore_expert_bias(const std::string& dir, Run* run) {
  json index;
  RETURN_IF_ERROR(checkpoint::read_checkpoint_index(dir, &index));
  const json ts = index.value("train_state", json::object());
  if (!ts.contains("moe_expert_bias")) return Status::ok();
  const model::GptConfig& c = run->config;
  const int E = c.moe.experts;
  std::vector<float>& bias = run->gpt->moe_bias();
  try {
    for (int l = 0; l < c.layers; l++) {
      if (!c.is_moe_layer(l)) continue;
      const std::vector<float> row = ts["moe_expert_bias"].at(std::to_string(l)).get<std::vector<float>>();
      if ((int)row.size() != E) throw std::runtime_error("layer " + std::to_string(l) + " has " + std::to_string(row.size()) + " biases, the model " + std::to_string(E) + " experts");
      std::copy(row.begin(), row.end(), bias.begin() + (size_t)l * E);
    }
  } catch (const std::exception& e) {
    return Status::error(dir + "/index.json: invalid moe_expert_bias: " + e.what());
  }
  return Status::ok();
}

checkpoint::RankState rank_state(Run& run, float* master, float* m, float* v) {
  const bool moments_full = run.layout.zero == 0;
  if (run.dp->half_storage()) return {master, moments_full, m, v, moments_full, {}, {}};
  const bool sharded = run.layout.zero == 3;
  return {sharded ? run.dp->param_shard() : run.gpt->params(), !sharded, m, v, moments_full, {}, {}};
}

// What a checkpoint reads or fills of this rank: the state in memory, or, for an array in
// a file (the optimizer state, ZeRO-3's parameter shard), through `read` / `write` in
// pieces (state.read for saving, state.write for loading), so a checkpoint never holds a
// copy of it.
checkpoint::RankState rank_state(Run& run) {
  optim::ShardStore* store = &run.dp->store();
  checkpoint::RankState st = rank_state(run, store->data(optim::kMasterWeights), store->data(optim::kMomentM),
                                        store->data(optim::kMomentV));
  // Section 0 is the parameters: the master weights of a 16-bit run, else ZeRO-3's shard
  // (other stages keep them in the model, never null).
  auto array_of = [half = run.dp->half_storage()](int section) {
    return section == 1 ? optim::kMomentM : section == 2 ? optim::kMomentV
           : half ? optim::kMasterWeights : optim::kShardParams;
  };
  parallel::DataParallel* dp = run.dp.get();
  // Section 3, 2bw's previous weight version: in memory at fp32, else 16-bit words that the
  // data-parallel object converts.
  st.with_previous = dp->keeps_weight_versions();
  st.previous = dp->previous_params();
  st.read = [store, array_of, dp](int section, size_t offset, size_t count, float* dst) {
    if (section == checkpoint::kPreviousSection) return dp->read_previous(offset, count, dst);
    store->read(array_of(section), offset, count, dst);
  };
  st.write = [store, array_of, dp](int section, size_t offset, size_t count, const float* src) {
    if (section == checkpoint::kPreviousSection) return dp->write_previous(offset, count, src);
    store->write(array_of(section), offset, count, src);
  };
  return st;
}

// Where the state lives: in memory, or in files when --offload asks for it or when the
// model state plus one micro-batch's activations would exceed --memory-budget, which moves
// the optimizer state first (used once per step), then ZeRO-3's gradient shard, then its
// parameter shard (read twice per step). A budget that the run exceeds even so is an error
// that names what was moved and what is left.
Status place_state(const TrainOptions& o, const OffloadTiers& tiers, Run* run) {
  const double budget = o.memory_budget_gb * 1e9;
  const auto tracked = [] { return (double)MemoryTracker::instance().stats().total_current; };
  // What training will hold: what setup allocated (parameters, gradients, optimizer state,
  // the activation scratch laid out here) plus one micro-batch's stored activations.
  auto needed = [&] {
    if (budget <= 0) return 0.0;
    run->gpt->stored_activation_bytes(run->shape.B, run->shape.T);
    double sets = 0;
    for (int c = 0; c < run->gpt->num_chunks(); c++) sets += (double)run->gpt->activation_set_bytes(c);
    // And what the files' traffic will hold: the update's rotating buffers, the shards read
    // ahead and the gradient pieces in flight.
    const double io = (double)run->dp->store().streaming_bytes(~0u) + (double)run->dp->offload_working_bytes();
    return tracked() + sets + io + (double)run->dp->transient_bytes();
  };
  const int rank = run->mesh->world().rank();
  const bool direct = !o.offload_page_cache;
  std::string moved;
  if (tiers.optimizer || (budget > 0 && needed() > budget)) {
    RETURN_IF_ERROR(run->dp->store().move_state_to_files(o.offload_dir, rank, offload_chunk(o), direct));
    moved = "the optimizer state";
  }
  optim::ShardStore& store = run->dp->store();
  if (store.has(optim::kShardParams))  // ZeRO-3: the shards next, as the budget needs
    for (optim::ShardArray a : {optim::kShardGrads, optim::kShardParams}) {
      if (store.in_file(a)) {
        moved += std::string(moved.empty() ? "" : ", ") + optim::shard_array_name(a);
        continue;
      }
      if (!(budget > 0 && needed() > budget)) break;
      // Only where the file saves memory: a shard smaller than its I/O buffers stays.
      if ((double)(store.width(a) * store.size()) <= (double)run->dp->file_working_bytes(a)) continue;
      RETURN_IF_ERROR(run->dp->move_shard_to_file(a, o.offload_dir, rank, direct));
      moved += std::string(moved.empty() ? "" : ", ") + optim::shard_array_name(a);
    }
  if (budget > 0 && needed() > budget) {
    char buf[512];
    std::snprintf(buf, sizeof buf,
                  "--memory-budget %.3g GB is too small: this rank needs %.3g GB for parameters, "
                  "gradients, buffers and one micro-batch's activations%s%s%s",
                  o.memory_budget_gb, needed() / 1e9, moved.empty() ? "" : " with ",
                  moved.empty() ? "" : moved.c_str(), moved.empty() ? "" : " in files");
    return Status::error(buf);
  }
  return Status::ok();
}

// Expert parallelism: the routed experts' units reduce over the expert-data-parallel group
// (times cp: Mesh::expert_grad) and are sharded over it, and count once per ep rank in the gradient norm; the rest over
// dp. Experts replicated over tp also sum their tp copies' parts first. Without either, one
// group of every unit.
std::vector<parallel::ParamGroup> expert_groups(const model::ParamLayout& layout, comm::Mesh& mesh) {
  if (mesh.shape().ep == 1 && !layout.experts_replicated()) return {};
  parallel::ParamGroup dense{"dense", nullptr, {}}, experts{"experts", &mesh.expert_grad(), {}, &mesh.ep()};
  if (layout.experts_replicated()) experts.replicas = &mesh.tp();
  for (int u = 0; u < layout.num_units(); u++) (layout.units()[u].expert >= 0 ? experts : dense).units.push_back(u);
  return {dense, experts};
}

// The rank's model part, with the layout's recompute and precision and the run's dropout
// and MoE settings; activations reserved for the run's B x T (laid out again in place for
// shorter curriculum steps).
void build_model(const TrainOptions& o, Run* run) {
  const parallel::Layout& l = run->layout;
  run->gpt = std::make_unique<model::Gpt>(run->config, parallel::model_state_for_stage(l.zero, l.precision),
                                          &run->mesh->tp(), l.sp, run->part, &run->mesh->ep(), expert_tp(o));
  run->gpt->set_recompute(l.recompute, o.recompute_every);
  run->gpt->set_precision(run->layout.precision);
  run->gpt->set_dropout(o.dropout, o.seed);
  run->gpt->set_document_mask(run->doc_separator);
  run->gpt->set_context_parallel({&run->mesh->cp(), run->mesh->cp_a2a(), run->mesh->cp_ring()}, l.cp_comm);
  run->gpt->set_moe_training(moe_training(o));
  run->gpt->reserve_activations(run->shape.B, run->shape.T);
}

// The data-parallel store's configuration from the layout (ZeRO stage, 16-bit storage,
// compression, ZeRO++, offload tiers) and the run's settings.
parallel::DpConfig dp_config(const TrainOptions& o, const Run& run) {
  const parallel::Layout& l = run.layout;
  // bf16 and fp16 runs store 16-bit parameters and gradients (fp32 master weights in the
  // optimizer).
  parallel::DpConfig dpc{l.zero, o.bucket_mb, o.overlap, l.precision};
  dpc.groups = expert_groups(run.gpt->layout(), *run.mesh);
  dpc.compression = l.compression;
  dpc.compression.seed = (uint64_t)o.seed * 0x9E3779B97F4A7C15ull + 0x5057;  // the first Q: the same on every rank
  dpc.quantized.weights = l.quantized.weights;
  dpc.quantized.grads = l.quantized.grads;
  dpc.weight_versions = l.schedule == parallel::pp::ScheduleKind::k2BW;
  // When it reduces and gathers: the layout's DpStep, which the planners' models read too.
  const parallel::DpStep step = parallel::dp_step(l);
  dpc.reduce_once_per_step = step.reduce_once_per_step;
  dpc.keep_gathered = step.keep_gathered;
  const OffloadTiers& tiers = l.offload;
  const bool sharded = l.zero == 3;
  // ZeRO-Infinity: the shards in files from the start, or aligned so a budget can move them.
  dpc.files = {o.offload_dir, run.mesh->world().rank(), tiers.params, tiers.grads, !o.offload_page_cache,
               o.offload_read_ahead, tiers.optimizer, offload_chunk(o)};
  dpc.align_shards = sharded && (tiers.params || tiers.grads || o.memory_budget_gb > 0);
  return dpc;
}

// The store over dp x cp, with the initial weights: seeded ZeRO-3 draws and shards each unit
// in turn (the whole model is never in memory); 16-bit storage and ZeRO-3 from a file take
// them from a full fp32 copy, which exists only during setup (peaks are reset before
// training); otherwise the model's own buffers.
Status create_store(const TrainOptions& o, const parallel::DpConfig& dpc, Run* run) {
  comm::Group* tp = &run->mesh->tp();
  const bool initial_copy = dpc.zero_stage == 3 || run->layout.precision != kernels::Precision::kFp32;
  if (dpc.zero_stage == 3 && o.init_from.empty()) {
    model::InitialWeights init(run->config, o.seed);
    const model::ParamLayout& layout = run->gpt->layout();
    return parallel::DataParallel::create_sharded(
        *run->gpt, run->mesh->grad(), dpc, o.adamw, [&](int u, float* out) { init.unit(layout, u, out); }, tp,
        &run->dp);
  }
  if (initial_copy) {
    model::Gpt full(run->config, model::Gpt::LocalState::kParamsOnly, tp, false, run->part, &run->mesh->ep(),
                    expert_tp(o));
    RETURN_IF_ERROR(initial_weights(o, &full));
    run->dp = std::make_unique<parallel::DataParallel>(*run->gpt, run->mesh->grad(), dpc, o.adamw, full.params(), tp);
    return Status::ok();
  }
  RETURN_IF_ERROR(initial_weights(o, run->gpt.get()));
  run->dp = std::make_unique<parallel::DataParallel>(*run->gpt, run->mesh->grad(), dpc, o.adamw, nullptr, tp);
  return Status::ok();
}

// The pipeline's executor, and the tied embedding's peer: the first stage (rank 0) and the
// last (rank p - 1) both hold a tied embedding; an untied head lives on the last stage
// alone. ZB-V's V puts both on rank 0: one copy.
void attach_pipeline(Run* run) {
  const int p = run->mesh_shape.pp, r = run->mesh->pp_rank();
  const int last = parallel::pp::rank_of_stage(run->layout.schedule, p, run->layout.chunks(), p * run->layout.chunks() - 1);
  const int tied_peer = !run->config.tied_head || last == 0 ? -1 : r == 0 ? last : r == last ? 0 : -1;
  run->dp->set_pipeline(&run->mesh->pp(), tied_peer);
  run->pipeline = std::make_unique<parallel::pp::PipelineExecutor>(*run->gpt, run->mesh->pp(), run->layout.schedule,
                                                                    run->layout.chunks(), &run->mesh->world());
}

// --resume: the loss scaler, the skipped-step count, the experts' biases, every rank's shard
// of the checkpoint and its per-rank arrays.
Status restore_run(const TrainOptions& o, const std::string& resume_dir, Run* run) {
  if (run->scaler) RETURN_IF_ERROR(restore_scaler(resume_dir, run->scaler.get()));
  RETURN_IF_ERROR(restore_nonfinite_skips(resume_dir, &run->nonfinite));
  if (run->config.is_moe()) RETURN_IF_ERROR(restore_expert_bias(resume_dir, run));
  checkpoint::RankState state = rank_state(*run);
  state.previous_loaded = &run->previous_weights_restored;
  RETURN_IF_ERROR(checkpoint::load_checkpoint(resume_dir, run->gpt->layout(), run->config, run->dp->shards(), state,
                                              &run->start_step));
  run->resumed_layout = writers_layout(resume_dir);
  RETURN_IF_ERROR(restore_rank_arrays(resume_dir, o, run));
  if (run->dp->half_storage()) run->dp->params_from_master();
  // 2bw from a checkpoint without the previous version: the delay starts again.
  if (!run->previous_weights_restored) run->dp->reset_weight_versions();
  if (run->start_step >= o.steps)
    return Status::error(resume_dir + " is at step " + std::to_string(run->start_step) +
                         ", already >= --steps " + std::to_string(o.steps));
  return Status::ok();
}

Status build_state(const TrainOptions& o, const std::string& resume_dir, Run* run) {
  build_model(o, run);
  RETURN_IF_ERROR(create_store(o, dp_config(o, *run), run));
  if (run->mesh_shape.pp > 1) attach_pipeline(run);
  if (run->layout.precision == kernels::Precision::kFp16)
    run->scaler = std::make_unique<optim::DynamicLossScaler>(o.loss_scale);
  RETURN_IF_ERROR(place_state(o, run->layout.offload, run));
  return resume_dir.empty() ? Status::ok() : restore_run(o, resume_dir, run);
}


Status write_run_files(const TrainOptions& o, const Run& run) {
  std::error_code ec;
  fs::create_directories(o.out_dir, ec);
  if (ec) return Status::error("cannot create --out " + o.out_dir + ": " + ec.message());
  json resolved = to_json(o);
  resolved["resolved_model"] = model::config_json(run.config);
  resolved["resolved_model"]["seq_len"] = run.shape.T;
  resolved["resolved_layout"] = {{"world", run.mesh_shape.world()}, {"tp", run.mesh_shape.tp},
                                 {"pp", run.mesh_shape.pp}, {"dp", run.mesh_shape.dp},
                                 {"grad_accum", run.shape.A}, {"global_batch", run.shape.G()}};
  // Where the tokens came from, absolute, so that generate, eval and export given this run
  // find the data folder's tokenizer from anywhere.
  // A mixture's sources share one tokenizer (open_training_data checked): the first one's.
  std::vector<data::MixtureSpec> sources;
  RETURN_IF_ERROR(data::parse_mixture(o.data_dir, &sources));
  resolved["data_path"] = fs::absolute(sources[0].dir).lexically_normal().string();
  if (sources.size() > 1)
    for (const data::MixtureSpec& s : sources)
      resolved["data_mixture"].push_back(
          {{"name", s.name}, {"dir", fs::absolute(s.dir).lexically_normal().string()}, {"weight", s.weight}});
  const std::string data_tokenizer = (fs::path(sources[0].dir) / data::kTokenizerFolder).string();
  resolved["tokenizer"] = nullptr;
  if (data::has_tokenizer_copy(data_tokenizer)) {
    RETURN_IF_ERROR(data::verify_tokenizer_copy(data_tokenizer));
    RETURN_IF_ERROR(data::save_tokenizer_copy(data_tokenizer, (fs::path(o.out_dir) / data::kTokenizerFolder).string()));
    resolved["tokenizer"] = data::kTokenizerFolder;
  }
  resolved["machine"] = machine::machine_json();
  resolved["machine"]["mfu_peak_gflops"] = run.peak_gflops;
  resolved["machine"]["mfu_basis"] = machine::mfu_basis(run.layout.precision);
  RETURN_IF_ERROR(write_text((fs::path(o.out_dir) / "config.json").string(), resolved.dump(2) + "\n"));
  if (!o.resolved_config_toml.empty())
    RETURN_IF_ERROR(write_text((fs::path(o.out_dir) / "config.toml").string(), o.resolved_config_toml));
  return Status::ok();
}

// The tokenizer the model already has, when it has one: the resumed run's copy, or the
// --init-from model's (a run or checkpoint folder's copy, or a Hugging Face folder's files).
Status model_tokenizer(const TrainOptions& o, std::string* fingerprint, std::string* where) {
  fingerprint->clear();
  const std::string run_copy = (fs::path(o.out_dir) / data::kTokenizerFolder).string();
  if (o.resume && !o.out_dir.empty() && data::has_tokenizer_copy(run_copy)) {
    *where = "the run in " + o.out_dir + " was trained with " + run_copy;
    return data::verify_tokenizer_copy(run_copy, fingerprint);
  }
  if (o.init_from.empty()) return Status::ok();
  const fs::path init(o.init_from);
  for (const fs::path& copy : {init / data::kTokenizerFolder, init.parent_path().parent_path() / data::kTokenizerFolder})
    if (data::has_tokenizer_copy(copy.string())) {
      *where = "--init-from " + o.init_from + " carries " + copy.string();
      return data::verify_tokenizer_copy(copy.string(), fingerprint);
    }
  std::error_code ec;
  if (!fs::is_directory(init, ec) || !data::tokenizer_files_in(o.init_from)) return Status::ok();
  std::unique_ptr<data::Tokenizer> tok;
  RETURN_IF_ERROR(data::load_tokenizer(o.init_from, &tok));
  *where = "--init-from " + o.init_from + " holds its own";
  return data::tokenizer_fingerprint(*tok, fingerprint);
}

// The data's tokenizer must be the model's: no more ids than its vocabulary, and, when a run
// goes on, the tokenizer it was trained with.
Status check_data_tokenizer(const TrainOptions& o, const data::TrainingData& data, int vocab) {
  // A tokenizer with more ids than the model has rows would hand it tokens it cannot embed,
  // and text sampled from it could not reach the tokenizer's upper ids.
  if (data.tokenizer_vocab > vocab)
    return Status::error("the model's vocabulary of " + std::to_string(vocab) + " is smaller than the " +
                         std::to_string(data.tokenizer_vocab) + " ids of the data's tokenizer (" +
                         data.tokenizer_source + "): give --vocab " + std::to_string(data.tokenizer_vocab) +
                         " or more");
  if (data.tokenizer_fingerprint.empty()) return Status::ok();
  std::string model_fp, where;
  RETURN_IF_ERROR(model_tokenizer(o, &model_fp, &where));
  if (!model_fp.empty() && !data::same_tokenizer(model_fp, data.tokenizer_fingerprint))
    return Status::error("--data " + o.data_dir + " was prepared with another tokenizer than the model's (" + where +
                         "); prepare the data with that tokenizer");
  return Status::ok();
}

// --doc-mask's separator: --doc-separator, else the data's tokenizer's end-of-text token; it
// must be one of the model's ids (a token the data holds).
Status resolve_document_separator(const TrainOptions& o, int vocab, int* separator) {
  *separator = -1;
  if (!o.doc_mask) return Status::ok();
  if (o.doc_separator >= 0) *separator = o.doc_separator;
  else RETURN_IF_ERROR(data::data_document_separator(o.data_dir, separator).with_context("--doc-mask"));
  if (*separator >= vocab)
    return Status::error("--doc-mask: the end-of-text token " + std::to_string(*separator) +
                         " is not in the model's vocabulary of " + std::to_string(vocab) + " ids");
  return Status::ok();
}

// Opens --data (one folder or a mixture). Each rank verifies its share of the shards; a
// damaged shard on any rank stops every rank (agree()).
Status open_data(const TrainOptions& o, comm::Group& world, Run* run) {
  data::TrainingData data;
  RETURN_IF_ERROR(data::open_training_data(o.data_dir, &data));
  RETURN_IF_ERROR(check_data_tokenizer(o, data, run->config.vocab));
  const int part = world.rank(), parts = world.size();
  RETURN_IF_ERROR(data.train.check(run->shape.G(), run->shape.T, run->config.vocab, part, parts));
  run->train_data = std::move(data.train);
  if (data.has_val) {
    RETURN_IF_ERROR(data.val.verify(run->config.vocab, part, parts));
    // A val split too small for one micro-batch is left out of evaluation.
    run->has_val = data.val.check_fits(run->shape.B, run->shape.T).is_ok();
    run->val_data = std::move(data.val);
  }
  return Status::ok();
}

// The model shape from the flags (the same as the interrupted run's; load_checkpoint()
// rejects a checkpoint of another shape). With no --vocab the model's vocabulary is its
// data's tokenizer's (GPT-2's 50257 when the data names none).
Status resolve_run_model(const TrainOptions& o, model::GptConfig* config, int* seq_len) {
  TrainOptions shaped = o;
  if (o.vocab == 0 && o.init_from.empty()) shaped.vocab = data::data_tokenizer_vocab(o.data_dir);
  return resolve_model(shaped, config, seq_len);
}

// Checks without communication: flags, layout arithmetic, model shape, data files.
Status prepare_local(const TrainOptions& o, comm::Group& world, Run* run) {
  // The launcher's check, first (every broken layout rule at once); what follows cannot
  // fail on the flags, layout or model it passed.
  RETURN_IF_ERROR(check_flags_and_layout(o, world.size()));
  run->opt = o;
  run->is_main = world.rank() == 0;
  run->threads = o.threads > 0 ? o.threads : default_threads(local_ranks());
  omp_set_num_threads(run->threads);
  RETURN_IF_ERROR(resolve_layout(o, world, run));
  RETURN_IF_ERROR(resolve_run_model(o, &run->config, &run->shape.T));
  if (o.debug_nonfinite_step > 0 && (o.debug_nonfinite_unit < 0 || o.debug_nonfinite_unit > model::final_unit_id(run->config)))
    return Status::error("--debug-nonfinite-unit must be a unit of the model, 0 to " +
                         std::to_string(model::final_unit_id(run->config)) + ", got " +
                         std::to_string(o.debug_nonfinite_unit));
  run->nonfinite = {run->policy.on_nonfinite == OnNonfinite::kSkip, 0, &world};
  if (run->mesh_shape.pp > 1) {
    const int p = run->mesh_shape.pp;
    RETURN_IF_ERROR(parallel::pp::split_layers(run->config, run->shape.B, run->shape.T,
                                               p * run->layout.chunks(), o.stage_layers, &run->stage_layers));
    run->part = parallel::pp::rank_part(run->stage_layers, p, comm::Mesh::coordinates(world.rank(), run->mesh_shape).pp,
                                        run->layout.schedule);
  }
  if (o.sp && (run->shape.B * run->shape.T) % run->mesh_shape.tp != 0)
    return Status::error("--sp needs micro-batch x seq-len (" +
                         std::to_string(run->shape.B * run->shape.T) + " tokens) divisible by --tp " +
                         std::to_string(run->mesh_shape.tp));
  RETURN_IF_ERROR(Curriculum::make(o.curriculum, run->shape.T, &run->curriculum));
  if (o.sp)
    for (int L : run->curriculum.lengths())
      if ((run->shape.B * L) % run->mesh_shape.tp != 0)
        return Status::error("--sp needs micro-batch x every curriculum length divisible by --tp " +
                             std::to_string(run->mesh_shape.tp) + "; length " + std::to_string(L) + " gives " +
                             std::to_string(run->shape.B * L) + " tokens (choose --curriculum-step a multiple of it)");
  if (!o.trace_file.empty()) RETURN_IF_ERROR(check_trace_path(o.trace_file));
  RETURN_IF_ERROR(resolve_document_separator(o, run->config.vocab, &run->doc_separator));
  return open_data(o, world, run);
}

}  // namespace

// Every rank reaches the same verdict: an error on any rank stops all of them at this
// point, each with a message, and none is left waiting in a collective.
Status check_flags_and_layout(const TrainOptions& o, int world) {
  RETURN_IF_ERROR(check_options(o));
  parallel::Layout layout;
  RETURN_IF_ERROR(to_layout(o, world, &layout));
  model::GptConfig config;
  int seq_len = 0;
  RETURN_IF_ERROR(resolve_run_model(o, &config, &seq_len));
  parallel::LayoutModel m = parallel::layout_model(config);
  m.seq_len = seq_len;
  RETURN_IF_ERROR(parallel::check_layout(layout, m, parallel::LayoutReader::kEngine));
  // A curriculum's shorter rows are sequences too: each length meets the rules --seq-len
  // meets (cp cuts every row into 2 x cp chunks).
  Curriculum curriculum;
  RETURN_IF_ERROR(Curriculum::make(o.curriculum, seq_len, &curriculum));
  for (int L : curriculum.lengths()) {
    m.seq_len = L;
    if (Status s = parallel::check_layout(layout, m, parallel::LayoutReader::kEngine); !s.is_ok())
      return Status::error("the curriculum's row length " + std::to_string(L) +
                           " breaks the layout (choose --curriculum-start and --curriculum-step to suit it): " +
                           s.message());
  }
  return Status::ok();
}

Status agree(comm::Group& world, const Status& mine) {
  double failed = mine.is_ok() ? 0.0 : 1.0;
  world.all_reduce_f64(&failed, 1, comm::ReduceOp::kSum);
  if (failed == 0) return Status::ok();
  if (!mine.is_ok()) return mine;
  return Status::error("rank " + std::to_string(world.rank()) +
                       ": stopping because another rank rejected the run (its message says why)");
}

// Damaged checkpoints that resume passed over, renamed checkpoints/damaged_step_N: kept for
// a look, and out of the way of the resumed run's own saves of those steps.
Status move_aside(const std::vector<std::string>& dirs) {
  for (const std::string& d : dirs) {
    const fs::path from(d), to = from.parent_path() / ("damaged_" + from.filename().string());
    std::error_code ec;
    fs::remove_all(to, ec);
    fs::rename(from, to, ec);
    if (ec) return Status::error("cannot move the damaged checkpoint " + d + " aside: " + ec.message());
  }
  return Status::ok();
}

Status choose_resume_checkpoint(const TrainOptions& o, comm::Group& world, std::string* dir, std::string* note) {
  std::string passed_over;
  std::vector<std::string> damaged_dirs;
  const auto started = std::chrono::steady_clock::now();
  for (const std::string& candidate : checkpoint::list_checkpoints(o.out_dir)) {
    uint64_t bytes = 0;
    const Status mine = checkpoint::verify_checkpoint(candidate, world.rank(), world.size(), &bytes);
    double damaged = mine.is_ok() ? 0 : 1;
    world.all_reduce_f64(&damaged, 1, comm::ReduceOp::kMax);
    const std::string name = fs::path(candidate).filename().string();
    if (damaged == 0) {
      *dir = candidate;
      char verified[96];
      std::snprintf(verified, sizeof verified, "its %.3g GB checked (checksums) in %.2f s", bytes / 1e9,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
      *note = verified;
      if (!passed_over.empty())
        *note += "; the newest intact checkpoint, " + name + ", was taken: " + passed_over + " (moved aside as damaged_*)";
      return world.rank() == 0 ? move_aside(damaged_dirs) : Status::ok();
    }
    damaged_dirs.push_back(candidate);
    std::string why;  // the first rank's that found damage
    for (const std::string& r : comm::gather_strings(world, mine.is_ok() ? "" : mine.message()))
      if (why.empty()) why = r;
    if (o.resume_strict)
      return Status::error("--resume-strict: the newest checkpoint " + candidate + " is damaged (" + why +
                           "); without --resume-strict the run resumes from the newest intact one before it");
    passed_over += (passed_over.empty() ? "" : "; ") + name + " is damaged (" + why + ")";
  }
  return Status::error("--resume: " + std::string(passed_over.empty() ? "no checkpoint found" : "no intact checkpoint") +
                       " under " + (fs::path(o.out_dir) / "checkpoints").string() +
                       (passed_over.empty() ? "" : " (" + passed_over + ")"));
}

Status guard_run_folder(const TrainOptions& o, comm::Group& world, Run* run) {
  if (o.out_dir.empty()) return Status::ok();
  std::error_code ec;
  run->created_folder = !fs::exists(o.out_dir, ec);
  Status mine = check_writable(o.out_dir, world.rank());
  if (mine.is_ok() && world.rank() == 0) {
    const char* wait = std::getenv("MESHTRAIN_LOCK_WAIT_S");
    mine = RunFolderLock::acquire(o.out_dir, wait ? std::atof(wait) : 0.0, &run->folder_lock);
    if (mine.is_ok()) mine = check_not_mixed(o.out_dir, o.resume, o.overwrite);
  }
  return agree(world, mine);
}

namespace {

}  // namespace

// Every check that can fail happens here, before any training work, on every rank.
Status prepare(const TrainOptions& o, comm::Group& world, Run* run, const std::function<void()>& folder_ready) {
  std::string resume_dir;
  RETURN_IF_ERROR(agree(world, prepare_local(o, world, run)));
  RETURN_IF_ERROR(agree(world, check_memory_fits(o, *run, world.rank())));  // before any large allocation
  RETURN_IF_ERROR(guard_run_folder(o, world, run));
  if (folder_ready) folder_ready();
  if (o.resume) RETURN_IF_ERROR(agree(world, choose_resume_checkpoint(o, world, &resume_dir, &run->resume_note)));
  run->mesh = std::make_unique<comm::Mesh>(world, run->mesh_shape);
  RETURN_IF_ERROR(agree(world, build_state(o, resume_dir, run)));
  if (o.overwrite && run->is_main) RETURN_IF_ERROR(clear_earlier_run(o.out_dir));
  run->peak_gflops = o.peak_gflops > 0 ? o.peak_gflops
                                       : machine::cached_gemm_peak_gflops(run->threads, run->is_main && !o.quiet,
                                                                          run->layout.precision);
  if (run->is_main && !o.out_dir.empty()) RETURN_IF_ERROR(write_run_files(o, *run));
  comm::set_comm_timeout(o.comm_timeout);
  if (!o.trace_file.empty()) trace::Tracer::instance().enable(world.rank());
  MemoryTracker::instance().reset_peaks();  // setup-only buffers are not training memory
  return Status::ok();
}


Status save_run_checkpoint(Run& run, comm::Group& world, int64_t step, bool async) {
  const TrainOptions& o = run.opt;
  json train_state = json::object();
  if (run.scaler) train_state["loss_scaler"] = scaler_json(*run.scaler);
  if (run.gpt->moe_training().bias_speed > 0) train_state["moe_expert_bias"] = expert_bias_json(run);
  if (run.nonfinite.skipped > 0) train_state["nonfinite_skipped"] = run.nonfinite.skipped;
  if (run.dp->onebit_adam() && step > o.compress_start) train_state["onebit_adam_freeze"] = o.compress_start;
  checkpoint::RankState st = rank_state(run);
  for (const auto& [data, n] : run.dp->compressor_state()) st.rank_arrays.push_back({data, n});
  RETURN_IF_ERROR(checkpoint::begin_save(o.out_dir, step, run.gpt->layout(), run.config, run.dp->shards(), st,
                                         world, to_json(o), o.keep_checkpoints, run.mesh_shape.pp,
                                         run.mesh->pp_rank(), train_state, async, &run.pending_save));
  return async ? Status::ok() : finish_run_save(run, world, /*wait=*/true);
}

Status finish_run_save(Run& run, comm::Group& world, bool wait) {
  if (!run.pending_save) return Status::ok();
  bool finished = false;
  return checkpoint::finish_save(&run.pending_save, world, wait, &finished);
}

}  // namespace meshtrain::train
