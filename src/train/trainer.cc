#include "train/trainer.h"

#include <omp.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <thread>

#include "checkpoint/checkpoint.h"
#include "checkpoint/model_file.h"
#include "comm/mesh.h"
#include "core/file_io.h"
#include "train/metrics.h"
#include "train/peak.h"
#include "parallel/pp/stages.h"
#include "train/progress.h"
#include "trace/trace.h"

namespace meshtrain::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

struct Run {
  TrainOptions opt;
  model::GptConfig config;
  BatchShape shape;
  comm::MeshShape mesh_shape;
  std::unique_ptr<comm::Mesh> mesh;
  data::TokenLoader train_data, val_data;
  bool has_val = false;
  std::unique_ptr<model::Gpt> gpt;
  std::unique_ptr<parallel::DataParallel> dp;
  // Pipeline (pp > 1): the layers of each stage, this rank's chunks, the executor.
  std::vector<int> stage_layers;
  model::ModelPart part;
  parallel::pp::ScheduleKind schedule = parallel::pp::ScheduleKind::k1F1B;
  kernels::Precision precision = kernels::Precision::kFp32;
  std::unique_ptr<optim::DynamicLossScaler> scaler;  // fp16 only
  std::unique_ptr<parallel::pp::PipelineExecutor> pipeline;
  int64_t start_step = 0;
  double peak_gflops = 0;
  int threads = 1;
  bool is_main = true;  // world rank 0 prints and writes run files
};

Status write_text(const std::string& path, const std::string& text) {
  return write_file_synced(path, text.data(), text.size());
}

Status check_options(const TrainOptions& o) {
  auto positive = [](const char* flag, int v) -> Status {
    if (v < 1) return Status::error(std::string(flag) + " must be >= 1, got " + std::to_string(v));
    return Status::ok();
  };
  RETURN_IF_ERROR(positive("--micro-batch", o.micro_batch));
  if (o.grad_accum < 0) return Status::error("--grad-accum must be >= 1, got " + std::to_string(o.grad_accum));
  RETURN_IF_ERROR(positive("--steps", o.steps));
  RETURN_IF_ERROR(positive("--eval-batches", o.eval_batches));
  if (o.global_batch < 0) return Status::error("--global-batch must be >= 1 (or 0: B*A*dp)");
  if (o.threads < 0) return Status::error("--threads must be >= 0");
  if (o.keep_checkpoints < 0) return Status::error("--keep-checkpoints must be >= 0 (0 keeps all)");
  if (o.eval_every < 0 || o.save_every < 0) return Status::error("--eval-every/--save-every must be >= 0");
  if (o.resume && o.out_dir.empty()) return Status::error("--resume needs --out DIR");
  if (o.save_every > 0 && o.out_dir.empty()) return Status::error("--save-every needs --out DIR");
  if (o.zero < 0 || o.zero > 3) return Status::error("--zero must be 0, 1, 2 or 3, got " + std::to_string(o.zero));
  if (!(o.bucket_mb > 0)) return Status::error("--bucket-mb must be > 0");
  if (o.recompute != "none" && o.recompute != "selective" && o.recompute != "full")
    return Status::error("--recompute must be none, selective or full, got '" + o.recompute + "'");
  if (o.recompute_every < 1) return Status::error("--recompute-every must be >= 1");
  if (!(o.dropout >= 0 && o.dropout < 1)) return Status::error("--dropout must be in [0, 1)");
  if (!(o.comm_timeout >= 0)) return Status::error("--comm-timeout must be >= 0 (0: never)");
  const auto& ls = o.loss_scale;
  if (!(ls.min_scale > 0) || !(ls.initial >= ls.min_scale))
    return Status::error("--loss-scale must be >= --loss-scale-min > 0");
  if (!(ls.backoff > 0 && ls.backoff < 1)) return Status::error("--loss-scale-backoff must be in (0, 1)");
  if (ls.growth_interval < 1) return Status::error("--loss-scale-window must be >= 1");
  if (!o.offload.empty() && o.offload != "optimizer=cpu" && o.offload != "optimizer=nvme")
    return Status::error("--offload must be optimizer=cpu or optimizer=nvme, got '" + o.offload + "'");
  if ((o.offload == "optimizer=nvme" || o.memory_budget_gb > 0) && o.offload_dir.empty())
    return Status::error(o.offload == "optimizer=nvme" ? "--offload optimizer=nvme needs --offload-dir DIR"
                                                       : "--memory-budget needs --offload-dir DIR (where the "
                                                         "optimizer state goes when it does not fit)");
  if (!(o.offload_chunk_mb > 0)) return Status::error("--offload-chunk-mb must be > 0");
  if (!(o.memory_budget_gb >= 0)) return Status::error("--memory-budget must be >= 0 (0: none)");
  const auto& a = o.adamw;
  if (!(a.lr >= 0) || !(a.min_lr >= 0)) return Status::error("--lr and --min-lr must be >= 0");
  if (a.warmup_steps < 0) return Status::error("--warmup-steps must be >= 0");
  if (!(a.beta1 >= 0 && a.beta1 < 1) || !(a.beta2 >= 0 && a.beta2 < 1))
    return Status::error("--beta1 and --beta2 must be in [0, 1)");
  if (!(a.eps > 0)) return Status::error("--eps must be > 0");
  if (!(a.weight_decay >= 0)) return Status::error("--weight-decay must be >= 0");
  return Status::ok();
}

