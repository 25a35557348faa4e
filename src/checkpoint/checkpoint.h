// Training checkpoints: OUT/checkpoints/step_NNNNNNNN/ holds index.json (format version,
// step, model shape, run config, every tensor's global name/shape/offset, each data
// file's size and checksum), params.bin (fp32 weights, layout order) and optim.bin (Adam
// first then second moments). A checkpoint is staged in a ".tmp" directory and renamed
// into place, so a crash never leaves a half-written step_* directory.
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "model/gpt.h"
#include "optim/adamw.h"

namespace meshtrain::checkpoint {

inline constexpr int kCheckpointFormatVersion = 1;

// `step` = optimizer steps completed. Keeps the newest `keep` checkpoints (0 keeps all).
Status save_checkpoint(const std::string& out_dir, int64_t step, const model::Gpt& gpt,
                       const optim::AdamW& opt, const nlohmann::json& run_config, int keep = 2);

// Newest complete checkpoint directory under out_dir/checkpoints; error if there is none.
Status find_latest_checkpoint(const std::string& out_dir, std::string* dir);

// Reads and validates index.json (version, files present, sizes).
Status read_checkpoint_index(const std::string& dir, nlohmann::json* index);
Status checkpoint_model_config(const nlohmann::json& index, model::GptConfig* config);

// Loads weights (and moments when opt != null) after verifying checksums and that the
// checkpoint's model shape equals gpt's.
Status load_checkpoint(const std::string& dir, model::Gpt* gpt, optim::AdamW* opt, int64_t* step);

}  // namespace meshtrain::checkpoint
