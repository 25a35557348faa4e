// How a run ends, in words for its user: stopped by a signal between steps, given up on
// after too many skipped steps, or finished. Each says where the newest checkpoint is and
// the command that continues the run.
#include <signal.h>

#include <cstdio>
#include <filesystem>

#include "checkpoint/checkpoint.h"
#include "train/console.h"
#include "train/interrupt.h"
#include "train/run.h"

namespace meshtrain::train {

namespace fs = std::filesystem;

namespace {

std::string newest_checkpoint_text(const std::string& out_dir) {
  std::string newest;
  if (out_dir.empty()) return "no run folder (--out), so no checkpoint";
  if (!checkpoint::find_latest_checkpoint(out_dir, &newest).is_ok()) return "no checkpoint saved";
  return "newest checkpoint " + newest;
}

bool saves_on(const Run& run, int sig) {
  const SaveOnExit when = run.policy.save_on_exit;
  return !run.opt.out_dir.empty() && (when == SaveOnExit::kAlways || (when == SaveOnExit::kSigterm && sig == SIGTERM));
}

}  // namespace

std::string continue_command(const TrainOptions& o, int64_t steps) {
  const fs::path config = fs::path(o.out_dir) / "config.toml";
  std::error_code ec;
  std::string cmd = "meshtrain train ";
  cmd += fs::exists(config, ec) ? "--config " + config.string() : "(the same flags) --out " + o.out_dir;
  cmd += " --resume";
  if (steps != o.steps) cmd += " --steps " + std::to_string(steps);
  return cmd;
}

Status stop_on_signal(Run& run, comm::Group& world, int64_t k, int64_t saved_step, int sig, const Console& console) {
  const TrainOptions& o = run.opt;
  RETURN_IF_ERROR(finish_run_save(run, world, /*wait=*/true));
  const bool save = saves_on(run, sig) && k > saved_step;
  if (save) RETURN_IF_ERROR(save_run_checkpoint(run, world, k));
  if (!run.is_main) return Status::ok();
  std::string lost;
  if (k > saved_step && !save)
    lost = "; steps " + std::to_string(saved_step + 1) + "-" + std::to_string(k) +
           (o.out_dir.empty() ? " are not saved (no --out)"
                              : " are not saved (--save-on-exit always saves them on " +
                                    std::string(stop_signal_name(sig)) + ")");
  console.err(formatted("meshtrain: interrupted by %s at step %lld%s; %s%s\n", stop_signal_name(sig), (long long)k,
                        save ? " (saved)" : "", newest_checkpoint_text(o.out_dir).c_str(), lost.c_str()));
  if (!o.out_dir.empty() && (save || saved_step > 0))
    console.err("meshtrain: continue with: " + continue_command(o, o.steps) + "\n");
  return Status::ok();
}

Status too_many_skips(const Run& run, int64_t step, int64_t in_row, const std::string& last_cause) {
  const TrainOptions& o = run.opt;
  std::string newest;
  const std::string where = !o.out_dir.empty() && checkpoint::find_latest_checkpoint(o.out_dir, &newest).is_ok()
                                ? "; the newest checkpoint is " + newest
                                : "";
  return Status::error("steps " + std::to_string(step - in_row + 1) + "-" + std::to_string(step) + " were all skipped (" +
                       std::to_string(in_row) + " in a row, --max-skipped-steps " +
                       std::to_string(o.max_skipped_steps) + "): the run has diverged, not spiked; step " +
                       std::to_string(step) + ": " + last_cause + where + " (try a lower --lr)");
}

std::vector<std::string> run_end_lines(const Run& run, const TrainResult& result, double wall_s) {
  const TrainOptions& o = run.opt;
  if (!run.is_main || result.losses.empty()) return {};
  char line[256];
  std::snprintf(line, sizeof line, "done: steps %lld-%d in %.1f s | final loss %.4f", (long long)run.start_step + 1,
                o.steps, wall_s, (double)result.losses.back());
  std::string text = line;
  if (result.final_val_loss >= 0) {
    std::snprintf(line, sizeof line, " | val loss %.4f", (double)result.final_val_loss);
    text += line;
  }
  std::vector<std::string> lines = {text};
  if (!o.out_dir.empty()) {
    std::string newest;
    if (checkpoint::find_latest_checkpoint(o.out_dir, &newest).is_ok()) lines.push_back("checkpoint: " + newest);
    lines.push_back("continue with: " + continue_command(o, 2 * (int64_t)o.steps));
    lines.push_back("use it: meshtrain generate --checkpoint " + o.out_dir + " --prompt \"...\"; meshtrain eval --checkpoint " +
                    o.out_dir);
  }
  return lines;
}

}  // namespace meshtrain::train
