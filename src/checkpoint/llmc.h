// GPT-2 weights in llm.c's model-file format (the `gpt2_124M.bin` that llm.c's
// train_gpt2.py writes and train_gpt2.c reads), so that models move between the two engines.
//
// Layout, little-endian:
//   header: 256 int32 = [magic 20240326, version 3, max_seq_len, vocab, layers, heads,
//           channels, padded_vocab, 0...]
//   fp32 parameters, each kind for every layer before the next kind:
//     wte [Vp,C], wpe [maxT,C], then for each of ln1w ln1b qkvw qkvb attprojw attprojb ln2w
//     ln2b fcw fcb fcprojw fcprojb: that tensor of layers 0..L-1, then lnfw [C], lnfb [C].
// Linear weights are [out, in] there as here, so conversion only regroups, never transposes.
// Only version 3 (fp32) is read; version 5 (bf16) is rejected with a clear error.
#pragma once
#include <string>

#include "checkpoint/llmc_format.h"
#include "core/status.h"
#include "model/gpt.h"

namespace meshtrain::checkpoint {

// Writes the model as a version-3 llm.c file with meshtrain's padded vocabulary (a multiple
// of 128, as llm.c pads); padded token rows are written as zeros. Atomic (tmp + rename).
Status export_llmc_model(const model::Gpt& gpt, const std::string& path);

// Reads the shape from the header (checked as parse_llmc_header in llmc_format.h does).
// Rejects a wrong magic, versions other than 3, sizes the engine cannot run, padded_vocab <
// vocab, and a file whose size is not exactly the header plus the fp32 parameters the
// header describes ("truncated" / "trailing data").
Status infer_llmc_config(const std::string& path, model::GptConfig* config);

// Loads the weights into `gpt`, whose config must equal the file's (see infer_llmc_config;
// the file's padded vocabulary may differ: the first `vocab` token rows are copied and our
// padding rows are zeroed). On error `gpt`'s weights may be partly overwritten.
Status load_llmc_model(const std::string& path, model::Gpt* gpt);

// True when the file starts with llm.c's model magic; lets --init-from dispatch on content
// rather than on the file name. False for unreadable or short files.
bool is_llmc_model_file(const std::string& path);

}  // namespace meshtrain::checkpoint
