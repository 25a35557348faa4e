// The local predictor's memory side (planner/local.h): one pipeline rank's tracked bytes
// in an engine run, found by replaying, call by call, what the engine allocates over two
// training steps: model states by planner::model_state_bytes over the rank's ShardLayout,
// activation sets by model::activation_inventory as the schedule keeps them alive, and the
// buffers of parallel::DataParallel (its BufferPool included), parallel::pp::PipelineExecutor
// and the attention kernel. The replay mirrors the engine's allocation order; its test
// (tests/unit/test_planner_local.cc) holds it to the tracker to the byte, so a change to the
// engine's buffers that is not mirrored here fails there.
#pragma once
#include "model/config.h"
#include "model/gpt.h"
#include "model/param_layout.h"
#include "parallel/shard_layout.h"
#include "planner/local.h"

namespace meshtrain::planner {

struct RankMemory {
  EngineMemory peaks;            // each category's peak, and the peak of the sum
  MemoryBreakdown at_peak;       // the categories at the moment of the sum's peak
};

// Pipeline rank `rank` (its model part `part` of `layout`, sharded as `shards`) of a run of
// `l` with m micro-batches per step of B x T tokens, `threads` OpenMP threads per rank. With
// cp, `inv` is of the rank's B x T/cp rows and `shards` over dp x cp.
RankMemory replay_rank_memory(const model::GptConfig& config, const model::ParamLayout& layout,
                              const parallel::ShardLayout& shards, const model::ModelPart& part,
                              const model::ActivationInventory& inv, model::Recompute recompute, const Layout& l,
                              int m, int T, int threads, int rank);

}  // namespace meshtrain::planner
