// A training checkpoint's index.json (the format is described in checkpoint.h), parsed into
// types and validated as a whole, so that nothing that reads shards later meets a field of
// the wrong type or a number that does not fit the model it describes. Needs no files:
// read_checkpoint_index (checkpoint.h) adds the checks against the shard files on disk.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "model/config.h"
#include "parallel/layout.h"
#include "model/param_layout.h"
#include "parallel/shard_layout.h"

namespace meshtrain::checkpoint {

// Version 3 lists the units each shard file holds (pipeline stages hold some of them);
// version 2 files (every file holds every unit) still load.
inline constexpr int kCheckpointFormatVersion = 3;

// The sections of every shard file, in this order: parameters, Adam m, Adam v (RankState's
// `kind` 0, 1, 2), and, in a checkpoint of a run that keeps a second weight version
// (PipeDream-2BW's), the parameters before the last update (kind 3). That version is laid
// out like the parameters, so it re-slices to any layout as they do.
inline constexpr int kNumSections = 3;      // always present
inline constexpr int kMaxSections = 4;      // with the previous weight version
inline constexpr int kPreviousSection = 3;
inline constexpr const char* kSectionNames[kMaxSections] = {"params", "adam_m", "adam_v", "params_previous"};

// shard_[tpTT_][ppPP_]RRRRR.bin: the tp and pp parts only when those axes are split.
std::string shard_file_name(int tp, int tp_rank, int pp, int pp_rank, int dp_rank);

// How a checkpoint's writers split the whole model (one tp rank's, all pipeline stages):
// each unit over the dp ranks, each routed expert's unit over the dp / ep ranks that held it
// (ep rank e / (E / ep): dp ranks d with d % ep equal to it, shard d / ep).
class WriterLayout {
 public:
  WriterLayout(const model::ParamLayout& whole, int dp, int ep);
  int world() const { return dp_; }
  const std::vector<parallel::UnitShard>& units() const { return shards_.units(); }
  // The global range of unit u that dp rank d wrote (empty when d did not hold it).
  size_t own_begin(int u, int d) const;
  size_t own_end(int u, int d) const;

 private:
  int shard_of(int u, int d) const;  // -1: d holds no part of u
  int dp_, ep_, experts_per_rank_;
  std::vector<int> expert_;  // per unit: its expert, or -1
  parallel::ShardLayout shards_;
};

struct IndexFile {
  std::string name;            // in the checkpoint folder: shard_file_name(tp, pp, dp)
  int tp = 0, pp = 0, dp = 0;  // the writer's coordinates
  std::vector<int> units;      // whole-model unit ids it holds, ascending (its order in the file)
  uint64_t bytes = 0;
  std::string checksum;  // to_hex(checksum64(file)): 16 lowercase hex digits
};

struct CheckpointIndex {
  int version = kCheckpointFormatVersion;
  int64_t step = 0;
  model::GptConfig model;
  int tp_size = 1, pp_size = 1, dp_size = 1;
  int ep_size = 1;  // MoE: the writers' expert parallelism (each expert on dp / ep of them)
  // MoE: the writers' expert tensor parallelism, 1 (each expert whole on every tp rank) or
  // tp_size (split like the dense MLP).
  int expert_tp = 1;
  model::ExpertTp expert_layout() const {
    return expert_tp == 1 && tp_size > 1 ? model::ExpertTp::kReplicated : model::ExpertTp::kSplit;
  }
  // The writers' layout: its axes (parallel/layout.h; the batch and the choices are the
  // run's, in run_config).
  parallel::Layout writers() const {
    parallel::Layout l;
    // (A dense model's index carries expert_tp 1 by default: no experts to lay out.)
    l.tp = tp_size, l.pp = pp_size, l.dp = dp_size, l.ep = ep_size;
    l.expert_tp = model.is_moe() ? expert_layout() : model::ExpertTp::kSplit;
    l.micro_batch = 1, l.global_batch = dp_size;
    return l;
  }
  std::vector<IndexFile> files;  // dp_size x tp_size x pp_size of them
  int sections = kNumSections;   // 3, or 4 with the previous weight version
  nlohmann::json json;           // the whole document (run_config, train_state, ...)
};

// Parses index.json's text; errors read "PATH is corrupt: <what and where>" (or name the
// format or version). Validated, in order:
//   - a JSON object; "format" is "meshtrain-checkpoint"; "version" is 2 or 3;
//   - "step" an integer >= 0; "model" an object of integer layers, heads, dim, max_seq_len
//     and vocab that model::validate accepts, with at most 2^48 parameters;
//   - "tp_size" (default 1), "pp_size" (default 1) and "dp_size" integers >= 1, tp valid
//     for the model (model::validate_tp), and "files" has exactly dp x tp x pp entries;
//   - "expert_tp" (default tp_size) 1 or tp_size;
//   - "units" has layers + 2 entries, each {"offset", "numel", "shard"} equal to the
//     model's unit table at tp rank 0 split over dp_size ranks; "total_elements" and
//     "tensors" (name, non-negative shape, offset of each) equal the model's layout;
//   - "shard_sections" is ["params", "adam_m", "adam_v"], or those and "params_previous";
//   - each file has the name the writer at its "tp", "pp", "dp" (each in range, each
//     triple once) gives it, "units" ascending ids of the model's units (version 2: absent,
//     all units), "bytes" exactly 4 x sections x the elements of those units its dp rank
//     owns, and a 16-hex-digit "checksum"; for every tp and dp rank, every unit with elements at that
//     dp rank is held by some file;
//   - "train_state", when present, an object.
Status parse_checkpoint_index(const std::string& text, const std::string& path, CheckpointIndex* out);

// The "model" object of an index (as parse_checkpoint_index checks it); `where` names the
// index in errors.
Status index_model_config(const nlohmann::json& index, const std::string& where, model::GptConfig* config);

}  // namespace meshtrain::checkpoint
