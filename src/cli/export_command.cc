#include <cstdio>
#include <filesystem>

#include "checkpoint/hf_gpt2.h"
#include "checkpoint/llmc.h"
#include "checkpoint/model_file.h"
#include "checkpoint/safetensors_model.h"
#include "cli/commands.h"
#include "data/tokenizer_files.h"
#include "train/options.h"

namespace meshtrain::cli {

namespace {

namespace fs = std::filesystem;

struct ExportOptions {
  std::string in, out, format = "hf", tokenizer;
  double max_shard_gb = checkpoint::kHfMaxShardBytes / 1e9;
  // --init: the seeded initial weights of the model the shape flags describe (train's own
  // initialisation for --seed), instead of a checkpoint's.
  bool init = false;
  train::TrainOptions shape;
};

// Exactly one source, and a folder for the output: its parents are made here, so that
// "--out new/dir/model.bin" works as a user expects.
Status check_export(const ExportOptions& o) {
  if (o.init == !o.in.empty())
    return Status::error(o.init ? "--init exports a new model's initial weights: drop --checkpoint"
                                : "give --checkpoint (a run, checkpoint or model file) or --init with the model flags");
  const fs::path parent = fs::path(o.out).parent_path();
  std::error_code ec;
  if (!parent.empty()) fs::create_directories(parent, ec);
  if (ec) return Status::error("cannot create the folder of --out " + o.out + ": " + ec.message());
  return Status::ok();
}

// The model to export: the checkpoint's, or a new one at its seeded initialisation (the
// weights `train --seed N` starts from, at any layout).
Status source_model(const ExportOptions& o, std::unique_ptr<model::Gpt>* gpt, std::string* source) {
  if (!o.init) {
    RETURN_IF_ERROR(checkpoint::resolve_model_path(o.in, source));
    return checkpoint::open_model_file(o.in, 0, gpt);
  }
  model::GptConfig config;
  int seq_len = 0;
  RETURN_IF_ERROR(train::resolve_model(o.shape, &config, &seq_len));
  *gpt = std::make_unique<model::Gpt>(config, model::Gpt::LocalState::kParamsOnly);
  (*gpt)->init_weights(o.shape.seed);
  *source = "the initial weights of --model " + o.shape.model_preset + " (seed " + std::to_string(o.shape.seed) + ")";
  return Status::ok();
}

// The tokenizer travels with the weights where the format has a place for it: into an HF
// folder as the files from_pretrained reads (GPT-2's as vocab.json + merges.txt, others as
// their own tokenizer.json, tokenizer.model, ...), next to an llm.c model as
// <stem>_tokenizer.bin where llm.c's table can hold it (GPT-2-like byte-level BPE; else a
// line says why not). A bare .safetensors file has none. A model with no tokenizer to be
// found exports its weights alone, and says so.
Status export_tokenizer(const ExportOptions& o, const std::string& source, bool hf_folder) {
  if (o.format == "hf" && !hf_folder) return Status::ok();
  std::string where;
  if (Status found = find_tokenizer(source, o.tokenizer, &where); !found.is_ok()) {
    if (!o.tokenizer.empty()) return found;
    std::printf("export: no tokenizer found for %s; only the weights were written (--tokenizer adds one)\n",
                source.c_str());
    return Status::ok();
  }
  std::unique_ptr<data::Tokenizer> tok;
  RETURN_IF_ERROR(data::load_tokenizer(where, &tok));
  if (hf_folder) {
    std::vector<std::string> written;
    RETURN_IF_ERROR(data::write_hf_tokenizer(*tok, o.out, &written));
    std::string names;
    for (const std::string& n : written) names += (names.empty() ? "" : ",") + n;
    std::printf("export: tokenizer %s -> %s/%s%s%s\n", where.c_str(), o.out.c_str(), written.size() > 1 ? "{" : "",
                names.c_str(), written.size() > 1 ? "}" : "");
    return Status::ok();
  }
  if (const std::string why = data::llmc_tokenizer_unsupported(*tok); !why.empty()) {
    std::printf("export: no llm.c tokenizer file for %s (%s): %s; only the weights were written\n",
                tok->info().name.c_str(), tok->info().format.c_str(), why.c_str());
    return Status::ok();
  }
  const fs::path out(o.out);
  const std::string path = (out.parent_path() / (out.stem().string() + "_tokenizer.bin")).string();
  RETURN_IF_ERROR(data::write_llmc_tokenizer(*tok, path));
  std::printf("export: tokenizer %s -> %s (llm.c)\n", where.c_str(), path.c_str());
  return Status::ok();
}

Status run_export(const ExportOptions& o) {
  RETURN_IF_ERROR(check_export(o));
  std::string source;
  std::unique_ptr<model::Gpt> gpt;
  RETURN_IF_ERROR(source_model(o, &gpt, &source));
  const bool hf_folder = o.format == "hf" && !o.out.ends_with(".safetensors");
  if (o.format == "llmc")
    RETURN_IF_ERROR(checkpoint::export_llmc_model(*gpt, o.out));
  else if (hf_folder)
    RETURN_IF_ERROR(checkpoint::export_hf_folder(*gpt, o.out, o.max_shard_gb * 1e9));
  else
    RETURN_IF_ERROR(checkpoint::export_hf_safetensors(*gpt, o.out));
  const bool sharded = hf_folder && fs::exists(fs::path(o.out) / checkpoint::kHfIndexFile);
  std::printf("export: %s -> %s (%s%s)\n", source.c_str(), o.out.c_str(), o.format.c_str(),
              !hf_folder ? ""
              : sharded  ? " folder: model-*-of-*.safetensors, model.safetensors.index.json, config.json"
                         : " folder: model.safetensors, config.json");
  // A new model has no tokenizer of its own: only --tokenizer adds one.
  if (o.init && o.tokenizer.empty()) return Status::ok();
  return export_tokenizer(o, o.in, hf_folder);
}

}  // namespace

Command add_export_command(CLI::App& app) {
  auto o = std::make_shared<ExportOptions>();
  auto* cmd = app.add_subcommand(
      "export",
      "Write a model as a Hugging Face folder or .safetensors (GPT-2, Llama, MoE), or a GPT-2 as an llm.c .bin (fp32)");
  cmd->add_option("--checkpoint", o->in,
                  "Run folder (newest checkpoint), checkpoint folder, HF folder, .safetensors or llm.c .bin");
  cmd->add_flag("--init", o->init,
                "Instead of --checkpoint: the initial weights train --seed starts from, for the model that "
                "the flags below describe (--model, --layers, --dim, --seq-len, --arch, ... as train's)");
  add_shape_flags(cmd, &o->shape);
  cmd->add_option("--seed", o->shape.seed, "--init: the seed (as train's --seed)")->capture_default_str();
  cmd->add_option("--out", o->out,
                  "Output: for hf, a folder (model.safetensors, config.json and the tokenizer's files: vocab.json "
                  "+ merges.txt for GPT-2's, tokenizer.json or tokenizer.model for others) or a "
                  "file ending in .safetensors (weights only); for llmc, the model .bin (the tokenizer goes "
                  "next to it as <stem>_tokenizer.bin)")
      ->required();
  cmd->add_option("--format", o->format, "hf or llmc (llm.c model .bin, version 3)")
      ->check(CLI::IsMember({"hf", "llmc"}))
      ->capture_default_str();
  cmd->add_option("--max-shard-gb", o->max_shard_gb,
                  "hf folder: weights past this size (decimal GB) go into shards model-0000N-of-0000M.safetensors "
                  "with model.safetensors.index.json, as Hugging Face's save_pretrained writes them")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--tokenizer", o->tokenizer,
                  "Tokenizer folder or file: tokenizer.json, tokenizer.model (SentencePiece), *.tiktoken, "
                  "encoder.json + vocab.bpe (default: the run's tokenizer/ copy, then its data folder's)");
  return {cmd, [o] {
            Status s = run_export(*o);
            return s.is_ok() ? 0 : fail(s);
          }};
}

}  // namespace meshtrain::cli
