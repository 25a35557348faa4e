#include <cstdio>

#include "checkpoint/hf_gpt2.h"
#include "checkpoint/llmc.h"
#include "checkpoint/model_file.h"
#include "cli/commands.h"

namespace meshtrain::cli {

Command add_export_command(CLI::App& app) {
  auto in = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  auto format = std::make_shared<std::string>("hf");
  auto* cmd = app.add_subcommand(
      "export", "Write a model as Hugging Face GPT-2 .safetensors or an llm.c .bin (fp32)");
  cmd->add_option("--checkpoint", *in,
                  "Run folder (newest checkpoint), checkpoint folder, .safetensors or llm.c .bin")
      ->required();
  cmd->add_option("--out", *out, "Output file")->required();
  cmd->add_option("--format", *format, "hf (.safetensors) or llmc (llm.c model .bin, version 3)")
      ->check(CLI::IsMember({"hf", "llmc"}))
      ->capture_default_str();
  return {cmd, [=] {
            std::unique_ptr<model::Gpt> gpt;
            std::string source;
            Status s = checkpoint::resolve_model_path(*in, &source);
            if (s.is_ok()) s = checkpoint::open_model_file(source, 0, &gpt);
            if (s.is_ok())
              s = *format == "llmc" ? checkpoint::export_llmc_model(*gpt, *out)
                                    : checkpoint::export_hf_safetensors(*gpt, *out);
            if (!s.is_ok()) return fail(s);
            std::printf("export: %s -> %s (%s)\n", source.c_str(), out->c_str(), format->c_str());
            return 0;
          }};
}

}  // namespace meshtrain::cli
