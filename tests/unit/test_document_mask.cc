// Document masks (--doc-mask, model/document_rows.h): a packed row trains exactly as its
// documents would apart. Each document's tokens, packed behind another document and its
// separator, get the losses and the gradients they get as a sequence of their own (at
// positions from 0), for learned positions (GPT-2) and RoPE (Llama, grouped-query heads),
// with and without selective recomputation; without the mask they do not.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "model/document_rows.h"
#include "model/gpt.h"

namespace meshtrain::test_document_mask {
namespace {

constexpr int kVocab = 61, kSeparator = 60;

model::GptConfig config(bool llama) {
  model::GptConfig c;
  c.layers = 2, c.heads = 4, c.dim = 32, c.max_seq_len = 24, c.vocab = kVocab;
  if (llama) {
    EXPECT_TRUE(model::apply_arch("llama", &c).is_ok());
    c.kv_heads = 2, c.ffn_dim = 48;
  }
  return c;
}

// Documents of the given lengths, each ended by the separator (the last one's end cut off
// by the row's end: it is still being read).
std::vector<int> documents(const std::vector<int>& lengths, std::mt19937& rng) {
  std::vector<int> tokens;
  for (size_t d = 0; d < lengths.size(); d++)
    for (int i = 0; i < lengths[d]; i++)
      tokens.push_back(i + 1 == lengths[d] && d + 1 < lengths.size() ? kSeparator : (int)(rng() % (kVocab - 1)));
  return tokens;
}

struct Pass {
  double token_loss_sum;
  std::vector<float> grads;
};

// Sum of the token losses and their gradient (loss scale 1) of each row run on its own, or
// of the rows' concatenation as one packed row.
Pass run(model::Gpt& gpt, const std::vector<std::vector<int>>& rows, const std::vector<std::vector<int>>& targets) {
  gpt.zero_grads();
  Pass p{0, {}};
  for (size_t r = 0; r < rows.size(); r++) {
    const int T = (int)rows[r].size();
    p.token_loss_sum += (double)gpt.forward(rows[r].data(), targets[r].data(), 1, T) * T;
    gpt.backward(1.0f);
  }
  p.grads.assign(gpt.grads(), gpt.grads() + gpt.layout().total());
  return p;
}

double max_rel(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, mag = 1e-30;
  for (size_t i = 0; i < a.size(); i++) diff = std::max(diff, (double)std::abs(a[i] - b[i])), mag = std::max(mag, (double)std::abs(b[i]));
  return diff / mag;
}

TEST(DocumentMask, RowsAreItsDocumentsPositionsAndKeys) {
  const std::vector<int> inputs = {5, 7, kSeparator, 3, kSeparator, kSeparator, 9, 1};
  const model::DocumentRows d = model::document_rows(inputs.data(), 2, 4, kSeparator);
  // Row 0: [5 7 sep] [3]; row 1: [sep] [sep] [9 1] (a separator alone is a document).
  EXPECT_EQ(d.positions, (std::vector<int>{0, 1, 2, 0, 0, 0, 0, 1}));
  EXPECT_EQ(d.key_begin, (std::vector<int>{0, 0, 0, 3, 0, 1, 2, 2}));
  EXPECT_EQ(d.key_end, (std::vector<int>{1, 2, 3, 4, 1, 2, 3, 4}));
}

TEST(DocumentMask, PackedDocumentsTrainAsTheirDocumentsApart) {
  for (bool llama : {false, true}) {
    for (model::Recompute recompute : {model::Recompute::kNone, model::Recompute::kSelective}) {
      std::mt19937 rng(7);
      const std::vector<int> lengths = {7, 5, 12};  // T = 24
      const std::vector<int> packed = documents(lengths, rng);
      std::vector<int> packed_targets(packed.size());
      for (size_t i = 0; i < packed.size(); i++) packed_targets[i] = (int)(rng() % (kVocab - 1));
      std::vector<std::vector<int>> apart, apart_targets;
      for (size_t d = 0, at = 0; d < lengths.size(); at += lengths[d], d++) {
        apart.emplace_back(packed.begin() + at, packed.begin() + at + lengths[d]);
        apart_targets.emplace_back(packed_targets.begin() + at, packed_targets.begin() + at + lengths[d]);
      }
      model::Gpt gpt(config(llama));
      gpt.init_weights(11);
      gpt.set_recompute(recompute);
      const Pass alone = run(gpt, apart, apart_targets);
      gpt.set_document_mask(kSeparator);
      const Pass masked = run(gpt, {packed}, {packed_targets});
      gpt.set_document_mask(-1);
      const Pass unmasked = run(gpt, {packed}, {packed_targets});
      const char* what = llama ? "llama" : "gpt2";
      EXPECT_NEAR(masked.token_loss_sum, alone.token_loss_sum, 1e-5 * alone.token_loss_sum) << what;
      EXPECT_LT(max_rel(masked.grads, alone.grads), 1e-5) << what;
      // Without the mask the later documents read the earlier ones: other losses.
      EXPECT_GT(std::abs(unmasked.token_loss_sum - alone.token_loss_sum), 1e-3) << what;
    }
  }
}

}  // namespace
}  // namespace meshtrain::test_document_mask
