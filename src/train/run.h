// The state of one training run on this rank, and the steps that build it and report on
// it: loop.cc runs the loop; setup.cc validates and builds everything before the first
// step (every check on every rank, agreed over the world); report.cc writes what a run
// tells its user beyond metrics.jsonl's basics.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "comm/mesh.h"
#include "data/loader.h"
#include "model/gpt.h"
#include "parallel/layout.h"
#include "optim/loss_scale.h"
#include "parallel/data_parallel.h"
#include "parallel/pp/executor.h"
#include "train/console.h"
#include "train/curriculum.h"
#include "train/options.h"
#include "train/run_folder.h"
#include "train/trainer.h"

namespace meshtrain::train {

struct Run {
  TrainOptions opt;
  model::GptConfig config;
  BatchShape shape;
  Curriculum curriculum;  // each step's row length (off: T)
  parallel::Layout layout;  // every axis and choice, checked (parallel/layout.h)
  RunPolicy policy;         // --on-nonfinite, --save-on-exit, --lr-unit (options.h)
  comm::MeshShape mesh_shape;  // layout.mesh()
  std::unique_ptr<comm::Mesh> mesh;
  data::TokenLoader train_data, val_data;
  bool has_val = false;
  int doc_separator = -1;  // --doc-mask's separator token, resolved; -1: no document mask
  std::unique_ptr<model::Gpt> gpt;
  std::unique_ptr<parallel::DataParallel> dp;
  // Pipeline (pp > 1): the layers of each stage, this rank's chunks, the executor.
  std::vector<int> stage_layers;
  model::ModelPart part;
  std::unique_ptr<optim::DynamicLossScaler> scaler;  // fp16 only
  NonfinitePolicy nonfinite;                         // without a scaler (train_step)
  std::unique_ptr<parallel::pp::PipelineExecutor> pipeline;
  int64_t start_step = 0;
  std::string resumed_layout;  // --resume: the checkpoint writers' layout, e.g. "tp 2, pp 2, dp 2"
  bool rank_arrays_restored = false;  // --resume: the compressor's per-rank state came back
  bool previous_weights_restored = false;  // --resume: 2bw's previous weight version came back
  double peak_gflops = 0;
  int threads = 1;
  bool is_main = true;  // world rank 0 prints and writes run files
  std::vector<std::string> hosts;  // every world rank's host name
  checkpoint::PendingSavePtr pending_save;  // --async-save: a save still being written
  std::unique_ptr<RunFolderLock> folder_lock;  // world rank 0, with --out: the run folder is this job's
  bool created_folder = false;  // --out did not exist: a run that fails its setup removes it again
  std::string resume_note;  // --resume: which checkpoint was taken, and why the newer ones were not
};


// --- setup.cc ---
// Collective, before anything is written: with --out, every rank can write the folder,
// world rank 0 holds its lock (waiting MESHTRAIN_LOCK_WAIT_S seconds for a holder to end,
// which the launcher sets for its restarts), and the folder holds no other run unless
// --resume or --overwrite says what to do with it.
Status guard_run_folder(const TrainOptions& o, comm::Group& world, Run* run);
// Collective: --resume's checkpoint, the newest whose index, shard sizes and checksums hold
// (each rank checks a share of the files); `note` says which one and why newer ones were
// passed over. --resume-strict refuses a damaged newest one instead.
Status choose_resume_checkpoint(const TrainOptions& o, comm::Group& world, std::string* dir, std::string* note);
// Every check that can fail happens here, before any training work, on every rank; then
// the run folder's guards (guard_run_folder), after which `folder_ready` runs (the
// heartbeat starts); then the mesh, the model part, the optimizer, the pipeline and (on
// --resume) the newest intact checkpoint.
Status prepare(const TrainOptions& o, comm::Group& world, Run* run, const std::function<void()>& folder_ready = {});

// What prepare() checks first on every rank that needs no rank and no communication: the
// flags, then the layout (train/options.h's to_layout on `world` ranks) against the model
// (parallel/layout.h's rules, every broken one listed). The launcher calls it before mpirun
// starts any rank, so that a bad layout is one error, said once.
Status check_flags_and_layout(const TrainOptions& o, int world);
// Every rank reaches the same verdict: an error on any rank stops all of them, each with a
// message, and none is left waiting in a collective.
Status agree(comm::Group& world, const Status& mine);
// Collective: the checkpoint of step `step` (model, optimizer and loss-scaler state); with
// `async` begun (a snapshot of this rank's shard, written by a thread) and left pending in
// run.pending_save for finish_run_save. A pending save is finished first.
Status save_run_checkpoint(Run& run, comm::Group& world, int64_t step, bool async = false);
// Collective: commits run.pending_save once every rank wrote its shard (with `wait`, after
// waiting for its own); nothing to do without one.
Status finish_run_save(Run& run, comm::Group& world, bool wait);

// --- run_end.cc ---
// Collective: a stop asked for by `sig` before step k + 1 (steps up to k are trained, and
// `saved_step` is the newest checkpoint's): saves step k when --save-on-exit asks and it is
// not saved yet, then world rank 0 says on console.err where the run stopped and how to
// continue it.
Status stop_on_signal(Run& run, comm::Group& world, int64_t k, int64_t saved_step, int sig, const Console& console);
// --on-nonfinite skip gave up: `in_row` steps up to `step` were skipped in a row (every rank
// reaches it at the same step). The error names the steps, the last one's cause and the
// newest checkpoint.
Status too_many_skips(const Run& run, int64_t step, int64_t in_row, const std::string& last_cause);
// World rank 0, at the end of a run: its last lines (final loss, wall time, the checkpoint,
// how to continue and use it); none on other ranks or when no step ran.
std::vector<std::string> run_end_lines(const Run& run, const TrainResult& result, double wall_s);
// "meshtrain train --config OUT/config.toml --resume --steps N": the command that continues
// the run in `out_dir` (N: twice its steps when it is finished).
std::string continue_command(const TrainOptions& o, int64_t steps);

// --- report.cc ---
// Bytes and calls per axis for metrics.jsonl; wait/busy milliseconds summed over axes.
nlohmann::json comm_json(const std::map<std::string, comm::AxisStats>& stats, double* wait_ms,
                         double* busy_ms);
// Milliseconds per axis: wait (blocked) and busy (the communication itself), "comm_time".
nlohmann::json comm_time_json(const std::map<std::string, comm::AxisStats>& stats);
// Collective over pp: the step's measured and theoretical pipeline bubble (empty without pp).
nlohmann::json pipeline_json(Run& run);
// The step's routing over the whole job, per layer: aux, z, dropped, then E kept and E
// chosen assignments per expert (MoeJobStats::at). Collective over the world; empty when dense.
struct MoeJobStats {
  int experts = 0;
  std::vector<double> table;  // [layers x (3 + 2 E)]
  const double* at(int layer) const { return table.data() + (size_t)layer * (3 + 2 * experts); }
};
MoeJobStats moe_job_stats(Run& run, comm::Group& world);
// {"moe": {aux_loss, z_loss, dropped_fraction, tokens_per_expert {min, max, cv (the worst
// layer's)}, expert_bias {min, max} with aux-loss-free balancing, and this rank's sent_rows,
// received_rows of the expert-parallel dispatch}} (empty when dense).
nlohmann::json moe_json(Run& run, const MoeJobStats& stats);
// Aux-loss-free balancing: every MoE layer's bias, moved by the job's loads of the step.
void update_expert_biases(Run& run, const MoeJobStats& stats);
// Collective over the world: every rank's host name (heartbeat.h's host_name()).
std::vector<std::string> gather_host_names(comm::Group& world);
// Collective over the world: the step's straggler, the rank the others waited for (the most
// time not blocked in communication, "behind" the median by behind_ms), and its slowest
// link: the (rank, axis) whose best large call (comm::AxisStats::best_bytes_per_s) was the
// slowest, beside the median and fastest. World rank 0 gets the record; empty on one rank.
nlohmann::json straggler_json(Run& run, comm::Group& world, double step_s, double wait_s,
                              const std::map<std::string, comm::AxisStats>& stats);
// Collective: world rank 0 gets the lines of every rank's peak memory and the pipeline's
// bubble (other ranks: none).
std::vector<std::string> summary_lines(Run& run, comm::Group& world, const nlohmann::json& pipeline);
// The banner a run starts with: model, machine, data, resume, and notes on compression,
// quantized communication, 2bw, what is in files and the curriculum.
std::vector<std::string> banner_lines(const Run& run);
// metrics.jsonl's "offload": this rank's file-backed arrays and their I/O since the last
// call (which resets the store's counters).
nlohmann::json offload_json(optim::ShardStore& store);
// Collective: every rank's trace, merged into `file` by world rank 0.
Status write_trace(const std::string& file, comm::Group& world);

}  // namespace meshtrain::train
