#include "checkpoint/llmc.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <utility>
#include <vector>

#include "core/file_io.h"

namespace meshtrain::checkpoint {

// llm.c writes native little-endian ints and floats; we move bytes without swapping.
static_assert(std::endian::native == std::endian::little, "llm.c file I/O assumes little-endian");

namespace {

constexpr size_t kHeaderBytes = kLlmcHeaderInts * sizeof(int32_t);

// Header slots.
enum : int { kMagic, kVersion, kMaxSeqLen, kVocab, kLayers, kHeads, kChannels, kPaddedVocab };

std::string errno_text() { return std::strerror(errno); }

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



std::string describe(const model::GptConfig& c) {
  return "layers=" + std::to_string(c.layers) + " heads=" + std::to_string(c.heads) +
         " dim=" + std::to_string(c.dim) + " max_seq_len=" + std::to_string(c.max_seq_len) +
         " vocab=" + std::to_string(c.vocab);
}

bool same_shape(const model::GptConfig& a, const model::GptConfig& b) {
  return a.layers == b.layers && a.heads == b.heads && a.dim == b.dim &&
         a.max_seq_len == b.max_seq_len && a.vocab == b.vocab;
}

// Parameter tensors in the order llm.c stores them: each kind for all layers. LayerTensor's
// order within a block is llm.c's order of kinds, so the kind loop follows the enum.
std::vector<const model::ParamTensor*> llmc_order(const model::ParamLayout& layout, int layers) {
  std::vector<const model::ParamTensor*> order = {&layout.wte(), &layout.wpe()};
  for (int k = 0; k < model::kNumLayerTensors; k++)
    for (int l = 0; l < layers; l++) order.push_back(&layout.layer(l, (model::LayerTensor)k));
  order.push_back(&layout.lnf_w());
  order.push_back(&layout.lnf_b());
  return order;
}

// Floats the header describes. 128-bit so that absurd header values cannot overflow
// into a size that happens to match the file.
__int128 header_param_count(const model::GptConfig& c, int padded_vocab) {
  const __int128 C = c.dim, L = c.layers;
  const __int128 per_layer = 12 * C * C + 13 * C;
  return (__int128)padded_vocab * C + (__int128)c.max_seq_len * C + L * per_layer + 2 * C;
}

Status check_magic_and_version(const int32_t* h) {
  if (h[kMagic] != kLlmcMagic)
    return Status::error("bad magic " + std::to_string(h[kMagic]) + ", expected " +
                         std::to_string(kLlmcMagic) + " (not an llm.c model file)");
  if (h[kVersion] == kLlmcVersionBf16)
    return Status::error("version 5 (bf16 parameters): bf16 llm.c model files are not supported "
                         "yet; use llm.c's fp32 file (version 3, e.g. gpt2_124M.bin rather than "
                         "gpt2_124M_bf16.bin)");
  if (h[kVersion] != kLlmcVersionFp32)
    return Status::error("unsupported version " + std::to_string(h[kVersion]) +
                         " (only version 3, fp32, is supported)");
  return Status::ok();
}

Status config_from_header(const int32_t* h, model::GptConfig* config, int* padded_vocab) {
  model::GptConfig c;
  c.max_seq_len = h[kMaxSeqLen];
  c.vocab = h[kVocab];
  c.layers = h[kLayers];
  c.heads = h[kHeads];
  c.dim = h[kChannels];
  RETURN_IF_ERROR(model::validate(c).with_context("header"));
  if (h[kPaddedVocab] < c.vocab)
    return Status::error("header: padded_vocab_size " + std::to_string(h[kPaddedVocab]) +
                         " is smaller than vocab_size " + std::to_string(c.vocab));
  *config = c;
  *padded_vocab = h[kPaddedVocab];
  return Status::ok();
}

// Non-negative values only: the header sizes are validated positive before this is used.
std::string wide_to_string(__int128 v) {
  std::string digits;
  do {
    digits.insert(digits.begin(), char('0' + (int)(v % 10)));
    v /= 10;
  } while (v > 0);
  return digits;
}

// An exact size check catches both a cut-off copy and a header that does not describe
// the data, before any weight is read.
Status check_file_size(uint64_t file_size, const model::GptConfig& c, int padded_vocab) {
  const __int128 want = (__int128)kHeaderBytes + 4 * header_param_count(c, padded_vocab);
  const __int128 have = file_size;
  if (have == want) return Status::ok();
  const std::string expect = "the header describes " + wide_to_string(want) +
                             " bytes (" + describe(c) + ", padded_vocab=" +
                             std::to_string(padded_vocab) + ") but the file has " +
                             std::to_string(file_size);
  return Status::error(have < want ? "truncated: " + expect : "trailing data: " + expect);
}

// Reads and validates the header of an open file; leaves the offset at the first weight.
Status read_header(int fd, model::GptConfig* config, int* padded_vocab) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return Status::error("fstat failed: " + errno_text());
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < kHeaderBytes)
    return Status::error("truncated: " + std::to_string(file_size) +
                         " bytes, less than the 1024-byte header");
  int32_t h[kLlmcHeaderInts];
  RETURN_IF_ERROR(read_exact(fd, h, kHeaderBytes));
  RETURN_IF_ERROR(check_magic_and_version(h));
  RETURN_IF_ERROR(config_from_header(h, config, padded_vocab));
  return check_file_size(file_size, *config, *padded_vocab);
}

