// Universal checkpoints (checkpoint/tp_reslice.h): a checkpoint written by tp ranks of one
// size loads into the slices of any other size, and any expert-tp, element for element.
// Writers are in-process ranks (comm::ThreadWorld) holding their slices of known whole
// tensors; every reader's parameters and Adam moments must equal its slice of those.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "comm/thread_group.h"
#include "model/gpt.h"
#include "model/param_layout.h"
#include "parallel/shard_layout.h"
#include "thread_ranks_test_util.h"

namespace meshtrain::test_checkpoint_reslice {

using model::ExpertTp;

model::GptConfig gpt2_shaped() {
  model::GptConfig c;
  c.layers = 2, c.heads = 4, c.dim = 32, c.max_seq_len = 16, c.vocab = 100;
  return c;
}

// Grouped-query attention with one key/value head: at tp 2 and 4 each rank holds a copy.
model::GptConfig llama_shaped() {
  model::GptConfig c = gpt2_shaped();
  c.kv_heads = 1, c.norm = model::Norm::kRmsNorm, c.positions = model::Positions::kRope;
  c.mlp = model::Mlp::kSwiGlu, c.bias = false, c.tied_head = false, c.ffn_dim = 48;
  return c;
}

model::GptConfig moe_shaped() {
  model::GptConfig c = llama_shaped();
  c.moe.experts = 4, c.moe.top_k = 2, c.moe.shared_experts = 1, c.moe.expert_ffn = 16;
  return c;
}

// The whole model's three sections (params, Adam m, Adam v), each distinct random values.
struct WholeState {
  std::vector<float> section[3];
};

WholeState random_state(const model::ParamLayout& whole) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  WholeState s;
  for (auto& v : s.section) {
    v.resize(whole.total());
    for (float& x : v) x = u(rng);
  }
  return s;
}

// Rank r's slice (layout `slice`) of a whole section.
std::vector<float> slice_of(const model::ParamLayout& slice, const model::ParamLayout& whole,
                            const std::vector<float>& global) {
  std::vector<float> local(slice.total(), 0.0f);
  for (const auto& t : slice.tensors())
    model::global_to_local(t, slice.tp(), slice.tp_rank(), global.data() + whole.find(t.name)->offset,
                           local.data() + t.offset);
  return local;
}

