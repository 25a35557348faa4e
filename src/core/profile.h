// The step profile (`bench step --profile`, `train --profile`): where a training step's time
// goes, op by op. Off by default; while off a Scope costs one relaxed atomic load, so the
// model and the kernels keep their scopes in place.
//
// Times are exclusive: a scope opened inside another (a conversion inside a GEMM site, a
// communication wait inside a norm's tp reduction) takes its time out of the outer one, so
// the ops' times add up to the profiled time. Scopes are opened by the thread that drives
// the step (never inside an OpenMP region); each op's FLOPs and bytes are what the scope's
// caller states: the arithmetic of its products, and the bytes it must move at least (each
// tensor read or written once).
#pragma once
#include <array>
#include <cstdint>
#include <string>

namespace meshtrain::profile {

enum class Op {
  kQkv,           // the q, k, v projection (fused columns)
  kAttnProj,      // attention's output projection
  kFc1,           // the MLP's first GEMM (GPT-2's fc, Llama's gate and up)
  kFc2,           // the MLP's second GEMM (GPT-2's proj, Llama's down)
  kExperts,       // MoE: routing and the experts' GEMMs
  kHead,          // the LM head's GEMMs
  kAttention,     // the attention core (scores, softmax, weighted values)
  kRope,          // rotary position embedding
  kNorm,          // LayerNorm / RMSNorm
  kActivation,    // GELU / SwiGLU
  kResidual,      // bias, dropout and residual adds
  kCrossEntropy,  // softmax cross-entropy over the vocabulary
  kEmbedding,     // token (and position) embedding
  kOptimizer,     // gradient norm, clipping and AdamW
  kConvert,       // precision conversions (rounding operands or weights to 16 bits, widening)
  kCommWait,      // the step's thread blocked on communication
  kCount
};

// The op's name in tables and metrics.jsonl ("qkv", "attn_proj", ...), and whether it is a
// GEMM site (its rate is set against the GEMM peak; the others' bytes against memory
// bandwidth).
const char* op_name(Op op);
bool is_gemm(Op op);

struct OpStats {
  double seconds = 0, flops = 0, bytes = 0;
  int64_t calls = 0;
};
using Profile = std::array<OpStats, (size_t)Op::kCount>;

bool enabled();
void set_enabled(bool on);
// Clears what was recorded (on the calling thread's profile).
void reset();
// What was recorded since the last reset.
Profile snapshot();

// Records the time from construction to destruction as `op`, less the time of the scopes
// opened inside it.
class Scope {
 public:
  explicit Scope(Op op, double flops = 0, double bytes = 0);
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  Op op_;
  double flops_, bytes_;
  double start_ = -1;  // < 0: not recording
  double inner_ = 0;   // seconds of the scopes inside
  Scope* outer_ = nullptr;
};

}  // namespace meshtrain::profile
