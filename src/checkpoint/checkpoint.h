// Training checkpoints, sharded and layout-independent.
//
// OUT/checkpoints/step_NNNNNNNN/ holds
//   index.json       format version, step, model shape, run config, every tensor's global
//                    name/shape/offset, the writers' data-parallel size N, the unit table
//                    (global offset, elements, shard size) and each shard file's size and
//                    checksum;
//   shard_RRRRR.bin  data-parallel rank R's owned slice of every unit (ZeRO's per-unit
//                    shards, see parallel/shard_layout.h): params of all units, then Adam
//                    m, then v; with tensor parallelism one set per tp rank T,
//                    shard_tpTT_RRRRR.bin, each over that rank's slice of the model; with
//                    pipeline parallelism one set per stage rank P, shard_[tpTT_]ppPP_RRRRR.bin,
//                    each over the units that rank holds (listed in the index; the tied
//                    embedding appears in the first and the last stage's files).
// Each rank writes its own shard; rank 0 writes the index and renames the staged ".tmp"
// folder into place, so a crash never leaves a partial step_* folder. Because the index
// records global offsets, a checkpoint written by N ranks at any ZeRO stage and pipeline
// split loads into any other N, stage and split: a reader asks for ranges of units and gets
// them from whichever shards hold them. A tensor-parallel slice other than the writers' is
// reassembled from theirs and cut again (tp_reslice.h): any checkpoint resumes on any layout.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint_index.h"
#include "comm/group.h"
#include "core/status.h"
#include "model/gpt.h"
#include "parallel/shard_layout.h"