Status open_for_reading(const std::string& path, int* fd) {
  *fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (*fd < 0) return Status::error("cannot open: " + errno_text());
  return Status::ok();
}

// The token embedding: our first `vocab` rows; the file's extra padding rows are skipped
// and ours are zeroed, so any padded_vocab >= vocab in the file loads.
Status read_wte(int fd, int file_padded_vocab, model::Gpt* gpt) {
  const auto& cfg = gpt->config();
  const auto& wte = gpt->layout().wte();
  const size_t used = (size_t)cfg.vocab * cfg.dim;
  float* dst = gpt->params() + wte.offset;
  RETURN_IF_ERROR(read_exact(fd, dst, used * sizeof(float)));
  const off_t skip = (off_t)(file_padded_vocab - cfg.vocab) * cfg.dim * (off_t)sizeof(float);
  if (skip > 0 && ::lseek(fd, skip, SEEK_CUR) < 0)
    return Status::error("seek failed: " + errno_text());
  std::memset(dst + used, 0, sizeof(float) * (wte.numel - used));
  return Status::ok();
}

Status write_header(int fd, const model::GptConfig& c) {
  int32_t h[kLlmcHeaderInts] = {};
  h[kMagic] = kLlmcMagic;
  h[kVersion] = kLlmcVersionFp32;
  h[kMaxSeqLen] = c.max_seq_len;
  h[kVocab] = c.vocab;
  h[kLayers] = c.layers;
  h[kHeads] = c.heads;
  h[kChannels] = c.dim;
  h[kPaddedVocab] = c.padded_vocab();
  return write_all(fd, h, kHeaderBytes);
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

Status write_contents(int fd, const model::Gpt& gpt) {
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
  const std::string tmp = path + ".tmp";
  Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (fd.get() < 0) return Status::error("writing " + tmp + ": cannot create: " + errno_text());
  Status status = write_contents(fd.get(), gpt);
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
  const std::string ctx = "llm.c model file " + path;
  int raw = -1;
  RETURN_IF_ERROR(open_for_reading(path, &raw).with_context(ctx));
  Fd fd(raw);
  int padded_vocab = 0;
  return read_header(fd.get(), config, &padded_vocab).with_context(ctx);
}

Status load_llmc_model(const std::string& path, model::Gpt* gpt) {
  const std::string ctx = "llm.c model file " + path;
  int raw = -1;
  RETURN_IF_ERROR(open_for_reading(path, &raw).with_context(ctx));
  Fd fd(raw);
  model::GptConfig file_cfg;
  int padded_vocab = 0;
  RETURN_IF_ERROR(read_header(fd.get(), &file_cfg, &padded_vocab).with_context(ctx));
  if (!same_shape(file_cfg, gpt->config()))
    return Status::error(ctx + " holds a model with " + describe(file_cfg) +
                         ", but the model to load into has " + describe(gpt->config()));
  for (const model::ParamTensor* t : llmc_order(gpt->layout(), file_cfg.layers)) {
    if (t == &gpt->layout().wte()) {
      RETURN_IF_ERROR(read_wte(fd.get(), padded_vocab, gpt).with_context(ctx));
    } else {
      RETURN_IF_ERROR(read_exact(fd.get(), gpt->params() + t->offset, t->numel * sizeof(float))
                          .with_context(ctx + ": tensor " + t->name));
    }
  }
  return Status::ok();
}

bool is_llmc_model_file(const std::string& path) {
  int raw = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (raw < 0) return false;
  Fd fd(raw);
  int32_t magic = 0;
  return read_exact(fd.get(), &magic, sizeof(magic)).is_ok() && magic == kLlmcMagic;
}

}  // namespace meshtrain::checkpoint
