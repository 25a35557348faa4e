// The model record: presets with their published parameter counts, the architecture parts
// and their validation, the JSON round trip checkpoints rely on, and the layout each
// architecture gets.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "model/config.h"
#include "model/config_json.h"
#include "model/param_layout.h"

namespace meshtrain::model::test_model_config {
namespace {

GptConfig preset(const std::string& name) {
  GptConfig c;
  EXPECT_TRUE(preset_config(name, &c).is_ok()) << name;
  return c;
}

// Published counts (Touvron et al. 2023; Grattafiori et al. 2024; Hugging Face's model cards,
// which give 6.74B, 13.0B, 69.0B, 8.03B, 70.6B and 405.9B). GPT-2 124M as in Radford et al.
TEST(ModelConfig, PresetsHaveTheirPublishedParameterCounts) {
  const std::pair<const char*, double> published[] = {
      {"gpt2-124m", 124.44e6}, {"llama2-7b", 6.738e9},  {"llama2-13b", 13.016e9}, {"llama2-70b", 68.977e9},
      {"llama3-8b", 8.030e9},  {"llama3-70b", 70.554e9}, {"llama3-405b", 405.853e9}};
  for (const auto& [name, count] : published)
    EXPECT_NEAR((double)num_parameters(preset(name)), count, 0.001 * count) << name;
  // The trainable llama-shaped one sits next to gpt2-124m.
  EXPECT_NEAR((double)num_parameters(preset("llama-124m")), 121.2e6, 0.1e6);
}

TEST(ModelConfig, LlamaPartsAndWidthRule) {
  EXPECT_EQ(llama_ffn_dim(4096), 11008);  // Llama 2 7B: 2/3 of 4C, to a multiple of 256
  EXPECT_EQ(llama_ffn_dim(768, 256, 1.125), 2304);
  const GptConfig c = preset("llama3-8b");
  EXPECT_EQ(arch_name(c), "llama");
  EXPECT_EQ(c.kv_head_count(), 8);
  EXPECT_EQ(c.qkv_dim(), 4096 + 2 * 1024);
  EXPECT_EQ(c.fc_dim(), 2 * 14336);
  EXPECT_FALSE(c.tied_head);
  EXPECT_EQ(preset("llama3-405b").rope_scaling.factor, 8);
  EXPECT_EQ(arch_name(preset("gpt2-124m")), "gpt2");
  GptConfig g = preset("tiny");
  ASSERT_TRUE(apply_arch("llama", &g).is_ok());
  EXPECT_EQ(arch_name(g), "llama");
  ASSERT_TRUE(apply_arch("gpt2", &g).is_ok());
  EXPECT_EQ(config_json(g), config_json(preset("tiny"))) << "gpt2 restores every part";
  g.kv_heads = 2;
  EXPECT_EQ(arch_name(g), "custom");
  EXPECT_FALSE(apply_arch("mamba", &g).is_ok());
}

TEST(ModelConfig, BadPartsAreNamed) {
  auto fails = [](GptConfig c, const std::string& part) {
    const Status s = validate(c);
    ASSERT_FALSE(s.is_ok()) << part;
    EXPECT_NE(s.message().find(part), std::string::npos) << s.message();
  };
  GptConfig c = preset("llama-tiny");
  ASSERT_TRUE(validate(c).is_ok());
  GptConfig kv = c;
  kv.kv_heads = 3;
  fails(kv, "--kv-heads 3 must divide --heads 4");
  GptConfig odd = c;
  odd.dim = 60, odd.heads = 4;  // head width 15
  fails(odd, "even head width");
  GptConfig theta = c;
  theta.rope_theta = 0.5;
  fails(theta, "--rope-theta");
  // 2 key/value heads: split over 2 ranks, replicated over 4 (each head on 2 ranks).
  EXPECT_TRUE(validate_tp(c, 2).is_ok());
  EXPECT_TRUE(validate_tp(c, 4).is_ok());
  EXPECT_EQ(c.kv_heads_per_rank(2), 1);
  EXPECT_EQ(c.kv_replicas(2), 1);
  EXPECT_EQ(c.kv_heads_per_rank(4), 1);
  EXPECT_EQ(c.kv_replicas(4), 2);
  EXPECT_EQ(c.qkv_dim_per_rank(4), 64 / 4 + 2 * 16);
  GptConfig three = c;  // 3 key/value heads over 2 ranks: neither splits nor divides
  three.dim = 96, three.heads = 6, three.kv_heads = 3, three.ffn_dim = 256;
  const Status tp = validate_tp(three, 2);
  ASSERT_FALSE(tp.is_ok());
  EXPECT_NE(tp.message().find("--tp 2 and the 3 key/value heads"), std::string::npos) << tp.message();
}

TEST(ModelConfig, JsonRoundTripsEveryPart) {
  GptConfig c = preset("llama3-405b");
  c.vocab = 1000, c.layers = 3;  // any shape
  GptConfig back;
  back.layers = c.layers, back.heads = c.heads, back.dim = c.dim, back.max_seq_len = c.max_seq_len, back.vocab = c.vocab;
  ASSERT_TRUE(read_architecture(config_json(c), "model", &back).is_ok());
  EXPECT_TRUE(same_model(c, back)) << config_json(c).dump() << "\nvs\n" << config_json(back).dump();
  // An index from before the parts existed reads as GPT-2.
  GptConfig old = preset("tiny");
  ASSERT_TRUE(read_architecture(nlohmann::json{{"layers", 2}}, "model", &old).is_ok());
  EXPECT_EQ(arch_name(old), "gpt2");
  // Wrong types and values are named.
  for (const auto& [key, value, part] :
       {std::tuple{"norm", nlohmann::json("batchnorm"), "model.norm must be \"layernorm\" or \"rmsnorm\""},
        {"kv_heads", nlohmann::json(-1), "model.kv_heads"},
        {"bias", nlohmann::json(1), "model.bias must be true or false"},
        {"rope_theta", nlohmann::json("big"), "model.rope_theta"}}) {
    GptConfig x;
    const Status s = read_architecture(nlohmann::json{{key, value}}, "model", &x);
    ASSERT_FALSE(s.is_ok()) << key;
    EXPECT_NE(s.message().find(part), std::string::npos) << s.message();
  }
}

// Llama's layout: Hugging Face's names, no biases, q/k/v and gate/up back to back (so the
// fused projections are one contiguous weight), the untied head in the final unit; each
// unit's size the formula's.
TEST(ModelConfig, LlamaLayoutIsHuggingFacesAndFusesByPosition) {
  const GptConfig c = preset("llama-tiny");
  const ParamLayout layout(c);
  const int64_t C = c.dim, KV = c.kv_dim(), F = c.ffn(), Vp = c.padded_vocab();
  EXPECT_EQ(layout.wte().name, "model.embed_tokens.weight");
  EXPECT_FALSE(layout.has_wpe());
  EXPECT_FALSE(layout.has(0, kQkvB));
  EXPECT_FALSE(layout.has(0, kLn1B));
  EXPECT_EQ(layout.layer(1, kQkvW).name, "model.layers.1.self_attn.q_proj.weight");
  const ParamTensor* k = layout.find("model.layers.1.self_attn.k_proj.weight");
  const ParamTensor* v = layout.find("model.layers.1.self_attn.v_proj.weight");
  ASSERT_TRUE(k && v);
  EXPECT_EQ(k->offset, layout.layer(1, kQkvW).offset + C * C);
  EXPECT_EQ(v->offset, k->offset + KV * C);
  const ParamTensor* up = layout.find("model.layers.1.mlp.up_proj.weight");
  ASSERT_TRUE(up);
  EXPECT_EQ(layout.layer(1, kFcW).name, "model.layers.1.mlp.gate_proj.weight");
  EXPECT_EQ(up->offset, layout.layer(1, kFcW).offset + F * C);
  EXPECT_TRUE(layout.has_untied_head());
  EXPECT_EQ(layout.head().name, "lm_head.weight");
  EXPECT_EQ(layout.unit_of(layout.head()), layout.final_unit());
  ASSERT_EQ(layout.num_units(), c.layers + 2);
  EXPECT_EQ((int64_t)layout.units()[0].numel, Vp * C);
  EXPECT_EQ((int64_t)layout.units()[1].numel, 2 * C + C * C + 2 * KV * C + C * C + 3 * F * C);
  EXPECT_EQ((int64_t)layout.units().back().numel, C + Vp * C);
  EXPECT_EQ((int64_t)layout.total() - 2 * (Vp - c.vocab) * C, num_parameters(c));
  // A last pipeline stage of an untied model does not hold the embedding.
  const ParamLayout last(c, 1, 0, ModelPart{{{1, 2}}});
  EXPECT_FALSE(last.has_embedding());
  EXPECT_TRUE(last.has_final_norm());
  // GPT-2's layout is unchanged: its names, and the tied head is wte.
  const ParamLayout gpt2(preset("tiny"));
  EXPECT_EQ(gpt2.layer(0, kQkvW).name, "h.0.attn.c_attn.weight");
  EXPECT_FALSE(gpt2.has_untied_head());
  const ParamLayout gpt2_last(preset("tiny"), 1, 0, ModelPart{{{1, 2}}});
  EXPECT_TRUE(gpt2_last.has_embedding());
}

}  // namespace
}  // namespace meshtrain::model::test_model_config