class CheckpointReslice : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing_util::scratch_dir("reslice", ::testing::UnitTest::GetInstance()->current_test_info()->name());
  }

  // Writes `state` as `tp` ranks with experts laid out `etp` would; returns the step folder.
  std::string write(const model::GptConfig& c, const WholeState& state, int tp, ExpertTp etp) {
    const model::ParamLayout whole(c);
    const std::string out = dir_ + "/tp" + std::to_string(tp) + (etp == ExpertTp::kReplicated ? "_whole" : "");
    comm::ThreadWorld world(tp);
    std::vector<Status> results(tp);
    comm::run_ranks(tp, [&](int r) {
      const model::ParamLayout slice(c, tp, r, {}, 1, 0, etp);
      std::vector<float> local[3];
      for (int k = 0; k < 3; k++) local[k] = slice_of(slice, whole, state.section[k]);
      const parallel::ShardLayout shards(slice, 1, 0);
      checkpoint::RankState st{local[0].data(), true, local[1].data(), local[2].data(), true, {}, {}};
      auto g = world.group(r);
      results[r] = checkpoint::save_checkpoint(out, 7, slice, c, shards, st, *g, nlohmann::json::object(), 0);
    });
    for (const Status& s : results) EXPECT_TRUE(s.is_ok()) << s.message();
    return out + "/checkpoints/step_00000007";
  }

  // Every rank of `tp` (experts `etp`) loads its slice: parameters whole, the moments as
  // dp rank 1 of 2's ZeRO shard. Each must equal its slice of `state`.
  void expect_loads(const std::string& dir, const model::GptConfig& c, const WholeState& state, int tp,
                    ExpertTp etp) {
    const model::ParamLayout whole(c);
    for (int r = 0; r < tp; r++) {
      SCOPED_TRACE(testing::Message() << "read at tp " << tp << " rank " << r
                                      << (etp == ExpertTp::kReplicated ? ", whole experts" : ""));
      const model::ParamLayout slice(c, tp, r, {}, 1, 0, etp);
      const parallel::ShardLayout shards(slice, 2, 1);
      std::vector<float> params(slice.total(), -9.0f), m(shards.local_total(), -9.0f), v(m.size(), -9.0f);
      checkpoint::RankState st{params.data(), true, m.data(), v.data(), false, {}, {}};
      int64_t step = 0;
      const Status s = checkpoint::load_checkpoint(dir, slice, c, shards, st, &step);
      ASSERT_TRUE(s.is_ok()) << s.message();
      EXPECT_EQ(step, 7);
      EXPECT_EQ(params, slice_of(slice, whole, state.section[0]));
      const std::vector<float>* loaded[2] = {&m, &v};
      for (int k = 1; k < 3; k++) {
        const std::vector<float> want = slice_of(slice, whole, state.section[k]);
        size_t mismatched = 0;
        for (size_t u = 0; u < shards.units().size(); u++)
          for (size_t i = shards.own_begin(u); i < shards.own_end(u); i++)
            mismatched += (*loaded[k - 1])[shards.units()[u].local_offset + (i - shards.own_begin(u))] != want[i];
        EXPECT_EQ(mismatched, 0u) << "section " << k;
      }
    }
  }

  std::string dir_;
};

TEST_F(CheckpointReslice, AnyTensorParallelSizeLoadsAnyOther) {
  for (const model::GptConfig& c : {gpt2_shaped(), llama_shaped()}) {
    SCOPED_TRACE(c.mlp == model::Mlp::kSwiGlu ? "llama-shaped, one kv head" : "gpt2-shaped");
    const WholeState state = random_state(model::ParamLayout(c));
    for (int written : {1, 2, 4}) {
      const std::string dir = write(c, state, written, ExpertTp::kSplit);
      for (int read : {1, 2, 4}) expect_loads(dir, c, state, read, ExpertTp::kSplit);
      std::filesystem::remove_all(dir_ + "/tp" + std::to_string(written));
    }
  }
}

TEST_F(CheckpointReslice, ExpertsMoveBetweenWholeAndSplit) {
  const model::GptConfig c = moe_shaped();
  const WholeState state = random_state(model::ParamLayout(c));
  for (ExpertTp written : {ExpertTp::kSplit, ExpertTp::kReplicated}) {
    const std::string dir = write(c, state, 2, written);
    for (int read : {1, 2, 4})
      for (ExpertTp etp : {ExpertTp::kSplit, ExpertTp::kReplicated}) expect_loads(dir, c, state, read, etp);
  }
}

// The single-process loader takes the whole model and its moments from a tp checkpoint.
TEST_F(CheckpointReslice, OneProcessGetsTheWholeModelAndItsMoments) {
  const model::GptConfig c = moe_shaped();
  const WholeState state = random_state(model::ParamLayout(c));
  const std::string dir = write(c, state, 4, ExpertTp::kReplicated);
  model::Gpt gpt(c, model::Gpt::LocalState::kParamsOnly);
  std::vector<float> m(gpt.layout().total()), v(m.size());
  int64_t step = 0;
  const Status s = checkpoint::load_checkpoint(dir, &gpt, m.data(), v.data(), &step);
  ASSERT_TRUE(s.is_ok()) << s.message();
  EXPECT_TRUE(std::equal(state.section[0].begin(), state.section[0].end(), gpt.params()));
  EXPECT_EQ(m, state.section[1]);
  EXPECT_EQ(v, state.section[2]);
}

}  // namespace meshtrain::test_checkpoint_reslice
