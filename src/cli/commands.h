// Each subcommand registers its flags on the CLI11 app and returns the action to run when
// it was the one parsed. Option values live in the action's closure.
#pragma once
#include <CLI/CLI.hpp>
#include <functional>
#include <memory>
#include <string>

#include "comm/group.h"
#include "core/status.h"
#include "data/tokenizer.h"
#include "train/console.h"
#include "train/options.h"

namespace meshtrain::cli {

struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run;  // exit code
};

// Where setup.sh puts the data packages, and where prep writes the Brown corpus.
std::string data_dir();
std::string default_tokenizer_dir();

// The tokenizer (a folder or a file, anything data::load_tokenizer reads) for a model given
// as `model_path` (a run folder, a checkpoint in one, or a file): `flag` when the user gave
// --tokenizer; else a Hugging Face model folder's own tokenizer files, the run's own copy
// (<run>/tokenizer), the copy in the data folder its config.json records, or the data
// packages setup.sh installed beside this build, in that order. A copy found or given must
// still match its manifest.
Status find_tokenizer(const std::string& model_path, const std::string& flag, std::string* path);
// find_tokenizer's tokenizer, loaded.
Status load_model_tokenizer(const std::string& model_path, const std::string& flag,
                            std::unique_ptr<data::Tokenizer>* tokenizer);
// A model with fewer embedding rows than the tokenizer has ids cannot read or write all of
// its tokens: an error naming both numbers.
Status check_tokenizer_fits_model(const data::Tokenizer& tokenizer, int model_vocab);
// The data folder a run recorded in its config.json ("" when the path is not a run).
std::string run_data_dir(const std::string& model_path);

// The engine's console (train/console.h) over this process's stdout and stderr.
train::Console stdio_console();
// Prints "meshtrain: error: ..." and returns exit code 1.
int fail(const Status& status);
// Decoding (generate, serve) runs without context parallelism: a KV cache grows one token at a
// time, with nothing to split. An error for `command` unless cp is 1.
Status decode_without_cp(const char* command, int cp);
// A command on `ranks` ranks: run by this process under mpirun (supervise, one OpenMP thread
// count `threads` per rank, 0: cores / ranks) when it is not one of them yet and ranks > 1;
// else fn on this rank's world, whose error is printed, then MPI finalized. The exit code.
int run_on_ranks(int ranks, int threads, const std::function<Status(comm::Group&)>& fn);

// Model shape, batch, optimizer and machine flags shared by train and bench step.
void add_model_flags(CLI::App* app, train::TrainOptions* options);
// The model's preset, architecture and shape flags alone (part of add_model_flags; export
// --init describes its model with them).
void add_shape_flags(CLI::App* app, train::TrainOptions* options);

Command add_prep_command(CLI::App& app);
Command add_tokenize_command(CLI::App& app);
Command add_train_command(CLI::App& app);
Command add_eval_command(CLI::App& app);
Command add_generate_command(CLI::App& app);
Command add_serve_command(CLI::App& app);
Command add_export_command(CLI::App& app);
Command add_bench_command(CLI::App& app);
Command add_plot_command(CLI::App& app);
Command add_timeline_command(CLI::App& app);
Command add_plan_command(CLI::App& app);

}  // namespace meshtrain::cli