// The pipeline flags against the layout; m = A micro-batches go through the pipeline.
Status check_pipeline(const TrainOptions& o, const comm::MeshShape& shape, int m, Run* run) {
  namespace pp = parallel::pp;
  RETURN_IF_ERROR(pp::parse_schedule_kind(o.schedule, &run->schedule));
  if (o.virtual_stages < 1) return Status::error("--virtual-stages must be >= 1");
  const bool interleaved = run->schedule == pp::ScheduleKind::kInterleaved;
  if (interleaved != (o.virtual_stages > 1))
    return Status::error(interleaved ? "--schedule interleaved needs --virtual-stages >= 2"
                                     : "--virtual-stages > 1 needs --schedule interleaved");
  if (shape.pp == 1) {
    if (interleaved) return Status::error("--schedule interleaved needs --pp > 1");
    if (!o.stage_layers.empty()) return Status::error("--stage-layers needs --pp > 1");
    return Status::ok();
  }
  if (interleaved && m % shape.pp != 0)
    return Status::error("--schedule interleaved needs the micro-batches per step (" + std::to_string(m) +
                         ", --grad-accum or --global-batch/(micro-batch x dp)) to be a multiple of --pp " +
                         std::to_string(shape.pp));
  if (o.zero >= 2)
    return Status::error(
        "--zero " + std::to_string(o.zero) + " cannot be combined with --pp > 1: the pipeline runs "
        "each micro-batch's backward separately, so ZeRO-2 would reduce-scatter every gradient once "
        "per micro-batch (m times the data-parallel traffic) and ZeRO-3 would gather every "
        "layer's parameters again for each micro-batch's forward and backward; use --zero 0 or 1 "
        "with pipelines (DeepSpeed and Megatron-LM make the same restriction)");
  return Status::ok();
}

