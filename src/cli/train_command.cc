#include "cli/commands.h"
#include "cli/config_file.h"
#include "train/trainer.h"

namespace meshtrain::cli {

Command add_train_command(CLI::App& app) {
  auto o = std::make_shared<train::TrainOptions>();
  auto* cmd = app.add_subcommand("train", "Train a GPT-2 model on a prepared token corpus");
  add_config_option(cmd);
  add_model_flags(cmd, o.get());
  o->data_dir = data_dir() + "/brown";
  cmd->add_option("--data", o->data_dir, "Folder with train.bin and val.bin (from `meshtrain prep`)")
      ->capture_default_str();
  cmd->add_option("--steps", o->steps, "Optimizer steps N")->capture_default_str();
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
  cmd->add_flag("--resume", o->resume, "Continue from the newest checkpoint in --out");
  cmd->add_flag("--quiet", o->quiet, "No console output except errors");
  return {cmd, [cmd, o] {
            o->resolved_config_toml = resolved_config_toml(cmd, {"config", "resume", "quiet"});
            Status s = train::run_training(*o);
            return s.is_ok() ? 0 : fail(s);
          }};
}

}  // namespace meshtrain::cli
