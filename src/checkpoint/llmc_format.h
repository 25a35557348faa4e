// Reading llm.c model files (format described in llmc.h) from any ByteSource, without a
// model object: the header's shape, and the weights into a flat buffer of a ParamLayout.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/byte_source.h"
#include "core/status.h"
#include "model/config.h"
#include "model/param_layout.h"

namespace meshtrain::checkpoint {

inline constexpr int kLlmcMagic = 20240326;
inline constexpr int kLlmcVersionFp32 = 3;
inline constexpr int kLlmcVersionBf16 = 5;
inline constexpr int kLlmcHeaderInts = 256;
inline constexpr size_t kLlmcHeaderBytes = kLlmcHeaderInts * sizeof(int32_t);
// The header's slots, h[llmc_slot::kVocab] and so on; the rest of its ints are zero.
namespace llmc_slot {
enum : int { kMagic, kVersion, kMaxSeqLen, kVocab, kLayers, kHeads, kChannels, kPaddedVocab };
}  // namespace llmc_slot

struct LlmcHeader {
  model::GptConfig config;
  int padded_vocab = 0;  // the file's token rows (ours may differ)
};

// The header: at least 1024 bytes, magic 20240326, version 3 (version 5, bf16, is named
// as unsupported), a shape model::validate accepts, padded_vocab >= vocab, and a file of
// exactly 1024 + 4 x (the parameters that shape and padded_vocab imply) bytes
// ("truncated" / "trailing data"), computed without overflow.
Status parse_llmc_header(const ByteSource& file, LlmcHeader* out);

// The weights after a header parse_llmc_header accepted, into `params` laid out as
// `layout` (the whole tp = 1 model of the header's shape): the file's first `vocab` token
// rows, the layout's padding rows zeroed.
Status read_llmc_params(const ByteSource& file, const LlmcHeader& header, const model::ParamLayout& layout,
                        float* params);

// The shape a header holds, for messages: "layers=12 heads=12 dim=768 max_seq_len=1024 vocab=50257".
std::string describe_llmc_shape(const model::GptConfig& c);

// Parameter tensors in the order llm.c stores them: each kind for all layers.
std::vector<const model::ParamTensor*> llmc_order(const model::ParamLayout& layout, int layers);

}  // namespace meshtrain::checkpoint