// Layout and batch: the mesh from the world size, G and A from the flags.
Status resolve_layout(const TrainOptions& o, comm::Group& world, Run* run) {
  comm::MeshShape shape;
  RETURN_IF_ERROR(comm::resolve_mesh(world.size(), o.tp, o.pp, o.dp, &shape));
  run->mesh_shape = shape;
  BatchShape& b = run->shape;
  b.B = o.micro_batch;
  b.dp = shape.dp;
  b.dp_rank = comm::Mesh::coordinates(world.rank(), shape).dp;
  if (o.global_batch > 0) {
    if (o.global_batch % (b.B * b.dp) != 0)
      return Status::error("--global-batch " + std::to_string(o.global_batch) +
                           " is not divisible by --micro-batch x dp = " + std::to_string(b.B) +
                           " x " + std::to_string(b.dp));
    b.A = o.global_batch / (b.B * b.dp);
    if (o.grad_accum > 0 && o.grad_accum != b.A)
      return Status::error("--grad-accum " + std::to_string(o.grad_accum) + " conflicts with --global-batch " +
                           std::to_string(o.global_batch) + " = micro-batch " + std::to_string(b.B) +
                           " x dp " + std::to_string(b.dp) + " x grad-accum " + std::to_string(b.A));
  } else {
    b.A = std::max(1, o.grad_accum);
  }
  return check_pipeline(o, shape, b.A, run);
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

// The AdamW moments as memory a checkpoint can read or fill: the live buffers, or (when
// offloaded) copies made for the occasion, written back by store(). A checkpoint of an
// offloaded run therefore holds the moments in memory for its duration.
class MomentCopies {
 public:
  explicit MomentCopies(optim::AdamW& adamw) : adamw_(adamw) {
    if (!adamw.offloaded()) return;
    for (int kind = 0; kind < 2; kind++) {
      copies_[kind].allocate(MemCategory::kWorkspace, adamw.size());
      adamw.read_moments(kind, copies_[kind].data());
    }
  }
  float* m() { return adamw_.offloaded() ? copies_[0].data() : adamw_.m(); }
  float* v() { return adamw_.offloaded() ? copies_[1].data() : adamw_.v(); }
  void store() {
    if (!adamw_.offloaded()) return;
    for (int kind = 0; kind < 2; kind++) adamw_.write_moments(kind, copies_[kind].data());
  }

 private:
  optim::AdamW& adamw_;
  Buffer<float> copies_[2];
};

checkpoint::RankState rank_state(Run& run, MomentCopies& moments) {
  const bool sharded = run.opt.zero == 3;
  return {sharded ? run.dp->param_shard() : run.gpt->params(), !sharded, moments.m(), moments.v(),
          run.opt.zero == 0};
}

// Where the AdamW moments live: in memory, or streamed from files when --offload
// optimizer=nvme asks for it or when the model state plus one micro-batch's activations
// would exceed --memory-budget. A budget that even the offloaded run exceeds is an error.
Status place_optimizer_state(const TrainOptions& o, Run* run) {
  const double budget = o.memory_budget_gb * 1e9;
  const auto tracked = [] { return (double)MemoryTracker::instance().stats().total_current; };
  // What training will hold: what setup allocated (parameters, gradients, optimizer state,
  // the activation scratch laid out here) plus one micro-batch's stored activations.
  auto needed = [&] {
    if (budget <= 0) return 0.0;
    run->gpt->stored_activation_bytes(run->shape.B, run->shape.T);
    double sets = 0;
    for (int c = 0; c < run->gpt->num_chunks(); c++) sets += (double)run->gpt->activation_set_bytes(c);
    return tracked() + sets;
  };
  const bool offload = o.offload == "optimizer=nvme" || (budget > 0 && needed() > budget);
  if (offload) {
    const size_t chunk = std::max<size_t>(1, (size_t)(o.offload_chunk_mb * 1024 * 1024 / sizeof(float)));
    RETURN_IF_ERROR(run->dp->adamw().offload(o.offload_dir, run->mesh->world().rank(), chunk));
  }
  if (budget > 0 && needed() > budget) {
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "--memory-budget %.3g GB is too small: this rank needs %.3g GB for parameters, "
                  "gradients, buffers and one micro-batch's activations%s",
                  o.memory_budget_gb, needed() / 1e9, offload ? " with the optimizer state offloaded" : "");
    return Status::error(buf);
  }
  return Status::ok();
}

Status build_state(const TrainOptions& o, const std::string& resume_dir, Run* run) {
  const bool sharded_params = o.zero == 3;
  comm::Group* tp = &run->mesh->tp();
  run->gpt = std::make_unique<model::Gpt>(run->config, parallel::model_state_for_stage(o.zero), tp,
                                          o.sp, run->part);
  const model::Recompute mode = o.recompute == "full"        ? model::Recompute::kFull
                                : o.recompute == "selective" ? model::Recompute::kSelective
                                                             : model::Recompute::kNone;
  run->gpt->set_recompute(mode, o.recompute_every);
  run->gpt->set_precision(run->precision);
  run->gpt->set_dropout(o.dropout, o.seed);
  parallel::DpConfig dpc{o.zero, o.bucket_mb, o.overlap};
  if (sharded_params) {
    // The full initial weights exist only during setup (peaks are reset before training).
    model::Gpt full(run->config, model::Gpt::LocalState::kParamsOnly, tp, false, run->part);
    RETURN_IF_ERROR(initial_weights(o, &full));
    run->dp = std::make_unique<parallel::DataParallel>(*run->gpt, run->mesh->dp(), dpc, o.adamw,
                                                       full.params(), tp);
  } else {
    RETURN_IF_ERROR(initial_weights(o, run->gpt.get()));
    run->dp = std::make_unique<parallel::DataParallel>(*run->gpt, run->mesh->dp(), dpc, o.adamw,
                                                       nullptr, tp);
  }
  if (run->mesh_shape.pp > 1) {
    // The first stage (rank 0) and the last (rank p - 1) both hold the tied embedding.
    const int p = run->mesh_shape.pp, r = run->mesh->pp_rank();
    run->dp->set_pipeline(&run->mesh->pp(), r == 0 ? p - 1 : r == p - 1 ? 0 : -1);
    run->pipeline = std::make_unique<parallel::pp::PipelineExecutor>(
        *run->gpt, run->mesh->pp(), run->schedule, o.virtual_stages);
  }
  if (run->precision == kernels::Precision::kFp16)
    run->scaler = std::make_unique<optim::DynamicLossScaler>(o.loss_scale);
  RETURN_IF_ERROR(place_optimizer_state(o, run));
  if (resume_dir.empty()) return Status::ok();
  if (run->scaler) RETURN_IF_ERROR(restore_scaler(resume_dir, run->scaler.get()));
  MomentCopies moments(run->dp->adamw());
  checkpoint::RankState st = rank_state(*run, moments);
  RETURN_IF_ERROR(checkpoint::load_checkpoint(resume_dir, run->gpt->layout(), run->config,
                                              run->dp->shards(), st, &run->start_step));
  moments.store();
  if (run->start_step >= o.steps)
    return Status::error(resume_dir + " is at step " + std::to_string(run->start_step) +
                         ", already >= --steps " + std::to_string(o.steps));
  return Status::ok();
}


