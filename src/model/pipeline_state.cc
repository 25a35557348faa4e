#include "model/pipeline_state.h"

#include <cstring>

#include "core/check.h"

namespace meshtrain::model {

// Sets of the same size serve any chunk (interleaved chunks of equal layer counts share one
// pool), so the allocated sets never exceed those alive at once for any one set size.
ActivationSet& ActivationSets::open(int c, int mb, size_t capacity, const Layout& layout) {
  ActivationSet* free_set = nullptr;
  for (auto& s : sets_) {
    if (s->micro_batch == mb && s->chunk == c) return *(current_ = s.get());  // forward again without backward (evaluation)
    if (s->micro_batch < 0 && !free_set && s->data.size() == capacity) free_set = s.get();
  }
  if (!free_set) {
    sets_.push_back(std::make_unique<ActivationSet>());
    free_set = sets_.back().get();
  }
  if (free_set->chunk != c) layout(c, *free_set);
  free_set->micro_batch = mb;
  return *(current_ = free_set);
}

ActivationSet& ActivationSets::use(int c, int mb) { return *(current_ = &find(c, mb)); }

const ActivationSet& ActivationSets::find(int c, int mb) const {
  for (const auto& s : sets_)
    if (s->micro_batch == mb && s->chunk == c) return *s;
  CHECK_MSG(false, "backward of a micro-batch whose forward did not run");
}

ActivationSet& ActivationSets::find(int c, int mb) {
  return const_cast<ActivationSet&>(std::as_const(*this).find(c, mb));
}

int ActivationSets::in_flight() const {
  int n = 0;
  for (const auto& s : sets_) n += s->micro_batch >= 0;
  return n;
}

void ActivationSets::reshape(bool keep_memory) {
  if (keep_memory) {
    // Kept, free and laid out again on next use (as clearing leaves none).
    for (auto& s : sets_) s->chunk = -1, s->micro_batch = -1;
  } else {
    sets_.clear();  // laid out again on first use
  }
  current_ = nullptr;
}

void DeferredWeights::begin_backward(int c, int mb, bool defer) {
  CHECK_MSG(!pending_.count({c, mb}), "a backward of a micro-batch whose W has not run");
  deferring_ = defer;
  running_ = {c, mb};
}

void DeferredWeights::run(int c, int mb, ParamStore& store) {
  auto it = pending_.find({c, mb});
  CHECK_MSG(it != pending_.end(), "a W without its B");
  std::vector<Work>& work = it->second;
  store.begin_pass(Pass::kBackward);
  // Each unit's gradients go back to the store after its last piece of work.
  std::map<int, size_t> last;
  for (size_t i = 0; i < work.size(); i++) last[work[i].unit] = i;
  for (size_t i = 0; i < work.size(); i++) {
    work[i].add(store.acquire_grads(work[i].unit));
    if (last[work[i].unit] == i) store.release_grads(work[i].unit);
  }
  pending_.erase(it);
}

int64_t DeferredWeights::pending_bytes() const {
  int64_t bytes = 0;
  for (const auto& [key, work] : pending_)
    for (const Work& d : work)
      bytes += (int64_t)((d.dout.size() + d.inp.size()) * sizeof(float) + (d.dout16.size() + d.inp16.size()) * 2);
  return bytes;
}

void TiedHeadGrad::configure(const std::vector<ModelPart::Chunk>& chunks, int layers, bool untied_head) {
  separate_ = false;
  if (untied_head || chunks.size() < 2) return;
  int first = -1, last = -1;
  for (int c = 0; c < (int)chunks.size(); c++) {
    if (chunks[c].begin == 0) first = c;
    if (chunks[c].end == layers) last = c;
  }
  separate_ = first >= 0 && last >= 0 && first != last;
}

float* TiedHeadGrad::sum(size_t numel) {
  if (grad_.empty()) {
    grad_.allocate(MemCategory::kGrads, numel);
    std::memset(grad_.data(), 0, sizeof(float) * numel);
  }
  return grad_.data();
}

void TiedHeadGrad::join(int mb, float* wte) {
  if (mb != last_micro_batch_) return;
  // Every micro-batch's head backward ran before this (its own stage 2p-1 before stage 0).
  CHECK_MSG(!grad_.empty(), "the step's tied head gradient is missing");
  float* head = grad_.data();
  for (size_t i = 0; i < grad_.size(); i++) wte[i] += head[i], head[i] = 0;
}

void PipelineState::weight_pass(int c, int mb, ParamStore& store) {
  weights_.run(c, mb, store);
  sets_.release(c, mb);
}

}  // namespace meshtrain::model
