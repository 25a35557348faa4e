// What one transformer block keeps from its forward pass for its backward pass: the tensors
// of one micro-batch, laid out by a Gpt in an activation set (model/pipeline_state.h) or in
// its shared recomputation scratch.
#pragma once
#include "model/moe_routing.h"

namespace meshtrain::model {

// Everything the backward pass needs from the forward pass, one set per block. Q = C + 2 KV
// is the fused q, k, v width (KV = kv_heads x hs), Fc the MLP's first projection (F, or 2F
// for SwiGLU's [gate | up]), F its hidden width. (Tensor-parallel shapes: each of these and
// NH divided by t.)
struct BlockActivations {
  float* ln1;        // [B,T,C]
  float* ln1_mean;   // [B,T] (LayerNorm only)
  float* ln1_rstd;   // [B,T]
  float* qkv;        // [B,T,Q], q and k rotated (RoPE)
  float* atty;       // [B,T,C]
  float* att_lse;    // [B,NH,T]
  float* residual2;  // [B,T,C]
  float* ln2;        // [B,T,C]
  float* ln2_mean;   // [B,T] (LayerNorm only)
  float* ln2_rstd;   // [B,T]
  float* fch;        // [B,T,Fc]
  float* fch_gelu;   // [B,T,F] GELU's or SwiGLU's output; with bf16 GEMMs its bf16 words, in the slot's first half
  float* residual3;  // [B,T,C]
  // An MoE layer's MLP (docs/moe.md), with M <= N*k dispatched rows and El experts' widths
  // Fcel, Fel (Fc, F per expert over t): fch [M,Fcel] and fch_gelu [M,Fel] hold the experts'
  // rows in dispatch order, then
  float* router_logits;  // [N,E] fp32
  MoeRoute route;        // [N*k] x 4 and [E+1] ints
  int* received;         // [ep*El] rows each ep rank sent for each of this rank's El experts
  float* expert_in;      // [R,C] (ep > 1) the rows this rank's experts received, expert-major
  float* expert_out;     // [Nk,C] each dispatched row's expert output (partial over tp)
  float* shared_fch;     // [N, S*Fcel] the shared experts' (S > 0)
  float* shared_act;     // [N, S*Fel]
};

}  // namespace meshtrain::model