Status write_run_files(const TrainOptions& o, const Run& run) {
  std::error_code ec;
  fs::create_directories(o.out_dir, ec);
  if (ec) return Status::error("cannot create --out " + o.out_dir + ": " + ec.message());
  json resolved = to_json(o);
  resolved["resolved_model"] = {{"layers", run.config.layers}, {"heads", run.config.heads},
                                {"dim", run.config.dim}, {"vocab", run.config.vocab},
                                {"max_seq_len", run.config.max_seq_len}, {"seq_len", run.shape.T}};
  resolved["resolved_layout"] = {{"world", run.mesh_shape.world()}, {"tp", run.mesh_shape.tp},
                                 {"pp", run.mesh_shape.pp}, {"dp", run.mesh_shape.dp},
                                 {"grad_accum", run.shape.A}, {"global_batch", run.shape.G()}};
  RETURN_IF_ERROR(write_text((fs::path(o.out_dir) / "config.json").string(), resolved.dump(2) + "\n"));
  if (!o.resolved_config_toml.empty())
    RETURN_IF_ERROR(write_text((fs::path(o.out_dir) / "config.toml").string(), o.resolved_config_toml));
  return Status::ok();
}

// Checks without communication: flags, layout arithmetic, model shape, data files.
Status prepare_local(const TrainOptions& o, comm::Group& world, Run* run, std::string* resume_dir) {
  RETURN_IF_ERROR(check_options(o));
  RETURN_IF_ERROR(parse_precision(o.precision, &run->precision));
  run->opt = o;
  run->is_main = world.rank() == 0;
  run->threads = o.threads > 0 ? o.threads : default_threads(local_ranks());
  omp_set_num_threads(run->threads);
  RETURN_IF_ERROR(resolve_layout(o, world, run));
  // The model shape comes from the flags (the same as the interrupted run's);
  // load_checkpoint() rejects a checkpoint of another shape.
  RETURN_IF_ERROR(resolve_model(o, &run->config, &run->shape.T));
  RETURN_IF_ERROR(model::validate_tp(run->config, run->mesh_shape.tp));
  if (run->mesh_shape.pp > 1) {
    const int p = run->mesh_shape.pp;
    RETURN_IF_ERROR(parallel::pp::split_layers(run->config, run->shape.B, run->shape.T,
                                               p * o.virtual_stages, o.stage_layers, &run->stage_layers));
    run->part = parallel::pp::rank_part(run->stage_layers, p, comm::Mesh::coordinates(world.rank(), run->mesh_shape).pp);
  }
  if (o.sp && run->mesh_shape.tp < 2)
    return Status::error("--sp (sequence parallelism) needs --tp > 1");
  if (o.sp && (run->shape.B * run->shape.T) % run->mesh_shape.tp != 0)
    return Status::error("--sp needs micro-batch x seq-len (" +
                         std::to_string(run->shape.B * run->shape.T) + " tokens) divisible by --tp " +
                         std::to_string(run->mesh_shape.tp));
  if (o.resume) RETURN_IF_ERROR(checkpoint::find_latest_checkpoint(o.out_dir, resume_dir));
  if (!o.trace_file.empty()) RETURN_IF_ERROR(check_trace_path(o.trace_file));

  const std::string train_path = (fs::path(o.data_dir) / "train.bin").string();
  const std::string val_path = (fs::path(o.data_dir) / "val.bin").string();
  RETURN_IF_ERROR(data::TokenLoader::open(train_path, &run->train_data));
  RETURN_IF_ERROR(run->train_data.check(run->shape.G(), run->shape.T, run->config.vocab));
  if (fs::exists(val_path)) {
    RETURN_IF_ERROR(data::TokenLoader::open(val_path, &run->val_data));
    run->has_val = run->val_data.check(run->shape.B, run->shape.T, run->config.vocab).is_ok();
  }
  return Status::ok();
}

