#include "checkpoint/llmc_format.h"

#include <bit>
#include <cstdint>
#include <cstring>

#include "core/check.h"

namespace meshtrain::checkpoint {

// llm.c writes native little-endian ints and floats; we move bytes without swapping.
static_assert(std::endian::native == std::endian::little, "llm.c file I/O assumes little-endian");

namespace {

// Floats the header describes. 128-bit so that absurd header values cannot overflow
// into a size that happens to match the file.
__int128 header_param_count(const model::GptConfig& c, int padded_vocab) {
  const __int128 C = c.dim, L = c.layers;
  const __int128 per_layer = 12 * C * C + 13 * C;
  return (__int128)padded_vocab * C + (__int128)c.max_seq_len * C + L * per_layer + 2 * C;
}

Status check_magic_and_version(const int32_t* h) {
  if (h[llmc_slot::kMagic] != kLlmcMagic)
    return Status::error("bad magic " + std::to_string(h[llmc_slot::kMagic]) + ", expected " +
                         std::to_string(kLlmcMagic) + " (not an llm.c model file)");
  if (h[llmc_slot::kVersion] == kLlmcVersionBf16)
    return Status::error("version 5 (bf16 parameters): bf16 llm.c model files are not supported "
                         "yet; use llm.c's fp32 file (version 3, e.g. gpt2_124M.bin rather than "
                         "gpt2_124M_bf16.bin)");
  if (h[llmc_slot::kVersion] != kLlmcVersionFp32)
    return Status::error("unsupported version " + std::to_string(h[llmc_slot::kVersion]) +
                         " (only version 3, fp32, is supported)");
  return Status::ok();
}

Status config_from_header(const int32_t* h, LlmcHeader* out) {
  model::GptConfig c;
  c.max_seq_len = h[llmc_slot::kMaxSeqLen];
  c.vocab = h[llmc_slot::kVocab];
  c.layers = h[llmc_slot::kLayers];
  c.heads = h[llmc_slot::kHeads];
  c.dim = h[llmc_slot::kChannels];
  RETURN_IF_ERROR(model::validate(c).with_context("header"));
  if (h[llmc_slot::kPaddedVocab] < c.vocab)
    return Status::error("header: padded_vocab_size " + std::to_string(h[llmc_slot::kPaddedVocab]) +
                         " is smaller than vocab_size " + std::to_string(c.vocab));
  out->config = c;
  out->padded_vocab = h[llmc_slot::kPaddedVocab];
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
Status check_file_size(uint64_t file_size, const LlmcHeader& h) {
  const __int128 want = (__int128)kLlmcHeaderBytes + 4 * header_param_count(h.config, h.padded_vocab);
  const __int128 have = file_size;
  if (have == want) return Status::ok();
  const std::string expect = "the header describes " + wide_to_string(want) + " bytes (" + describe_llmc_shape(h.config) +
                             ", padded_vocab=" + std::to_string(h.padded_vocab) + ") but the file has " +
                             std::to_string(file_size);
  return Status::error(have < want ? "truncated: " + expect : "trailing data: " + expect);
}

}  // namespace

std::string describe_llmc_shape(const model::GptConfig& c) {
  return "layers=" + std::to_string(c.layers) + " heads=" + std::to_string(c.heads) +
         " dim=" + std::to_string(c.dim) + " max_seq_len=" + std::to_string(c.max_seq_len) +
         " vocab=" + std::to_string(c.vocab);
}

Status parse_llmc_header(const ByteSource& file, LlmcHeader* out) {
  if (file.size() < kLlmcHeaderBytes)
    return Status::error("truncated: " + std::to_string(file.size()) + " bytes, less than the 1024-byte header");
  int32_t h[kLlmcHeaderInts];
  RETURN_IF_ERROR(file.read(0, h, kLlmcHeaderBytes));
  RETURN_IF_ERROR(check_magic_and_version(h));
  LlmcHeader header;
  RETURN_IF_ERROR(config_from_header(h, &header));
  RETURN_IF_ERROR(check_file_size(file.size(), header));
  *out = header;
  return Status::ok();
}

std::vector<const model::ParamTensor*> llmc_order(const model::ParamLayout& layout, int layers) {
  // LayerTensor's order within a block is llm.c's order of kinds, so the kind loop follows
  // the enum up to GPT-2's last kind (the MoE kinds after it have no llm.c form).
  std::vector<const model::ParamTensor*> order = {&layout.wte(), &layout.wpe()};
  for (int k = 0; k <= model::kFcProjB; k++)
    for (int l = 0; l < layers; l++) order.push_back(&layout.layer(l, (model::LayerTensor)k));
  order.push_back(&layout.lnf_w());
  order.push_back(&layout.lnf_b());
  return order;
}

Status read_llmc_params(const ByteSource& file, const LlmcHeader& header, const model::ParamLayout& layout,
                        float* params) {
  const model::GptConfig& c = header.config;
  uint64_t at = kLlmcHeaderBytes;
  for (const model::ParamTensor* t : llmc_order(layout, c.layers)) {
    float* dst = params + t->offset;
    if (t == &layout.wte()) {
      // Our first `vocab` rows; the file's extra padding rows are skipped and ours are
      // zeroed, so any padded_vocab >= vocab in the file loads.
      const size_t used = (size_t)c.vocab * c.dim;
      CHECK_MSG(t->numel >= used, "read_llmc_params: the layout is not the header's shape");
      RETURN_IF_ERROR(file.read(at, dst, used * sizeof(float)).with_context("tensor wte.weight"));
      std::memset(dst + used, 0, sizeof(float) * (t->numel - used));
      at += (uint64_t)header.padded_vocab * c.dim * sizeof(float);
      continue;
    }
    RETURN_IF_ERROR(file.read(at, dst, t->numel * sizeof(float)).with_context("tensor " + t->name));
    at += t->numel * sizeof(float);
  }
  return Status::ok();
}

}  // namespace meshtrain::checkpoint
