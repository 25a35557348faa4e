#include <omp.h>

#include <cmath>
#include <cstdio>
#include <filesystem>

#include "checkpoint/model_file.h"
#include "cli/commands.h"
#include "cli/config_file.h"
#include "data/tokenizer_files.h"
#include "data/training_data.h"
#include "train/trainer.h"

namespace meshtrain::cli {

namespace {

namespace fs = std::filesystem;

// The data folder to evaluate on: --data, else the one the run recorded. Where both the run
// and the data carry a tokenizer copy they must be the same tokenizer: a loss over tokens
// of another vocabulary would be a number without a meaning.
Status eval_data_dir(const std::string& model, const std::string& flag, std::string* dir) {
  *dir = flag.empty() ? run_data_dir(model) : flag;
  if (dir->empty()) *dir = data_dir() + "/brown";  // a model file: the corpus setup.sh prepares
  std::string run_tokenizer;
  if (!find_tokenizer(model, "", &run_tokenizer).is_ok()) return Status::ok();
  const std::string data_tokenizer = (fs::path(*dir) / data::kTokenizerFolder).string();
  if (!data::has_tokenizer_copy(run_tokenizer) || !data::has_tokenizer_copy(data_tokenizer)) return Status::ok();
  std::string a, b;
  RETURN_IF_ERROR(data::verify_tokenizer_copy(run_tokenizer, &a));
  RETURN_IF_ERROR(data::verify_tokenizer_copy(data_tokenizer, &b));
  if (a != b)
    return Status::error(*dir + " was tokenized with another tokenizer than " + model + " was trained with (" +
                         data_tokenizer + " differs from " + run_tokenizer + ")");
  return Status::ok();
}

}  // namespace

Command add_eval_command(CLI::App& app) {
  struct Options {
    std::string model, data, split = "val";  // data "": the folder the run trained on
    int batches = 8, micro_batch = 4, seq_len = 0, threads = 0;
  };
  auto o = std::make_shared<Options>();
  auto* cmd = app.add_subcommand("eval", "Loss and perplexity of a model on val.bin (or train.bin)");
  add_config_option(cmd);
  cmd->add_option("--checkpoint", o->model,
                  "Run folder, checkpoint folder, .safetensors or llm.c .bin")->required();
  cmd->add_option("--data", o->data,
                  "A dataset folder from prep (or llm.c shards, or train.bin / val.bin; default: the run's own data folder, from its config.json)");
  cmd->add_option("--split", o->split, "val or train")->check(CLI::IsMember({"val", "train"}))
      ->capture_default_str();
  cmd->add_option("--batches", o->batches, "Micro-batches to evaluate")->capture_default_str();
  cmd->add_option("--micro-batch", o->micro_batch, "Rows per micro-batch")->capture_default_str();
  cmd->add_option("--seq-len", o->seq_len, "Sequence length (default: the model's positions)");
  cmd->add_option("--threads", o->threads, "OpenMP threads (0 = all cores)");
  return {cmd, [o] {
            if (o->batches < 1 || o->micro_batch < 1)
              return fail(Status::error("--batches and --micro-batch must be >= 1"));
            if (o->threads > 0) omp_set_num_threads(o->threads);
            std::unique_ptr<model::Gpt> gpt;
            Status s = checkpoint::open_model_file(o->model, 0, &gpt);
            if (!s.is_ok()) return fail(s);
            const int T = o->seq_len > 0 ? o->seq_len : gpt->config().max_seq_len;
            if (T > gpt->config().max_seq_len)
              return fail(Status::error("--seq-len " + std::to_string(T) + " exceeds the model's " +
                                        std::to_string(gpt->config().max_seq_len) + " positions"));
            std::string data_dir_used;
            s = eval_data_dir(o->model, o->data, &data_dir_used);
            if (!s.is_ok()) return fail(s);
            data::TrainingData dataset;
            s = data::open_training_data(data_dir_used, &dataset);
            if (s.is_ok() && o->split == "val" && !dataset.has_val)
              s = Status::error(data_dir_used + " has no val split (evaluate on --split train)");
            const data::TokenLoader& data = o->split == "val" ? dataset.val : dataset.train;
            if (s.is_ok()) s = data.check(o->micro_batch, T, gpt->config().vocab);
            if (!s.is_ok()) return fail(s);
            // What was read: the split's one file, or its shards.
            const auto& shards = data.streams()[0].shards();
            const std::string path =
                data.is_mixture() ? data.path() + " (" + o->split + ")"
                : shards.size() == 1 ? (std::filesystem::path(data_dir_used) / shards[0].file).string()
                                     : data_dir_used + " (" + o->split + ", " + std::to_string(shards.size()) + " shards)";
            float loss = train::evaluate_loss(*gpt, data, o->micro_batch, T, o->batches);
            const int64_t used = std::min<int64_t>(o->batches, data.windows(o->micro_batch, T));
            std::printf("%s loss %.4f | perplexity %.2f | %lld tokens of %s\n", o->split.c_str(),
                        loss, std::exp(loss), (long long)used * o->micro_batch * T, path.c_str());
            return 0;
          }};
}

}  // namespace meshtrain::cli
