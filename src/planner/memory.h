// Model-state memory per rank: parameters, gradients and optimizer state by precision and
// ZeRO stage. One accounting for the engine (exact, with its per-unit shard padding) and
// for planning clusters the engine will never run on (Ψ parameters, no padding).
#pragma once
#include <cstddef>

#include "parallel/shard_layout.h"

namespace meshtrain::planner {

// Bytes per parameter of each kind of state.
struct StateDtypes {
  double param, grad, optim;
};
// The engine today: fp32 parameters (also the optimizer's weights), fp32 gradients, Adam
// m and v.
inline constexpr StateDtypes kFp32State{4, 4, 8};
// Mixed-precision Adam (ZeRO paper §3.1): fp16/bf16 weights and gradients, fp32 master
// weights, momentum and variance: 2 + 2 + K with K = 12.
inline constexpr StateDtypes kMixedState{2, 2, 12};

struct StateBytes {
  double params = 0, grads = 0, optim = 0;
  double total() const { return params + grads + optim; }
};

// Per rank for psi parameters over N data-parallel ranks at ZeRO stage `zero` (ZeRO §5):
// stage 0 keeps everything, 1 shards the optimizer state, 2 also the gradients, 3 also the
// parameters (P_os, P_os+g, P_os+g+p).
StateBytes model_state_bytes(double psi, const StateDtypes& d, int zero, int N);

// The same for a rank of the engine: `total` elements in its layout, sharded unit by unit
// as `shards` pads them (the shards' local_total is what a sharded buffer holds).
StateBytes model_state_bytes(const parallel::ShardLayout& shards, size_t total, const StateDtypes& d,
                             int zero);

}  // namespace meshtrain::planner
