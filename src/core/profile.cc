#include "core/profile.h"

#include <atomic>
#include <chrono>

namespace meshtrain::profile {

namespace {

std::atomic<bool> g_enabled{false};
// Per thread: the step's thread records; another thread's scopes (a server's, a test's)
// never mix into it.
thread_local Profile t_profile;
thread_local Scope* t_current = nullptr;

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

constexpr const char* kNames[] = {"qkv",       "attn_proj", "fc1",      "fc2",           "experts",   "head",
                                  "attention", "rope",      "norm",     "activation",    "residual",
                                  "cross_entropy", "embedding", "optimizer", "convert", "comm_wait"};
static_assert(sizeof(kNames) / sizeof(kNames[0]) == (size_t)Op::kCount, "a name per op");

}  // namespace

const char* op_name(Op op) { return kNames[(size_t)op]; }

bool is_gemm(Op op) {
  switch (op) {
    case Op::kQkv:
    case Op::kAttnProj:
    case Op::kFc1:
    case Op::kFc2:
    case Op::kExperts:
    case Op::kHead:
      return true;
    default:
      return false;
  }
}

bool enabled() { return g_enabled.load(std::memory_order_relaxed); }
void set_enabled(bool on) { g_enabled.store(on, std::memory_order_relaxed); }
void reset() { t_profile = Profile{}; }
Profile snapshot() { return t_profile; }

Scope::Scope(Op op, double flops, double bytes) : op_(op), flops_(flops), bytes_(bytes) {
  if (!enabled()) return;
  start_ = now_s();
  outer_ = t_current;
  t_current = this;
}

Scope::~Scope() {
  if (start_ < 0) return;
  const double elapsed = now_s() - start_;
  OpStats& s = t_profile[(size_t)op_];
  s.seconds += elapsed - inner_;
  s.flops += flops_, s.bytes += bytes_;
  s.calls++;
  t_current = outer_;
  if (outer_) outer_->inner_ += elapsed;
}

}  // namespace meshtrain::profile
