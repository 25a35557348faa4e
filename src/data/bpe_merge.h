// The merge step every BPE tokenizer here shares (GPT-2, Hugging Face tokenizer.json,
// tiktoken): a piece starts as a row of symbol ids and adjacent pairs are merged, lowest
// priority first, leftmost on ties, until no pair has a merge. Formats differ only in where
// the pairs come from (a merges list's line numbers, or tiktoken's ranks of the merged bytes)
// and in one detail of order, which MergeOrder names.
//
// Pieces of up to kShortPiece symbols (nearly every real word) use a quadratic loop over a
// small array of pair priorities, faster than a heap at that size; longer ones (a whole
// SentencePiece-style text, a run of digits or spaces) use a heap, O(n log n).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace meshtrain::data {

struct MergeRule {
  int priority;   // lower merges first
  int merged_id;  // the symbol the pair becomes
};

// (left id, right id) -> MergeRule, an open-addressing table: the merge loop's only lookup,
// so it is kept flat and branch-light rather than a node-based map.
class PairMerges {
 public:
  // Adds or replaces the rule for (left, right); ids must be >= 0.
  void set(int left, int right, MergeRule rule);
  const MergeRule* find(int left, int right) const {
    if (slots_.empty()) return nullptr;
    const uint64_t key = pack(left, right);
    for (size_t i = slot_of(key);; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.key == key) return &s.rule;
      if (s.key == kEmpty) return nullptr;
    }
  }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

 private:
  struct Slot {
    uint64_t key;
    MergeRule rule;
  };
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  static uint64_t pack(int left, int right) {
    return (uint64_t(uint32_t(left)) << 32) | uint32_t(right);
  }
  size_t slot_of(uint64_t key) const { return size_t((key * 0x9E3779B97F4A7C15ull) >> shift_); }
  void grow();

  std::vector<Slot> slots_;
  size_t mask_ = 0;
  int shift_ = 64;
  size_t size_ = 0;
};

enum class MergeOrder {
  // OpenAI's encoder.py (GPT-2): the lowest pair is merged at every place it occurs, left to
  // right, before any pair those merges formed is looked at.
  kRounds,
  // Hugging Face's BPE model and tiktoken: one merge at a time; a pair formed by a merge
  // competes at once. The two agree whenever merges were learnt in order (a merged symbol
  // only takes part in later merges), as in every published vocabulary.
  kOneAtATime,
};

constexpr size_t kShortPiece = 64;

// Merges `symbols` in place.
void apply_merges(std::vector<int>* symbols, const PairMerges& merges, MergeOrder order);

}  // namespace meshtrain::data