// Every rank reaches the same verdict: an error on any rank stops all of them at this
// point, each with a message, and none is left waiting in a collective.
Status agree(comm::Group& world, const Status& mine) {
  double failed = mine.is_ok() ? 0.0 : 1.0;
  world.all_reduce_f64(&failed, 1, comm::ReduceOp::kSum);
  if (failed == 0) return Status::ok();
  if (!mine.is_ok()) return mine;
  return Status::error("rank " + std::to_string(world.rank()) +
                       ": stopping because another rank rejected the run (its message says why)");
}

// Every check that can fail happens here, before any training work, on every rank.
Status prepare(const TrainOptions& o, comm::Group& world, Run* run) {
  std::string resume_dir;
  RETURN_IF_ERROR(agree(world, prepare_local(o, world, run, &resume_dir)));
  run->mesh = std::make_unique<comm::Mesh>(world, run->mesh_shape);
  RETURN_IF_ERROR(agree(world, build_state(o, resume_dir, run)));
  if (run->is_main && !o.out_dir.empty()) RETURN_IF_ERROR(write_run_files(o, *run));
  run->peak_gflops = o.peak_gflops > 0 ? o.peak_gflops
                                       : cached_gemm_peak_gflops(run->threads, run->is_main && !o.quiet,
                                                                 run->precision);
  comm::set_comm_timeout(o.comm_timeout);
  if (!o.trace_file.empty()) trace::Tracer::instance().enable(world.rank());
  MemoryTracker::instance().reset_peaks();  // setup-only buffers are not training memory
  return Status::ok();
}

json comm_json(const std::map<std::string, comm::AxisStats>& stats, double* wait_ms,
               double* busy_ms) {
  json out = json::object();
  *wait_ms = *busy_ms = 0;
  for (const auto& [axis, s] : stats) {
    if (s.calls == 0) continue;
    out[axis] = {{"bytes", s.bytes}, {"calls", s.calls}};
    *wait_ms += s.wait_s * 1e3;
    *busy_ms += s.busy_s * 1e3;
  }
  return out;
}

// The step's measured pipeline bubble over the pp group: idle time inside the pipeline
// window of every stage over the window (see PipelineTimes), next to the schedule's own
// bubble from the simulator with the backward costing twice the forward.
json pipeline_json(Run& run) {
  if (!run.pipeline) return json::object();
  const auto& t = run.pipeline->times();
  double sums[2] = {t.compute_s, t.window_s};
  run.mesh->pp().all_reduce_f64(sums, 2, comm::ReduceOp::kSum);
  parallel::pp::SimResult sim;
  const Status simulated = parallel::pp::simulate(run.schedule, run.mesh_shape.pp, run.shape.A,
                                                  run.opt.virtual_stages, 1.0, 2.0, &sim);
  return {{"bubble", sums[1] > 0 ? 1.0 - sums[0] / sums[1] : 0.0},
          {"bubble_theory", simulated.is_ok() ? sim.bubble_fraction : -1.0},
          {"pp_compute_ms", t.compute_s * 1e3},
          {"pp_window_ms", t.window_s * 1e3},
          {"pp_peak_sets", t.peak_sets}};
}

