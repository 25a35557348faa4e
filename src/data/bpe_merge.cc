#include "data/bpe_merge.h"

#include <climits>
#include <queue>

namespace meshtrain::data {

void PairMerges::set(int left, int right, MergeRule rule) {
  if ((size_ + 1) * 2 > slots_.size()) grow();
  const uint64_t key = pack(left, right);
  for (size_t i = slot_of(key);; i = (i + 1) & mask_) {
    Slot& s = slots_[i];
    if (s.key == key) {
      s.rule = rule;
      return;
    }
    if (s.key == kEmpty) {
      s = Slot{key, rule};
      ++size_;
      return;
    }
  }
}

void PairMerges::grow() {
  std::vector<Slot> old = std::move(slots_);
  const size_t capacity = old.empty() ? 64 : old.size() * 2;
  slots_.assign(capacity, Slot{kEmpty, MergeRule{0, 0}});
  mask_ = capacity - 1;
  shift_ = 64 - __builtin_ctzll(capacity);
  size_ = 0;
  for (const Slot& s : old) {
    if (s.key != kEmpty) set(int(s.key >> 32), int(uint32_t(s.key)), s.rule);
  }
}

namespace {

// encoder.py's bpe() loop, directly.
void merge_short_rounds(std::vector<int>* symbols, const PairMerges& merges) {
  std::vector<int>& s = *symbols;
  while (s.size() > 1) {
    int best_priority = INT_MAX, merged = -1;
    size_t best = 0;
    for (size_t i = 0; i + 1 < s.size(); ++i) {
      const MergeRule* m = merges.find(s[i], s[i + 1]);
      if (m && m->priority < best_priority) best_priority = m->priority, merged = m->merged_id, best = i;
    }
    if (merged < 0) return;
    const int a = s[best], b = s[best + 1];
    size_t w = best;
    for (size_t i = best; i < s.size();) {
      if (i + 1 < s.size() && s[i] == a && s[i + 1] == b) {
        s[w++] = merged;
        i += 2;
      } else {
        s[w++] = s[i++];
      }
    }
    s.resize(w);
  }
}

// One merge per step; each pair's priority is looked up once and kept beside it, so a step
// is a scan of at most kShortPiece ints plus two lookups for the merged symbol's new pairs.
void merge_short_one_at_a_time(std::vector<int>* symbols, const PairMerges& merges) {
  std::vector<int>& s = *symbols;
  size_t n = s.size();
  if (n < 2) return;
  int priority[kShortPiece];
  int merged[kShortPiece];
  const auto look = [&](size_t i) {
    const MergeRule* m = merges.find(s[i], s[i + 1]);
    priority[i] = m ? m->priority : INT_MAX;
    merged[i] = m ? m->merged_id : -1;
  };
  for (size_t i = 0; i + 1 < n; ++i) look(i);
  while (n > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < n; ++i) {
      if (priority[i] < priority[best]) best = i;
    }
    if (priority[best] == INT_MAX) break;
    s[best] = merged[best];
    for (size_t i = best + 1; i + 1 < n; ++i) {
      s[i] = s[i + 1];
      priority[i] = priority[i + 1];
      merged[i] = merged[i + 1];
    }
    --n;
    if (best > 0) look(best - 1);
    if (best + 1 < n) look(best);
  }
  s.resize(n);
}

struct HeapEntry {
  int priority;
  int left;  // node index of the left symbol
  int left_id;
  int right_id;
  bool operator>(const HeapEntry& o) const {
    return priority != o.priority ? priority > o.priority : left > o.left;
  }
};

struct Node {
  int id;
  int prev;
  int next;  // -1 at the ends
};

void merge_long(std::vector<int>* symbols, const PairMerges& merges, MergeOrder order) {
  std::vector<int>& s = *symbols;
  const int n = int(s.size());
  std::vector<Node> nodes(n);
  for (int i = 0; i < n; ++i) nodes[i] = Node{s[i], i - 1, i + 1 < n ? i + 1 : -1};

  std::priority_queue<HeapEntry, std::vector<HeapEntry>, std::greater<>> heap;
  std::vector<HeapEntry> pending;  // kRounds: pairs formed this round wait for the next one
  const auto consider = [&](int left, bool defer) {
    if (left < 0 || nodes[left].next < 0) return;
    const int left_id = nodes[left].id, right_id = nodes[nodes[left].next].id;
    if (const MergeRule* m = merges.find(left_id, right_id)) {
      const HeapEntry e{m->priority, left, left_id, right_id};
      if (defer) {
        pending.push_back(e);
      } else {
        heap.push(e);
      }
    }
  };
  for (int i = 0; i + 1 < n; ++i) consider(i, false);
  const bool rounds = order == MergeOrder::kRounds;

  while (!heap.empty()) {
    const int priority = heap.top().priority;
    while (!heap.empty() && heap.top().priority == priority) {  // ascending position
      const HeapEntry e = heap.top();
      heap.pop();
      Node& left = nodes[e.left];
      // A node's id only ever changes to a longer symbol, so equal ids mean an unchanged pair.
      if (left.id != e.left_id || left.next < 0 || nodes[left.next].id != e.right_id) continue;
      const int right = left.next;
      left.id = merges.find(e.left_id, e.right_id)->merged_id;
      left.next = nodes[right].next;
      if (left.next >= 0) nodes[left.next].prev = e.left;
      nodes[right].id = -1;
      consider(left.prev, rounds);
      consider(e.left, rounds);
      if (!rounds) break;  // a new pair may now be the lowest
    }
    for (const HeapEntry& e : pending) heap.push(e);
    pending.clear();
  }
  s.clear();
  for (int i = 0; i >= 0; i = nodes[i].next) s.push_back(nodes[i].id);
}

}  // namespace

void apply_merges(std::vector<int>* symbols, const PairMerges& merges, MergeOrder order) {
  if (symbols->size() < 2) return;
  if (symbols->size() > kShortPiece) {
    merge_long(symbols, merges, order);
  } else if (order == MergeOrder::kRounds) {
    merge_short_rounds(symbols, merges);
  } else {
    merge_short_one_at_a_time(symbols, merges);
  }
}

}  // namespace meshtrain::data
