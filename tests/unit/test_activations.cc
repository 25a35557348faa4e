// The tracker's activation bytes per layer equal the documented inventory
// (docs/activations.md) exactly, for every tp / sp / recompute layout; and the doc's table
// is the current output of `meshtrain bench activations`.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "train/activation_table.h"

namespace meshtrain::train::test_activations {
namespace {

// The inventory, written out independently of the engine: floats kept by one layer.
int64_t inventory_floats(int B, int T, int C, int NH, int t, bool sp, const std::string& mode) {
  const int64_t N = (int64_t)B * T, Nl = sp ? N / t : N;
  const int64_t Cl = C / t, Fl = 4 * C / t, NHl = NH / t;
  const int64_t whole = 4 * Nl * C + 4 * Nl + N * (3 * Cl + Cl + NHl + 2 * Fl);
  if (mode == "full") return Nl * C;
  if (mode == "selective") return whole - N * (Cl + NHl);
  return whole;
}

TEST(Activations, TrackerBytesEqualTheInventory) {
  model::GptConfig c;
  c.heads = 8, c.dim = 64, c.max_seq_len = 48, c.vocab = 500;
  const int B = 2, T = 48;
  for (int t : {1, 2, 4})
    for (bool sp : {false, true})
      for (const char* mode : {"none", "selective", "full"}) {
        if (sp && t == 1) continue;
        EXPECT_EQ(measured_layer_activation_bytes(c, B, T, t, sp, mode),
                  4 * inventory_floats(B, T, c.dim, c.heads, t, sp, mode))
            << "tp " << t << " sp " << sp << " " << mode;
      }
}

// The same for a Llama block, written out part by part: RMSNorm keeps one row statistic
// (not LayerNorm's two), qkv is q plus this rank's key/value heads (one replicated head when
// there are fewer heads than ranks), SwiGLU's first projection is [gate; up] (2F/t) and its
// hidden F/t. 8 heads with 2 key/value heads: split at tp 2, replicated at tp 4.
TEST(Activations, LlamaTrackerBytesEqualTheInventory) {
  model::GptConfig c;
  c.heads = 8, c.dim = 64, c.max_seq_len = 48, c.vocab = 500;
  ASSERT_TRUE(model::apply_arch("llama", &c).is_ok());
  c.kv_heads = 2;
  const int B = 2, T = 48, C = 64, hs = 8, F = c.ffn();
  ASSERT_EQ(F, 256);  // Llama's rule for dim 64: 2/3 of 256, up to a multiple of 256
  for (int t : {1, 2, 4})
    for (bool sp : {false, true})
      for (const char* mode : {"none", "selective", "full"}) {
        if (sp && t == 1) continue;
        const int64_t N = (int64_t)B * T, Nl = sp ? N / t : N, Cl = C / t, NHl = c.heads / t;
        const int64_t kv_local = t <= 2 ? 2 / t : 1;  // 2 kv heads: split, then replicated
        const int64_t qkv = Cl + 2 * kv_local * hs, fc = 2 * F / t, hidden = F / t;
        const int64_t whole = 4 * Nl * C + 2 * Nl + N * (qkv + Cl + NHl + fc + hidden);
        const int64_t want = std::string(mode) == "full" ? Nl * C
                             : std::string(mode) == "selective" ? whole - N * (Cl + NHl)
                                                                : whole;
        EXPECT_EQ(measured_layer_activation_bytes(c, B, T, t, sp, mode), 4 * want)
            << "tp " << t << " sp " << sp << " " << mode;
      }
}

TEST(Activations, DocumentedTableIsTheCommandsOutput) {
  FILE* p = popen(MESHTRAIN_BINARY " bench activations", "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  ASSERT_EQ(pclose(p), 0);
  std::ifstream doc(MESHTRAIN_SOURCE_DIR "/docs/activations.md");
  std::stringstream text;
  text << doc.rdbuf();
  EXPECT_NE(text.str().find(out), std::string::npos)
      << "docs/activations.md is stale; regenerate its table with `meshtrain bench activations`:\n"
      << out;
}

}  // namespace
}  // namespace meshtrain::train::test_activations