// Collective: world rank 0 prints every rank's peak memory by category, and the pipeline's
// split and last measured bubble.
void print_summary(Run& run, comm::Group& world, const json& pipeline) {
  constexpr int kFields = 8;
  const MemStats m = MemoryTracker::instance().stats();
  std::vector<double> all((size_t)world.size() * kFields, 0.0);
  double* mine = all.data() + (size_t)world.rank() * kFields;
  auto peak = [&](MemCategory c) { return (double)m.peak[(int)c]; };
  const double other = peak(MemCategory::kComm) + peak(MemCategory::kGathered) + peak(MemCategory::kWorkspace);
  const double row[kFields] = {(double)run.mesh->tp_rank(), (double)run.mesh->pp_rank(),
                               (double)run.mesh->dp_rank(), peak(MemCategory::kParams),
                               peak(MemCategory::kGrads), peak(MemCategory::kOptim),
                               peak(MemCategory::kActivations) + other, (double)m.total_peak};
  std::copy(row, row + kFields, mine);
  world.all_reduce_f64(all.data(), all.size(), comm::ReduceOp::kSum);
  if (!run.is_main) return;
  const double mib = 1024.0 * 1024.0;
  std::printf("peak memory per rank (MiB): params, grads, optimizer state, activations + buffers, total\n");
  for (int r = 0; r < world.size(); r++) {
    const double* f = all.data() + (size_t)r * kFields;
    std::printf("  rank %2d (tp %d pp %d dp %d) | params %8.2f | grads %8.2f | optim %8.2f | acts+buf %8.2f | total %8.2f\n",
                r, (int)f[0], (int)f[1], (int)f[2], f[3] / mib, f[4] / mib, f[5] / mib, f[6] / mib, f[7] / mib);
  }
  if (!run.pipeline) return;
  std::string split;
  for (int n : run.stage_layers) {
    if (!split.empty()) split += ',';
    split += std::to_string(n);
  }
  std::printf("pipeline: %s, %d stages of layers %s, m=%d micro-batches | bubble (last step) measured %.3f, "
              "schedule %.3f\n",
              parallel::pp::schedule_name(run.schedule), (int)run.stage_layers.size(), split.c_str(),
              run.shape.A, pipeline.value("bubble", 0.0), pipeline.value("bubble_theory", 0.0));
}

// Every rank writes FILE.rank<N>; world rank 0 merges them into FILE.
Status write_trace(const std::string& file, comm::Group& world) {
  auto& tracer = trace::Tracer::instance();
  const std::string part = file + ".rank" + std::to_string(world.rank());
  Status written = tracer.write(part);
  tracer.disable();
  world.barrier();
  if (world.rank() != 0 || !written.is_ok()) return written;
  std::vector<std::string> parts;
  for (int r = 0; r < world.size(); r++) parts.push_back(file + ".rank" + std::to_string(r));
  RETURN_IF_ERROR(trace::merge_rank_files(parts, file));
  for (const auto& p : parts) fs::remove(p);
  return Status::ok();
}

}  // namespace

float evaluate_loss(model::Gpt& gpt, const data::TokenLoader& data, int B, int T, int batches,
                    parallel::pp::PipelineExecutor* pipeline) {
  // Evaluation runs without dropout.
  struct NoDropout {
    model::Gpt& g;
    float p;
    ~NoDropout() { g.set_dropout(p, 0); }
  } restore{gpt, gpt.dropout_probability()};
  gpt.set_dropout(0, 0);
  const int64_t n = std::min<int64_t>(batches, data.windows(B, T));
  std::vector<int> inputs((size_t)B * T), targets((size_t)B * T);
  double sum = 0;
  for (int64_t k = 0; k < n; k++) {
    data.fill(k, B, T, 0, B, inputs.data(), targets.data());
    sum += pipeline ? pipeline->forward_only(inputs.data(), targets.data(), B, T)
                    : gpt.forward(inputs.data(), targets.data(), B, T);
  }
  return (float)(sum / n);
}

