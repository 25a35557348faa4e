#include "checkpoint/llmc.h"

#include <fcntl.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <utility>
#include <vector>

#include "checkpoint/llmc_format.h"
#include "core/file_io.h"

namespace meshtrain::checkpoint {

// llm.c writes native little-endian ints and floats; we move bytes without swapping.
static_assert(std::endian::native == std::endian::little, "llm.c file I/O assumes little-endian");

namespace {

// Closes the descriptor on every return path.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  // Hands the descriptor over so its close() result can be checked.
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

bool same_shape(const model::GptConfig& a, const model::GptConfig& b) {
  return a.layers == b.layers && a.heads == b.heads && a.dim == b.dim &&
         a.max_seq_len == b.max_seq_len && a.vocab == b.vocab;
}

// The file at `path` and its validated header.
Status open_llmc(const std::string& path, std::shared_ptr<const ByteSource>* file, LlmcHeader* header) {
  RETURN_IF_ERROR(open_file_source(path, file));
  return parse_llmc_header(**file, header);
}

Status write_header(int fd, const model::GptConfig& c) {
  int32_t h[kLlmcHeaderInts] = {};
  h[llmc_slot::kMagic] = kLlmcMagic;
  h[llmc_slot::kVersion] = kLlmcVersionFp32;
  h[llmc_slot::kMaxSeqLen] = c.max_seq_len;
  h[llmc_slot::kVocab] = c.vocab;
  h[llmc_slot::kLayers] = c.layers;
  h[llmc_slot::kHeads] = c.heads;
  h[llmc_slot::kChannels] = c.dim;
  h[llmc_slot::kPaddedVocab] = c.padded_vocab();
  return write_all(fd, h, kLlmcHeaderBytes);
}

// Our padding rows are zero by contract; writing zeros explicitly keeps the file's
// contract even if a caller broke ours.
Status write_wte(int fd, const model::Gpt& gpt) {
  const auto& cfg = gpt.config();
  const auto& wte = gpt.layout().wte();
  const size_t used = (size_t)cfg.vocab * cfg.dim;
  RETURN_IF_ERROR(write_all(fd, gpt.params() + wte.offset, used * sizeof(float)));
  const std::vector<float> zeros(wte.numel - used, 0.0f);
  return write_all(fd, zeros.data(), zeros.size() * sizeof(float));
}

Status write_llmc_contents(int fd, const model::Gpt& gpt) {
  RETURN_IF_ERROR(write_header(fd, gpt.config()));
  for (const model::ParamTensor* t : llmc_order(gpt.layout(), gpt.config().layers)) {
    if (t == &gpt.layout().wte()) {
      RETURN_IF_ERROR(write_wte(fd, gpt));
    } else {
      RETURN_IF_ERROR(write_all(fd, gpt.params() + t->offset, t->numel * sizeof(float)));
    }
  }
  if (::fsync(fd) != 0) return Status::error("fsync failed: " + errno_text());
  return Status::ok();
}

}  // namespace

Status export_llmc_model(const model::Gpt& gpt, const std::string& path) {
  if (!gpt.config().is_gpt2())
    return Status::error("llm.c's model file holds GPT-2 models only, and this one is " +
                         model::describe_arch(gpt.config()) + "; export it as Hugging Face (--format hf)");
  const std::string tmp = path + ".tmp";
  Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (fd.get() < 0) return Status::error("writing " + tmp + ": cannot create: " + errno_text());
  Status status = write_llmc_contents(fd.get(), gpt);
  if (::close(fd.release()) != 0 && status.is_ok())
    status = Status::error("close failed: " + errno_text());
  if (status.is_ok() && ::rename(tmp.c_str(), path.c_str()) != 0)
    status = Status::error("rename to " + path + " failed: " + errno_text());
  if (!status.is_ok()) {
    ::unlink(tmp.c_str());
    return status.with_context("writing " + tmp);
  }
  // Makes the rename durable; the file itself is complete either way, so not an error.
  std::string dir = std::filesystem::path(path).parent_path().string();
  (void)fsync_dir(dir.empty() ? "." : dir);
  return Status::ok();
}

Status infer_llmc_config(const std::string& path, model::GptConfig* config) {
  std::shared_ptr<const ByteSource> file;
  LlmcHeader header;
  RETURN_IF_ERROR(open_llmc(path, &file, &header).with_context("llm.c model file " + path));
  *config = header.config;
  return Status::ok();
}

Status load_llmc_model(const std::string& path, model::Gpt* gpt) {
  const std::string ctx = "llm.c model file " + path;
  std::shared_ptr<const ByteSource> file;
  LlmcHeader header;
  RETURN_IF_ERROR(open_llmc(path, &file, &header).with_context(ctx));
  if (!same_shape(header.config, gpt->config()))
    return Status::error(ctx + " holds a model with " + describe_llmc_shape(header.config) +
                         ", but the model to load into has " + describe_llmc_shape(gpt->config()));
  return read_llmc_params(*file, header, gpt->layout(), gpt->params()).with_context(ctx);
}

bool is_llmc_model_file(const std::string& path) {
  int raw = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (raw < 0) return false;
  Fd fd(raw);
  int32_t magic = 0;
  return read_exact(fd.get(), &magic, sizeof(magic)).is_ok() && magic == kLlmcMagic;
}

}  // namespace meshtrain::checkpoint