namespace meshtrain::checkpoint {

// What one rank holds: parameters and Adam moments, each either full (indexed by global
// offset in the flat layout) or this rank's shard (indexed by ShardLayout local offset).
struct RankState {
  float* params = nullptr;
  bool params_full = true;
  float* m = nullptr;  // null: not wanted (loading weights only)
  float* v = nullptr;
  bool moments_full = true;
  // Saving only: a section whose pointer is null is read through this instead, in pieces
  // (optimizer state offloaded to disk): copies `count` elements of section `kind` (0
  // params, 1 m, 2 v, 3 the previous weight version) starting at element `offset` of the
  // buffer the pointer would address.
  std::function<void(int kind, size_t offset, size_t count, float* dst)> read;
  // Loading: the same for filling such a section in pieces. A null section with neither is
  // not wanted (loading weights only).
  std::function<void(int kind, size_t offset, size_t count, const float* src)> write;
  // Loading: the parameters only, the moments not read at all (inference).
  bool params_only = false;
  // Saving: state of this rank alone that no other layout can use (a compressor's error
  // feedback), written as rank_WWWWW.bin (the world rank) beside the shards; read back with
  // load_rank_arrays.
  std::vector<std::pair<const float*, size_t>> rank_arrays = {};
  // A second weight version (PipeDream-2BW's parameters before the last update), section 3,
  // laid out as the parameters and re-sliced as they are: saved when `with_previous`, from
  // `previous` (full, indexed by global offset) or through read/write with kind 3; loaded
  // when `with_previous` and the checkpoint holds one (*previous_loaded says which).
  bool with_previous = false;
  float* previous = nullptr;
  bool* previous_loaded = nullptr;
};

// Reads back what world rank `world_rank` saved as RankState::rank_arrays into `arrays`
// (the same sizes, in order). *loaded is false, with OK, when the checkpoint holds no such
// file (written without it); a file of other sizes or a bad checksum is an error naming it.
Status load_rank_arrays(const std::string& dir, int world_rank, const std::vector<std::pair<float*, size_t>>& arrays,
                        bool* loaded);

// Where a rank sits: its tensor-parallel slice (layout.tp(), layout.tp_rank()), its
// pipeline stages (the units of `layout`, on pipeline rank pp_rank of pp_size) and its
// data-parallel shard (shards.world(), shards.rank()).
// Collective over `world` (every rank of the job): each writes its shard, world rank 0 the
// index. Keeps the newest `keep` checkpoints (0: all). `train_state` (world rank 0's) is
// stored in the index as is, for state outside the model (the fp16 loss scaler).
Status save_checkpoint(const std::string& out_dir, int64_t step, const model::ParamLayout& layout,
                       const model::GptConfig& config, const parallel::ShardLayout& shards,
                       const RankState& state, comm::Group& world, const nlohmann::json& run_config,
                       int keep = 2, int pp_size = 1, int pp_rank = 0,
                       const nlohmann::json& train_state = nlohmann::json::object());

// The same in two halves, for --async-save (as torch DCP's async save): begin_save is
// collective; it stages the folder and writes this rank's shard at once, or with `async`
// copies it into memory (a snapshot of the step's state, counted as workspace) and writes
// it from a thread of its own while training goes on. finish_save is collective: every rank
// learns whether all shards are written (with `wait`, after waiting for its own); when they
// are, *finished is true and the save is committed (rank 0's index, the rename), or fails
// on every rank as save_checkpoint would, and *pending is reset. A crash at any moment
// leaves the newest committed checkpoint as it was: only the staged ".tmp" folder is partial.
struct PendingSave;
struct PendingSaveDeleter {
  void operator()(PendingSave* p) const;  // waits for its writer thread
};
using PendingSavePtr = std::unique_ptr<PendingSave, PendingSaveDeleter>;
Status begin_save(const std::string& out_dir, int64_t step, const model::ParamLayout& layout,
                  const model::GptConfig& config, const parallel::ShardLayout& shards, const RankState& state,
                  comm::Group& world, const nlohmann::json& run_config, int keep, int pp_size, int pp_rank,
                  const nlohmann::json& train_state, bool async, PendingSavePtr* out);
Status finish_save(PendingSavePtr* pending, comm::Group& world, bool wait, bool* finished);

// The step_* folders under out_dir/checkpoints, newest first (staged ".tmp" folders left out).
std::vector<std::string> list_checkpoints(const std::string& out_dir);
// Newest complete checkpoint directory under out_dir/checkpoints: the newest whose index.json
// reads and whose shard files have the sizes it records; error if there is none.
// `passed_over` (optional) names the newer folders that are not, and why.
Status find_latest_checkpoint(const std::string& out_dir, std::string* dir, std::string* passed_over = nullptr);
// Whether `dir` is intact: its index holds (read_checkpoint_index) and the checksums of the
// shard files it lists match, of every file i with i % parts == part (ranks share the reading).
// `bytes` (optional): the size of every shard file it lists, all parts together.
Status verify_checkpoint(const std::string& dir, int part = 0, int parts = 1, uint64_t* bytes = nullptr);

// Reads and validates DIR/index.json (every field, see parse_checkpoint_index in
// checkpoint_index.h), and that every shard file it lists exists with the size it records,
// so that a corrupt index is reported before a model of the size it claims is allocated.
Status read_checkpoint_index(const std::string& dir, CheckpointIndex* index);
// The same, for callers that want the document itself (validated the same way).
Status read_checkpoint_index(const std::string& dir, nlohmann::json* index);
// The model shape of an index (its "model" object, checked as parse_checkpoint_index does).
Status checkpoint_model_config(const nlohmann::json& index, model::GptConfig* config);

// Fills `state` for a rank whose shards are `shards` (full parts get every element),
// after verifying the model shape and the checksums of the shard files it reads. Any
// data-parallel size, ZeRO stage, pipeline split, expert-parallel size, tensor-parallel
// size and expert-tp: a tp slice other than the writers' is re-sliced (tp_reslice.h).
Status load_checkpoint(const std::string& dir, const model::ParamLayout& layout,
                       const model::GptConfig& config, const parallel::ShardLayout& shards,
                       const RankState& state, int64_t* step);

// Single-process convenience: the whole model's weights (reassembled from every tp slice)
// into a tp = 1 model, and its Adam moments when m and v are given.
Status load_checkpoint(const std::string& dir, model::Gpt* gpt, float* m, float* v, int64_t* step);

}  // namespace meshtrain::checkpoint