StepResult train_step(model::Gpt& gpt, parallel::DataParallel& dp, comm::Group& dp_group,
                      const optim::AdamWConfig& cfg, const data::TokenLoader& data,
                      const BatchShape& shape, int64_t k, int total_steps,
                      parallel::pp::PipelineExecutor* pipeline, optim::DynamicLossScaler* scaler) {
  const int B = shape.B, T = shape.T, G = shape.G();
  const double S = scaler ? scaler->scale() : 1.0;
  const float loss_scale = (float)(S / ((double)G * T));
  // Micro-batch a of this rank: rows first_row + a*B of the step's global batch.
  auto row = [&](int a) { return shape.first_row() + a * B; };
  dp.begin_step(shape.A);
  double loss_sum = 0;  // sum of token losses over this rank's rows
  if (pipeline) {
    parallel::pp::MicroBatches mbs{
        [&](int a, int* inputs, int* targets) { data.fill(k, G, T, row(a), B, inputs, targets); },
        [&](int a) { return (int64_t)row(a) * T; }};
    loss_sum = pipeline->train_step(shape.A, B, T, k, mbs, loss_scale, dp);
  } else {
    std::vector<int> inputs((size_t)B * T), targets((size_t)B * T);
    for (int a = 0; a < shape.A; a++) {
      data.fill(k, G, T, row(a), B, inputs.data(), targets.data());
      gpt.set_batch_position(k, (int64_t)row(a) * T);
      const json where = {{"step", k + 1}, {"mb", a}, {"chunk", 0}};
      {
        trace::Tracer::Span span(trace::Lane::kCompute, parallel::pp::span_name(true, a, 0, 1),
                                 trace::category::kForward, where);
        loss_sum += (double)gpt.forward(inputs.data(), targets.data(), B, T) * B * T;
      }
      {
        trace::Tracer::Span span(trace::Lane::kCompute, parallel::pp::span_name(false, a, 0, 1),
                                 trace::category::kBackward, where);
        gpt.backward(loss_scale);
      }
      dp.end_micro_batch();
    }
  }
  dp.finish_reductions();
  dp_group.all_reduce_f64(&loss_sum, 1, comm::ReduceOp::kSum);
  StepResult r;
  r.loss = (float)(loss_sum / ((double)G * T));
  trace::Tracer::Span span(trace::Lane::kCompute, "optimizer", trace::category::kOptimizer, {{"step", k + 1}});
  // The norm is reduced over every axis, so every rank reaches the same overflow verdict.
  const double norm = dp.grad_norm();
  r.grad_norm = norm / S;
  r.loss_scale = S;
  r.lr = optim::learning_rate(cfg, (int)k, total_steps);
  const int64_t applied = k - (scaler ? scaler->skipped_steps() : 0);  // updates so far
  if (scaler) {
    r.skipped = !std::isfinite(norm);
    r.status = scaler->update(r.skipped);
    if (r.skipped) return r;
  }
  dp.clip(norm, cfg.grad_clip, S);
  dp.optimizer_step(r.lr, (int)applied + 1);
  return r;
}

