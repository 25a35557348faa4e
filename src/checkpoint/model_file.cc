#include "checkpoint/model_file.h"

#include <cstdio>
#include <filesystem>
#include <map>
#include <mutex>

#include "checkpoint/checkpoint.h"
#include "checkpoint/hf_gpt2.h"
#include "checkpoint/hf_gpt2_config.h"
#include "checkpoint/llmc.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/safetensors_model.h"
#include "parallel/shard_layout.h"

namespace meshtrain::checkpoint {

namespace fs = std::filesystem;

namespace {

enum class Kind { kCheckpointDir, kLlmc, kSafetensors };

// A run folder's newest checkpoint whose index, shard sizes and checksums hold: a damaged
// newer one is passed over, with a note on stderr naming it and why. Remembered per run
// folder: a command asks several times (the shape, then the weights), and reads it once.
Status newest_intact_checkpoint(const std::string& run_dir, std::string* resolved) {
  static std::mutex mu;
  static std::map<std::string, std::string> verified;
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = verified.find(run_dir); it != verified.end()) {
    *resolved = it->second;
    return Status::ok();
  }
  std::string passed_over;
  for (const std::string& candidate : list_checkpoints(run_dir)) {
    if (Status s = verify_checkpoint(candidate); !s.is_ok()) {
      passed_over += (passed_over.empty() ? "" : "; ") + fs::path(candidate).filename().string() + " is damaged (" +
                     s.message() + ")";
      continue;
    }
    if (!passed_over.empty())
      std::fprintf(stderr, "meshtrain: note: using %s, the newest intact checkpoint of %s: %s\n", candidate.c_str(),
                   run_dir.c_str(), passed_over.c_str());
    verified[run_dir] = *resolved = candidate;
    return Status::ok();
  }
  return Status::error("no intact checkpoint found under " + (fs::path(run_dir) / "checkpoints").string() +
                       (passed_over.empty() ? "" : " (" + passed_over + ")"));
}

// Resolves a run folder to its newest checkpoint folder, and a Hugging Face model folder
// (no index.json: model.safetensors, or shards named by model.safetensors.index.json) to
// its weights file or its shards' index.
Status classify(const std::string& path, Kind* kind, std::string* resolved) {
  std::error_code ec;
  *resolved = path;
  if (fs::is_directory(path, ec) && !fs::exists(fs::path(path) / "index.json", ec)) {
    for (const char* weights : {kHfIndexFile, kHfWeightsFile}) {
      if (!fs::is_regular_file(fs::path(path) / weights, ec)) continue;
      *kind = Kind::kSafetensors;
      *resolved = (fs::path(path) / weights).string();
      return Status::ok();
    }
  }
  if (fs::is_directory(path, ec)) {
    *kind = Kind::kCheckpointDir;
    if (!fs::exists(fs::path(path) / "index.json")) return newest_intact_checkpoint(path, resolved);
    return Status::ok();
  }
  if (!fs::exists(path, ec))
    return Status::error("no checkpoint found at " + path +
                         " (not a run folder, checkpoint folder or model file)");
  *kind = is_llmc_model_file(path) ? Kind::kLlmc : Kind::kSafetensors;
  return Status::ok();
}

Status check_heads(const std::string& path, int heads_hint, int heads) {
  if (heads_hint > 0 && heads_hint != heads)
    return Status::error(path + " has " + std::to_string(heads) + " heads, but --heads " +
                         std::to_string(heads_hint) + " was given");
  return Status::ok();
}

}  // namespace

Status resolve_model_path(const std::string& path, std::string* resolved) {
  Kind kind;
  return classify(path, &kind, resolved);
}

Status model_file_config(const std::string& path, int heads_hint, model::GptConfig* config) {
  Kind kind;
  std::string resolved;
  RETURN_IF_ERROR(classify(path, &kind, &resolved));
  switch (kind) {
    case Kind::kCheckpointDir: {
      nlohmann::json index;
      RETURN_IF_ERROR(read_checkpoint_index(resolved, &index));
      RETURN_IF_ERROR(checkpoint_model_config(index, config));
      return check_heads(resolved, heads_hint, config->heads);
    }
    case Kind::kLlmc:
      RETURN_IF_ERROR(infer_llmc_config(resolved, config));
      return check_heads(resolved, heads_hint, config->heads);
    case Kind::kSafetensors: {
      // A Llama folder: its config.json is the model; the tensors must be that model's.
      bool is_llama = false;
      if (resolved != path) RETURN_IF_ERROR(read_hf_llama_config(path, config, &is_llama));
      if (is_llama) {
        RETURN_IF_ERROR(check_heads(path, heads_hint, config->heads));
        SafetensorsModel f;
        RETURN_IF_ERROR(SafetensorsModel::open(resolved, &f));
        return check_hf_tensors(f, model::ParamLayout(*config), config->vocab);
      }
      // A folder's config.json names the heads (a bare file's metadata may not).
      int folder_heads = 0;
      if (resolved != path) RETURN_IF_ERROR(hf_folder_heads(path, &folder_heads));
      if (heads_hint > 0 && folder_heads > 0) RETURN_IF_ERROR(check_heads(path, heads_hint, folder_heads));
      return infer_hf_config(resolved, heads_hint > 0 ? heads_hint : folder_heads, config);
    }
  }
  return Status::error("unreachable");
}

Status load_model_file(const std::string& path, model::Gpt* gpt) {
  Kind kind;
  std::string resolved;
  RETURN_IF_ERROR(classify(path, &kind, &resolved));
  switch (kind) {
    case Kind::kCheckpointDir: {
      int64_t step = 0;
      return load_checkpoint(resolved, gpt, nullptr, nullptr, &step);
    }
    case Kind::kLlmc:
      return load_llmc_model(resolved, gpt);
    case Kind::kSafetensors:
      return load_hf_safetensors(resolved, gpt);
  }
  return Status::error("unreachable");
}

Status open_model_file(const std::string& path, int heads_hint, std::unique_ptr<model::Gpt>* out,
                       model::Gpt::LocalState local) {
  model::GptConfig config;
  RETURN_IF_ERROR(model_file_config(path, heads_hint, &config));
  auto gpt = std::make_unique<model::Gpt>(config, local);
  RETURN_IF_ERROR(load_model_file(path, gpt.get()));
  *out = std::move(gpt);
  return Status::ok();
}

Status stream_model_weights(const std::string& path, const model::GptConfig& config,
                            const std::function<Status(size_t at, size_t n, const float* values)>& write) {
  Kind kind;
  std::string resolved;
  RETURN_IF_ERROR(classify(path, &kind, &resolved));
  if (kind != Kind::kCheckpointDir)
    return Status::error("streamed weights are read from a checkpoint folder or a run, and " + path +
                         " is a single weights file: train from it (--init-from) for a checkpoint");
  const model::ParamLayout whole(config);
  const parallel::ShardLayout shards(whole, 1, 0);
  Status failed = Status::ok();
  RankState state;
  state.params_only = true;
  state.write = [&](int section, size_t at, size_t n, const float* values) {
    if (section == 0 && failed.is_ok()) failed = write(at, n, values);
  };
  int64_t step = 0;
  RETURN_IF_ERROR(load_checkpoint(resolved, whole, config, shards, state, &step));
  return failed;
}

}  // namespace meshtrain::checkpoint
