// A zero-bubble schedule's W (model::PipelineState::weight_pass): the weight gradients a B left.
//
// TiedHead: a rank that holds the first and the last stage in two chunks (zb-v's rank 0, in the V)
// with a tied head: both chunks' backwards add into the embedding's gradient, and their
// interleaving follows the schedule's list, which zb-v places for measured costs. The
// gradient must not depend on that interleaving (runs repeat bit for bit), and it must be
// the whole model's gradient (the one-chunk model's, within float rounding).
//
// SequenceParallelW: under sp the QKV and fc1 weight gradients read every row of their
// input, which each tp rank holds a sequence shard of; the W gathers the rows again from the
// stored shard instead of keeping a gathered copy from its B.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "comm/mesh.h"
#include "comm/thread_group.h"
#include "data/loader.h"
#include "model/gpt.h"
#include "thread_ranks_test_util.h"

namespace meshtrain::test_weight_pass {
namespace {

constexpr int kB = 2, kT = 16, kMicroBatches = 3;

// The two chunks' backwards of every micro-batch: each micro-batch's last-stage B before
// its first-stage B, the micro-batches of a chunk in order, the two chunks interleaved as
// `order` says (true: a last-stage B next, while one is left).
std::vector<float> gradients(const std::vector<bool>& order) {
  const model::GptConfig c = testing_util::small_gpt(2);
  model::Gpt gpt(c, model::Gpt::LocalState::kParamsAndGrads, nullptr, false, model::ModelPart{{{0, 1}, {1, 2}}});
  gpt.init_weights(5);
  gpt.zero_grads();
  gpt.pipeline().tied_head().set_last_micro_batch(kMicroBatches - 1);
  const data::TokenLoader data = testing_util::random_tokens(4000);
  std::vector<int> inputs(kB * kT), targets(kB * kT);
  for (int mb = 0; mb < kMicroBatches; mb++) {
    data.fill(0, kMicroBatches * kB, kT, mb * kB, kB, kT, inputs.data(), targets.data());
    gpt.forward_chunk(0, mb, inputs.data(), targets.data(), nullptr, kB, kT);
    gpt.forward_chunk(1, mb, inputs.data(), targets.data(), gpt.chunk_output(0, mb), kB, kT);
  }
  const size_t n = gpt.boundary_elements(kB, kT);
  std::vector<std::vector<float>> douts(kMicroBatches);
  int last = 0, first = 0;  // backwards run so far, per chunk
  for (size_t i = 0; first < kMicroBatches; i++) {
    const bool head_next = last < kMicroBatches && (last == first || (i < order.size() && order[i]));
    if (head_next) {
      gpt.backward_chunk(1, last, nullptr, 1.0f / (kMicroBatches * kB * kT));
      douts[last].assign(gpt.input_grad(), gpt.input_grad() + n);
      last++;
    } else {
      gpt.backward_chunk(0, first, douts[first].data(), 1.0f);
      first++;
    }
  }
  return std::vector<float>(gpt.grads(), gpt.grads() + gpt.layout().total());
}

TEST(TiedHead, TwoChunksSumTheSameWhateverTheirOrder) {
  // B1(0) B0(0) B1(1) B0(1) B1(2) B0(2), against all last-stage Bs first, and a mix.
  const std::vector<float> alternating = gradients({false, false, false, false, false, false});
  const std::vector<float> heads_first = gradients({true, true, true, true, true, true});
  const std::vector<float> mixed = gradients({true, true, false, false, false, false});
  ASSERT_EQ(alternating.size(), heads_first.size());
  EXPECT_EQ(std::memcmp(alternating.data(), heads_first.data(), alternating.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(alternating.data(), mixed.data(), alternating.size() * sizeof(float)), 0);

  // The same gradient as the one-chunk model's forward and backward over the micro-batches.
  const model::GptConfig c = testing_util::small_gpt(2);
  model::Gpt whole(c);
  whole.init_weights(5);
  whole.zero_grads();
  const data::TokenLoader data = testing_util::random_tokens(4000);
  std::vector<int> inputs(kB * kT), targets(kB * kT);
  for (int mb = 0; mb < kMicroBatches; mb++) {
    data.fill(0, kMicroBatches * kB, kT, mb * kB, kB, kT, inputs.data(), targets.data());
    whole.forward(inputs.data(), targets.data(), kB, kT);
    whole.backward(1.0f / (kMicroBatches * kB * kT));
  }
  ASSERT_EQ((size_t)whole.layout().total(), alternating.size());
  double worst = 0, largest = 0;
  for (size_t i = 0; i < alternating.size(); i++) {
    worst = std::max(worst, (double)std::abs(alternating[i] - whole.grads()[i]));
    largest = std::max(largest, (double)std::abs(whole.grads()[i]));
  }
  // Only the order of the float sums differs: a few units in the last place of the
  // largest gradient.
  EXPECT_LE(worst, 1e-6 * largest) << "largest gradient " << largest;
}


// What a B keeps for its W, and the gradient after the W, on each of 2 tp ranks (threads),
// with and without sequence parallelism; and the same rank's gradient from a plain backward.
struct TpPass {
  int64_t kept = 0;                      // bytes a B keeps for its W
  std::vector<float> deferred, at_once;  // gradients: B then W, and one backward
};

std::vector<TpPass> tp_passes(bool sp) {
  const model::GptConfig c = testing_util::small_gpt(2);
  model::Gpt whole(c);
  whole.init_weights(9);
  const data::TokenLoader data = testing_util::random_tokens(4000);
  std::vector<int> inputs(kB * kT), targets(kB * kT);
  data.fill(0, kB, kT, 0, kB, kT, inputs.data(), targets.data());
  constexpr int kTp = 2;
  comm::ThreadWorld world(kTp);
  comm::MeshShape shape;
  shape.tp = kTp;
  std::vector<TpPass> out(kTp);
  comm::run_ranks(kTp, [&](int r) {
    auto group = world.group(r);
    comm::Mesh mesh(*group, shape);
    model::Gpt gpt(c, model::Gpt::LocalState::kParamsAndGrads, &mesh.tp(), sp);
    gpt.set_from_global(whole.params());
    const float scale = 1.0f / (kB * kT);
    gpt.zero_grads();
    gpt.forward_chunk(0, 0, inputs.data(), targets.data(), nullptr, kB, kT);
    gpt.backward_chunk(0, 0, nullptr, scale, /*defer_weights=*/true);
    out[r].kept = gpt.pipeline().weights().pending_bytes();
    gpt.pipeline().weight_pass(0, 0, *gpt.param_store());
    EXPECT_EQ(gpt.pipeline().weights().pending_bytes(), 0);
    out[r].deferred.assign(gpt.grads(), gpt.grads() + gpt.layout().total());
    gpt.zero_grads();
    gpt.forward_chunk(0, 0, inputs.data(), targets.data(), nullptr, kB, kT);
    gpt.backward_chunk(0, 0, nullptr, scale);
    out[r].at_once.assign(gpt.grads(), gpt.grads() + gpt.layout().total());
  });
  return out;
}

TEST(SequenceParallelW, GathersItsInputsAgainInsteadOfKeepingThem) {
  const std::vector<TpPass> plain = tp_passes(false), sp = tp_passes(true);
  for (int r = 0; r < 2; r++) {
    SCOPED_TRACE("tp rank " + std::to_string(r));
    // The output gradients are the same full rows either way; the inputs are in the set
    // (the norms' outputs without sp, their shard with sp), so nothing more is kept.
    EXPECT_GT(sp[r].kept, 0);
    EXPECT_EQ(sp[r].kept, plain[r].kept);
    // And the W's gradient is the one-pass backward's, bit for bit.
    for (const TpPass* p : {&plain[r], &sp[r]}) {
      ASSERT_EQ(p->deferred.size(), p->at_once.size());
      EXPECT_EQ(std::memcmp(p->deferred.data(), p->at_once.data(), p->deferred.size() * sizeof(float)), 0);
    }
  }
}

}  // namespace
}  // namespace meshtrain::test_weight_pass