Status run_training(const TrainOptions& options, comm::Group& world, TrainResult* result) {
  Run run;
  RETURN_IF_ERROR(prepare(options, world, &run));
  const TrainOptions& o = run.opt;
  MetricsWriter metrics;
  if (run.is_main && !o.out_dir.empty())
    RETURN_IF_ERROR(metrics.open((fs::path(o.out_dir) / "metrics.jsonl").string(),
                                 o.resume ? run.start_step : -1));

  const BatchShape& shape = run.shape;
  const double flops_per_token = run.gpt->flops_per_token(shape.T);
  const int64_t tokens_per_step = (int64_t)shape.G() * shape.T;
  const bool quiet = o.quiet || !run.is_main;
  if (!quiet) {
    std::printf("model: %d layers, %d heads, dim %d, vocab %d, %.2fM parameters | T=%d B=%d A=%d "
                "G=%d | %s zero=%d | %s GEMMs | %d threads/rank, peak %.0f GFLOP/s per rank\n",
                run.config.layers, run.config.heads, run.config.dim, run.config.vocab,
                model::num_parameters(run.config) / 1e6, shape.T, shape.B, shape.A, shape.G(),
                run.mesh->shape().to_string().c_str(), o.zero, o.precision.c_str(), run.threads,
                run.peak_gflops);
    if (run.start_step > 0) std::printf("resumed at step %lld\n", (long long)run.start_step);
  }
  Progress progress(run.start_step, o.steps, quiet);
  TrainResult local;
  TrainResult& res = result ? *result : local;
  const int world_size = world.size();
  json last_pipeline;
  for (int64_t k = run.start_step; k < o.steps; k++) {
    comm::set_current_step(k + 1);
    if (world.rank() == o.debug_stall_rank && k + 1 == o.debug_stall_step)
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));  // the watchdog test
    run.mesh->reset_stats();
    run.gpt->reset_flops();
    auto t0 = std::chrono::steady_clock::now();
    std::optional<trace::Tracer::Span> step_span;
    if (trace::Tracer::instance().enabled())
      step_span.emplace(trace::Lane::kCompute, "step " + std::to_string(k + 1), trace::category::kStep,
                        json{{"step", k + 1}});
    StepResult r = train_step(*run.gpt, *run.dp, run.mesh->dp(), o.adamw, run.train_data, shape, k,
                              o.steps, run.pipeline.get(), run.scaler.get());
    RETURN_IF_ERROR(r.status);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    step_span.reset();
    const double tok_s = tokens_per_step / s;
    // MFU per rank: the step's model FLOPs spread over every rank's peak.
    const double mfu = tok_s * flops_per_token / (run.peak_gflops * 1e9 * world_size);
    if (!std::isfinite(r.loss))
      return Status::error("loss is " + std::to_string(r.loss) + " at step " + std::to_string(k + 1) +
                           " (diverged; try a lower --lr)");
    res.losses.push_back(r.loss);
    res.grad_norms.push_back((float)r.grad_norm);
    json pipeline = pipeline_json(run);
    last_pipeline = pipeline;
    double wait_ms = 0, busy_ms = 0;
    json comm = comm_json(run.mesh->stats(), &wait_ms, &busy_ms);
    const double hidden = busy_ms > 0 ? std::clamp(1.0 - wait_ms / busy_ms, 0.0, 1.0) : 0.0;
    json record = {{"step", k + 1}, {"loss", r.loss}, {"lr", r.lr}, {"grad_norm", r.grad_norm},
                   {"tokens", (k + 1) * tokens_per_step}, {"step_ms", s * 1e3},
                   {"tokens_per_s", tok_s}, {"mfu", mfu},
                   {"mem", memory_json(MemoryTracker::instance().stats())}, {"comm", comm},
                   {"comm_ms", wait_ms}, {"comm_busy_ms", busy_ms}, {"comm_hidden", hidden},
                   // This rank's executed block FLOPs; recompute_fraction = recomputed forward
                   // work over one forward of the blocks (full recomputation: ~1).
                   {"block_flops", run.gpt->flops().model},
                   {"recompute_flops", run.gpt->flops().recompute},
                   {"recompute_fraction", run.gpt->flops().recompute / (run.gpt->flops().model / 3.0)}};
    record.update(pipeline);
    if (auto* off = run.dp->adamw().offloaded()) {
      const auto& st = off->stats();
      record["offload"] = {{"read_bytes", st.bytes_read}, {"written_bytes", st.bytes_written},
                           {"io_ms", st.io_s * 1e3}, {"wait_ms", st.wait_s * 1e3}};
      off->reset_stats();
    }
    if (run.scaler)
      record.update({{"loss_scale", r.loss_scale}, {"step_skipped", r.skipped},
                     {"skipped_steps", run.scaler->skipped_steps()}});
    metrics.write(record);
    progress.step(k, r.loss, r.lr, r.grad_norm, s, tok_s, mfu);

    const bool last = k + 1 == o.steps;
    if (run.has_val && ((o.eval_every > 0 && (k + 1) % o.eval_every == 0) || last)) {
      // Every rank evaluates the same batches (ZeRO-3 forwards are collective).
      float val = evaluate_loss(*run.gpt, run.val_data, shape.B, shape.T, o.eval_batches,
                                run.pipeline.get());
      res.final_val_loss = val;
      metrics.write({{"step", k + 1}, {"val_loss", val}, {"tokens", (k + 1) * tokens_per_step}});
      char line[96];
      std::snprintf(line, sizeof line, "step %5lld | val loss %.4f", (long long)k + 1, val);
      progress.message(line);
    }
    // The final step is always saved when there is a run folder (export/generate read it).
    const bool save = !o.out_dir.empty() && ((o.save_every > 0 && (k + 1) % o.save_every == 0) || last);
    if (save) {
      MomentCopies moments(run.dp->adamw());
      RETURN_IF_ERROR(checkpoint::save_checkpoint(o.out_dir, k + 1, run.gpt->layout(), run.config,
                                                  run.dp->shards(), rank_state(run, moments), world,
                                                  to_json(o), o.keep_checkpoints,
                                                  run.mesh_shape.pp, run.mesh->pp_rank(),
                                                  run.scaler ? json{{"loss_scaler", scaler_json(*run.scaler)}}
                                                             : json::object()));
    }
  }
  if (!o.trace_file.empty()) RETURN_IF_ERROR(agree(world, write_trace(o.trace_file, world)));
  if (!o.quiet && world.size() > 1) print_summary(run, world, last_pipeline);
  return Status::ok();
}

}  // namespace meshtrain::train
