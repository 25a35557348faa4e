#include <filesystem>

#include "cli/commands.h"
#include "cli/config_file.h"
#include "cli/in_process.h"
#include "cli/launch.h"
#include "comm/group.h"
#include "train/auto_plan.h"
#include "train/interrupt.h"
#include "train/run.h"
#include "train/run_folder.h"
#include "train/trainer.h"

namespace meshtrain::cli {

namespace {

// The layout flags given on the command line (or in a config file): --plan auto keeps them.
Status fixed_layout_flags(CLI::App* cmd, const train::TrainOptions& o, planner::SearchSpace* fixed) {
  auto given = [&](const char* flag) { return cmd->count(flag) > 0; };
  if (given("--tp")) fixed->tp = o.tp;
  if (given("--pp")) fixed->pp = o.pp;
  if (given("--dp")) fixed->dp = o.dp;
  if (given("--zero")) fixed->zero = o.zero;
  if (given("--micro-batch")) fixed->micro_batch = o.micro_batch;
  if (given("--virtual-stages")) fixed->virtual_stages = o.virtual_stages;
  if (given("--sp")) fixed->sp = o.sp;
  if (given("--cp")) fixed->cp = o.cp;
  if (given("--cp-a2a")) fixed->cp_a2a = o.cp_a2a;
  if (given("--cp-comm")) {
    model::CpComm c = model::CpComm::kRing;
    RETURN_IF_ERROR(model::parse_cp_comm(o.cp_comm, &c));
    fixed->cp_comm = c;
  }
  if (given("--expert-tp") && o.expert_tp == 1) fixed->expert_tp = model::ExpertTp::kReplicated;
  if (given("--schedule")) {
    parallel::pp::ScheduleKind k;
    RETURN_IF_ERROR(parallel::pp::parse_schedule_kind(o.schedule, &k));
    fixed->schedule = k;
  }
  if (given("--recompute")) {
    planner::Recompute r;
    RETURN_IF_ERROR(planner::parse_recompute(o.recompute, &r));
    fixed->recompute = r;
  }
  return Status::ok();
}

// The supervisor's flags, checked before anything starts.
Status check_launch(const LaunchOptions& launch, const train::TrainOptions& o) {
  if (launch.max_restarts < 0) return Status::error("--max-restarts must be >= 0");
  if (launch.max_restarts > 0 && o.out_dir.empty())
    return Status::error("--max-restarts needs --out: a restart resumes from the run folder's newest checkpoint");
  if (!launch.hostfile.empty() && !std::filesystem::is_regular_file(launch.hostfile))
    return Status::error("--hostfile " + launch.hostfile + ": no such file");
  if (launch.elastic) {
    if (launch.max_restarts < 1) return Status::error("--elastic needs --max-restarts K >= 1: it shapes the restarts");
    if (launch.hostfile.empty()) return Status::error("--elastic needs --hostfile: the hosts a restart may leave out");
    if (!o.plan.empty()) return Status::error("--elastic does not combine with --plan auto yet: give the layout");
  }
  return Status::ok();
}

// From a plain shell: the ranks the launcher must start (*ranks > 0), or 0 when this process
// trains alone. Everything that can be checked before a rank starts is checked here, once.
Status ranks_to_launch(const train::TrainOptions& o, const planner::SearchSpace& fixed, const LaunchOptions& launch,
                       int* ranks) {
  int n = o.tp * std::max(1, o.cp) * o.pp * std::max(1, o.dp);
  train::TrainOptions probe = o;  // the layout the ranks will run
  if (!o.plan.empty()) {
    if (o.ranks < 1) return Status::error("--plan auto needs --ranks N: how many ranks to lay out");
    // Planned here too, so that a plan that cannot work fails before any rank starts.
    std::string summary;
    RETURN_IF_ERROR(train::choose_layout(&probe, o.ranks, fixed, &summary));
    n = o.ranks;
  }
  RETURN_IF_ERROR(check_launch(launch, o));
  *ranks = 0;
  if (n == 1 && launch.max_restarts == 0 && launch.hostfile.empty()) return Status::ok();
  // The flags and the layout, once, before mpirun starts a rank (the ranks check again).
  RETURN_IF_ERROR(train::check_flags_and_layout(probe, n));
  // Said once here before any rank starts (the ranks check again, under the lock).
  RETURN_IF_ERROR(train::check_run_folder_free(o.out_dir));
  RETURN_IF_ERROR(train::check_not_mixed(o.out_dir, o.resume, o.overwrite));
  *ranks = n;
  return Status::ok();
}

// The ranks started under the supervising launcher (a host program starts it itself: it
// learns how many ranks, and nothing runs here).
int launch_ranks(const train::TrainOptions& o, int ranks, LaunchOptions* launch) {
  if (InProcess* io = in_process()) {
    io->launcher_ranks = ranks;
    return 0;
  }
  launch->graceful_stop = true;
  launch->ranks = ranks;
  launch->threads_per_rank = o.threads;
  launch->out_dir = o.out_dir;
  launch->comm_timeout = o.comm_timeout;
  launch->model_parallel = o.tp * std::max(1, o.cp) * o.pp;
  launch->dp = ranks / launch->model_parallel;
  launch->micro_batch = o.micro_batch;
  launch->global_batch = o.global_batch > 0 ? o.global_batch : o.micro_batch * std::max(1, o.grad_accum) * launch->dp;
  return supervise(*launch);
}

// This process is a rank (or the only one): train.
int train_here(CLI::App* cmd, const std::shared_ptr<train::TrainOptions>& o, const planner::SearchSpace& fixed) {
  o->resolved_config_toml = resolved_config_toml(
      cmd, {"config", "resume", "resume-strict", "overwrite", "quiet", "debug-stall-rank", "debug-stall-step",
            "debug-nonfinite-step", "debug-nonfinite-unit"});
  InProcess* io = in_process();
  // Before MPI or OpenMP start threads: they inherit the blocked stop signals. A host
  // program's signals stay its own.
  if (io == nullptr) train::install_stop_handlers();
  auto world = command_world();
  Status s = Status::ok();
  const train::Console console = stdio_console();
  if (!o->plan.empty()) {
    if (o->ranks > 0 && o->ranks != world->size())
      s = Status::error("--ranks " + std::to_string(o->ranks) + " but the job has " + std::to_string(world->size()) +
                        " ranks");
    if (s.is_ok()) s = train::choose_layout_on_every_rank(o.get(), *world, fixed, console);
  }
  train::TrainResult result;
  if (s.is_ok()) s = train::run_training(*o, *world, console, &result, io != nullptr ? io->subscriber : nullptr);
  // Stopped between steps by a signal: the shell's code for it, on every rank.
  const int rc = !s.is_ok() ? fail(s) : result.interrupted_by ? 128 + result.interrupted_by : 0;
  end_world(std::move(world));
  return rc;
}

}  // namespace

Command add_train_command(CLI::App& app) {
  auto o = std::make_shared<train::TrainOptions>();
  auto* cmd = app.add_subcommand("train", "Train a GPT-2, Llama or MoE model on a prepared token corpus");
  add_config_option(cmd);
  add_model_flags(cmd, o.get());
  o->data_dir = data_dir() + "/brown";
  cmd->add_option("--data", o->data_dir, "Folder with train.bin and val.bin (from `meshtrain prep`)")
      ->capture_default_str();
  cmd->add_option("--steps", o->steps, "Optimizer steps N")->capture_default_str();
  cmd->add_option("--lr-unit", o->lr_unit,
                  "What the LR schedule counts: steps, or tokens (warmup over --warmup-steps full-length steps' "
                  "tokens, the cosine over the run's tokens; with --curriculum, short steps advance it less)")
      ->capture_default_str();
  cmd->add_option("--curriculum", o->curriculum.kind,
                  "Curriculum learning: none, or seqlen (sequence-length warmup: early steps train on the first "
                  "tokens of each row, lengthening to --seq-len)")
      ->capture_default_str();
  cmd->add_option("--curriculum-start", o->curriculum.start, "seqlen: the first steps' row length")
      ->capture_default_str();
  cmd->add_option("--curriculum-steps", o->curriculum.steps,
                  "seqlen: steps until rows are --seq-len long (linear, root)");
  cmd->add_option("--curriculum-schedule", o->curriculum.schedule,
                  "seqlen: linear, root ((k/N)^(1/r)) or discrete (--curriculum-discrete)")
      ->capture_default_str();
  cmd->add_option("--curriculum-step", o->curriculum.step, "seqlen: lengths are multiples of this")
      ->capture_default_str();
  cmd->add_option("--curriculum-root", o->curriculum.root, "seqlen, root schedule: r")->capture_default_str();
  cmd->add_option("--curriculum-discrete", o->curriculum.discrete,
                  "seqlen, discrete schedule: LENGTH:STEPS pairs, e.g. 64:100,128:200 (64 for the first 100 "
                  "steps, 128 until step 200, then --seq-len)");
  cmd->add_option("--out", o->out_dir,
                  "Run folder: metrics.jsonl, config.toml, config.json, checkpoints/ (default: none)");
  cmd->add_option("--eval-every", o->eval_every, "Validation loss every K steps (0: only at the end)")
      ->capture_default_str();
  cmd->add_option("--eval-batches", o->eval_batches, "Micro-batches of val.bin per evaluation")
      ->capture_default_str();
  cmd->add_option("--save-every", o->save_every, "Checkpoint every K steps (0: only at the end)")
      ->capture_default_str();
  cmd->add_option("--keep-checkpoints", o->keep_checkpoints, "Newest checkpoints kept (0: all)")
      ->capture_default_str();
  cmd->add_flag("--resume", o->resume,
                "Continue from the newest intact checkpoint in --out (a damaged newer one is passed over, and "
                "the resume line says which and why)");
  cmd->add_flag("--resume-strict", o->resume_strict,
                "With --resume: refuse to start when the newest checkpoint is damaged, instead of taking the "
                "newest intact one");
  cmd->add_flag("--overwrite", o->overwrite,
                "Start a new run in an --out that holds another run: its checkpoints, metrics and heartbeats are "
                "deleted once every check has passed (without it, or --resume, such a folder is refused)");
  cmd->add_option("--save-on-exit", o->save_on_exit,
                  "On SIGINT (Ctrl-C) or SIGTERM the run stops after the current step on every rank; it saves a "
                  "checkpoint then on: sigterm (what schedulers send before killing), always, never")
      ->capture_default_str();
  cmd->add_flag("--async-save", o->async_save,
                "Checkpoints (but the last) are copied into memory and written while training goes on; each is "
                "committed at a later step, once every rank's shard is on disk");
  cmd->add_option("--global-batch", o->global_batch,
                  "Rows per optimizer step G for any layout (A = G/(B*dp) is derived); "
                  "default G = B*A*dp");
  cmd->add_option("--tp", o->tp, "Tensor-parallel ranks")->capture_default_str();
  cmd->add_option("--pp", o->pp, "Pipeline-parallel stages")->capture_default_str();
  cmd->add_option("--cp", o->cp,
                  "Context-parallel ranks: each sequence split over them, 2 chunks each, load-balanced for causal "
                  "attention (docs/long_context.md)")
      ->capture_default_str();
  cmd->add_option("--cp-comm", o->cp_comm,
                  "How attention crosses the cp ranks: ring (K/V blocks point to point, overlapped with attention), "
                  "a2a (DeepSpeed-Ulysses: all-to-all trades sequence for heads) or all-gather (Llama 3's: every "
                  "rank gathers the whole sequence's K/V) or hybrid (a2a inside groups of --cp-a2a ranks, ring across them)")
      ->capture_default_str();
  cmd->add_option("--cp-a2a", o->cp_a2a,
                  "With --cp-comm hybrid: ranks in each all-to-all group (consecutive cp ranks, a host's); the ring "
                  "runs over cp / cp-a2a groups")
      ->capture_default_str();
  cmd->add_option("--rank-order", o->rank_order,
                  "Which axis varies fastest over the ranks, fastest first: tp-dp-pp keeps tp groups on one host "
                  "(a hostfile's slots hold consecutive ranks; the default), dp-tp-pp puts dp groups there, ...");
  cmd->add_option("--ep", o->ep,
                  "Expert-parallel ranks (MoE): each MoE layer's experts split over ep of the dp ranks; "
                  "must divide dp and the experts")
      ->capture_default_str();
  cmd->add_option("--expert-tp", o->expert_tp,
                  "The routed experts' tensor parallelism (MoE, --tp > 1): --tp (default) splits each expert "
                  "over the tp ranks like the dense MLP; 1 keeps each whole on every tp rank, which computes "
                  "it on its share of the rows (Megatron's --expert-tensor-parallel-size)");
  cmd->add_option("--dp", o->dp,
                  "Data-parallel ranks (default: world/(tp*pp); from a plain shell, the job "
                  "starts tp*pp*dp ranks itself through mpirun)");
  cmd->add_option("--schedule", o->schedule,
                  "Pipeline schedule: gpipe, 1f1b, interleaved (needs --virtual-stages >= 2), zero-bubble zb-h1 or "
                  "zb-v (two chunks per rank in a V), or 2bw: PipeDream-2BW, 1F1B that runs the next step's first "
                  "micro-batches before the update, computing with the weights before the last update (a one-step "
                  "delayed update, W(t+1) = W(t) - lr*update(grad at W(t-1)); also on one rank, as its reference)")
      ->capture_default_str();
  cmd->add_option("--virtual-stages", o->virtual_stages,
                  "Model chunks per pipeline rank (interleaved schedule)")
      ->capture_default_str();
  cmd->add_option("--stage-layers", o->stage_layers,
                  "Layers per pipeline stage, comma-separated (pp x virtual-stages entries; "
                  "default: balanced by cost, the head counted on the last stage)")
      ->delimiter(',');
  cmd->add_option("--loss-scale", o->loss_scale.initial,
                  "fp16: initial loss scale (dynamic: halved on overflow, doubled after a window)")
      ->capture_default_str();
  cmd->add_option("--loss-scale-window", o->loss_scale.growth_interval,
                  "fp16: good steps in a row before the loss scale grows")
      ->capture_default_str();
  cmd->add_option("--loss-scale-backoff", o->loss_scale.backoff,
                  "fp16: factor applied to the loss scale on overflow")
      ->capture_default_str();
  cmd->add_option("--loss-scale-min", o->loss_scale.min_scale,
                  "fp16: the loss scale's floor; 10 overflowing steps in a row there stop the run")
      ->capture_default_str();
  cmd->add_option("--offload", o->offload,
                  "ZeRO-Infinity: comma list of optimizer=, params=, grads= each nvme (files under "
                  "--offload-dir) or cpu (host memory, the default here). optimizer: the AdamW state "
                  "(and the fp32 master weights of bf16/fp16 runs), streamed in chunks each step; "
                  "params, grads (--zero 3, any --precision): this rank's shards, read ahead of use and written "
                  "as they are reduced");
  cmd->add_option("--offload-dir", o->offload_dir, "Folder for the --offload ...=nvme files");
  cmd->add_option("--offload-read-ahead", o->offload_read_ahead,
                  "params=nvme: parameter shards read ahead of use, in units (blocks)")
      ->capture_default_str();
  cmd->add_flag("--offload-page-cache", o->offload_page_cache,
                "Stream the offloaded state through the page cache (faster when RAM holds the file; "
                "default: O_DIRECT where the file system allows)");
  cmd->add_option("--offload-chunk-mb", o->offload_chunk_mb,
                  "Offload streaming chunk per state array (three chunks rotate: read, update, write)")
      ->capture_default_str();
  cmd->add_option("--memory-budget", o->memory_budget_gb,
                  "GB of tracked memory per rank: when the model state and one micro-batch's "
                  "activations exceed it, the optimizer state goes to files, then (--zero 3) the "
                  "gradient shard, then the parameter shard (needs --offload-dir)");
  cmd->add_option("--trace", o->trace_file,
                  "Write a Chrome trace (Perfetto, chrome://tracing) of every rank's forward, "
                  "backward, optimizer and communication spans to FILE");
  cmd->add_flag("--profile", o->profile,
                "Time every op of the steps after the first (each GEMM site, attention, norms, activations, "
                "cross-entropy, AdamW, conversions, communication waits) and print rank 0's table at the end, "
                "each rate beside the GEMM peak or a STREAM triad measured at the end; metrics.jsonl gets it "
                "as one {\"profile\": ...} record");
  cmd->add_flag("--sp", o->sp,
                "Sequence parallelism: LayerNorms and residuals on 1/tp of the tokens (needs --tp > 1)");
  cmd->add_option("--recompute", o->recompute,
                  "Activation recomputation: none; selective (the attention core is recomputed "
                  "in backward); full (only each block's output is kept)")
      ->capture_default_str();
  cmd->add_option("--recompute-every", o->recompute_every,
                  "Recompute blocks l with l % k == 0 only (the others keep everything)")
      ->capture_default_str();
  cmd->add_flag("--doc-mask", o->doc_mask,
                "Document masks: a packed row's documents (each ended by the end-of-text token) do not "
                "attend to one another, and positions restart at each (docs/long_context.md)");
  cmd->add_option("--doc-separator", o->doc_separator,
                  "--doc-mask: the token id that ends a document (default: the data's tokenizer's "
                  "end-of-text)");
  cmd->add_option("--dropout", o->dropout,
                  "Dropout probability on the embedding and each residual branch (masks from a "
                  "counter-based RNG: the same for every layout)")
      ->capture_default_str();
  cmd->add_option("--zero", o->zero,
                  "ZeRO stage: 0 replicated, 1 optimizer state sharded, 2 + gradients, "
                  "3 + parameters (FSDP)")
      ->capture_default_str();
  cmd->add_option("--zero3-gather", o->zero3_gather,
                  "ZeRO-3 parameter gathers: step (each unit once per step, kept to the step's end: its "
                  "full parameters resident meanwhile), use (at every forward and backward use: only the "
                  "units in use resident), auto (step with --pp > 1, else use)")
      ->check(CLI::IsMember({"auto", "step", "use"}))
      ->capture_default_str();
  cmd->add_option("--bucket-mb", o->bucket_mb, "Gradient all-reduce bucket size (ZeRO 0)")
      ->capture_default_str();
  cmd->add_option("--compress", o->compress,
                  "Gradient compression of the data-parallel reduction: none, powersgd (rank-r "
                  "approximation of each matrix with error feedback; ZeRO 0, fp32), onebit-adam (1-bit Adam: "
                  "after --compress-start plain steps the variance is frozen and the momentum exchanged as "
                  "signs; ZeRO 0-1, fp32)")
      ->capture_default_str();
  cmd->add_option("--compress-start", o->compress_start,
                  "Steps reduced plainly before compression starts (PowerSGD's start_iter, 1-bit Adam's freeze_step)")
      ->capture_default_str();
  cmd->add_option("--powersgd-rank", o->powersgd_rank, "PowerSGD's rank r")->capture_default_str();
  cmd->add_flag("--zero-quantized-weights", o->zero_quantized_weights,
                "ZeRO++ qwZ: ZeRO-3's parameter all-gathers as int8 blocks of 256 with a scale each (1/4 of "
                "fp32's bytes, 1/2 of 16-bit's); the optimizer's weights stay exact");
  cmd->add_flag("--zero-quantized-gradients", o->zero_quantized_gradients,
                "ZeRO++ qgZ: ZeRO 1-3's gradient reduce-scatters as an all-to-all of int8 blocks, summed in "
                "fp32 by each shard's owner");
  auto no_overlap = std::make_shared<bool>(false);
  cmd->add_flag("--no-overlap", *no_overlap,
                "Reduce gradients after backward instead of during it (to measure what overlap hides)");
  cmd->add_option("--comm-timeout", o->comm_timeout,
                  "Seconds before a stuck collective aborts the job, naming it (0: never)")
      ->capture_default_str();
  cmd->add_option("--debug-stall-rank", o->debug_stall_rank,
                  "Testing: this rank stops participating at --debug-stall-step");
  cmd->add_option("--debug-stall-step", o->debug_stall_step, "Testing: see --debug-stall-rank");
  cmd->add_option("--on-nonfinite", o->on_nonfinite,
                  "A step whose loss or gradient is not finite (fp32, bf16): stop before the update, naming "
                  "the step and the units, or skip it (fp16 overflow: the loss scaler skips)")
      ->check(CLI::IsMember({"stop", "skip"}))
      ->capture_default_str();
  cmd->add_option("--max-skipped-steps", o->max_skipped_steps,
                  "--on-nonfinite skip: stop (exit code 1, naming the steps) after this many skipped steps in a row")
      ->capture_default_str();
  cmd->add_option("--debug-nonfinite-step", o->debug_nonfinite_step,
                  "Testing: a NaN in the gradient of --debug-nonfinite-unit at this step");
  cmd->add_option("--debug-nonfinite-unit", o->debug_nonfinite_unit,
                  "Testing: see --debug-nonfinite-step (a whole-model unit: 0 embeddings, then the blocks)");
  cmd->add_flag("--quiet", o->quiet, "No console output except errors");
  cmd->add_option("--plan", o->plan,
                  "auto: the planner chooses tp, pp, dp, zero, micro-batch, schedule, sp and recompute "
                  "(the fastest predicted layout that fits --memory-budget); layout flags given too are kept");
  cmd->add_option("--ranks", o->ranks, "Ranks for --plan auto when started from a plain shell");
  auto launch = std::make_shared<LaunchOptions>();
  cmd->add_option("--hostfile", launch->hostfile,
                  "From a plain shell: start the ranks on the hosts of this Open MPI hostfile (mpirun --hostfile); "
                  "tp neighbours share a host");
  cmd->add_option("--mpirun-args", launch->mpirun_args,
                  "From a plain shell: more mpirun flags, e.g. a launch agent and the network to use "
                  "(scripts/hosts.sh mpirun-args prints those of its hosts)");
  cmd->add_option("--max-restarts", launch->max_restarts,
                  "From a plain shell: after a failure a restart may cure (a rank lost, a link down, a stuck "
                  "collective), start the job again from the newest checkpoint, up to K times (needs --out)")
      ->capture_default_str();
  cmd->add_flag("--elastic", launch->elastic,
                "With --max-restarts and --hostfile: a restart leaves out the failed rank's host and runs on fewer "
                "data-parallel ranks, keeping the global batch (more gradient accumulation), as torchrun's elastic "
                "agent does");
  return {cmd, [cmd, o, no_overlap, launch] {
            o->overlap = !*no_overlap;
            planner::SearchSpace fixed;
            if (!o->plan.empty()) {
              if (o->plan != "auto") return fail(Status::error("--plan must be auto, got '" + o->plan + "'"));
              if (Status s = fixed_layout_flags(cmd, *o, &fixed); !s.is_ok()) return fail(s);
            }
            if (!comm::launched_by_mpi()) {
              int ranks = 0;
              if (Status s = ranks_to_launch(*o, fixed, *launch, &ranks); !s.is_ok()) return fail(s);
              if (ranks > 0) return launch_ranks(*o, ranks, launch.get());
            }
            return train_here(cmd, o, fixed);
          }};
}

}  // namespace meshtrain::cli
