// PipeDream-2BW's update semantics on one rank (the reference the Pipeline suite's 2bw
// parity cells train against): W(t+1) = W(t) - lr * update(gradient at W(t-1)), the update
// AdamW with the global-norm clip. The trainer's delayed update (DataParallel's two weight
// versions) is checked against the same update written out by hand on a plain store: the
// weights before the last update swapped into the model for each step's passes.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "comm/self_group.h"
#include "data/loader.h"
#include "model/gpt.h"
#include "optim/adamw.h"
#include "parallel/data_parallel.h"
#include "thread_ranks_test_util.h"
#include "train/trainer.h"

namespace meshtrain::test_two_bw {
namespace {

constexpr int kSteps = 6;
const train::BatchShape kShape{2, 2, 16, 1, 0};  // 2 micro-batches of 2 rows of 16 tokens

struct Outcome {
  std::vector<float> losses, params;
};

// kSteps steps through the trainer, with or without the weight versions.
Outcome trainer_run(bool two_bw) {
  const model::GptConfig c = testing_util::small_gpt(2);
  const optim::AdamWConfig adamw = testing_util::test_adamw(1.0f);
  model::Gpt gpt(c);
  gpt.init_weights(11);
  comm::SelfGroup self("dp");
  parallel::DpConfig cfg;
  cfg.weight_versions = two_bw;
  parallel::DataParallel dp(gpt, self, cfg, adamw);
  const data::TokenLoader data = testing_util::random_tokens(2000);
  Outcome run;
  for (int k = 0; k < kSteps; k++)
    run.losses.push_back(train::train_step(gpt, dp, self, adamw, data, kShape, k, kSteps).loss);
  run.params.assign(gpt.params(), gpt.params() + gpt.layout().total());
  return run;
}

// The delayed update by hand: each step's passes run on the weights before the last
// update, the clipped AdamW update is applied to the current ones.
Outcome by_hand() {
  const model::GptConfig c = testing_util::small_gpt(2);
  const optim::AdamWConfig adamw = testing_util::test_adamw(1.0f);
  model::Gpt gpt(c);
  gpt.init_weights(11);
  comm::SelfGroup self("dp");
  parallel::DataParallel dp(gpt, self, {}, adamw);
  const data::TokenLoader data = testing_util::random_tokens(2000);
  const size_t n = gpt.layout().total();
  std::vector<float> previous(gpt.params(), gpt.params() + n), current(n);
  const int B = kShape.B, T = kShape.T, G = kShape.G();
  std::vector<int> inputs(B * T), targets(B * T);
  Outcome run;
  for (int k = 0; k < kSteps; k++) {
    std::copy(gpt.params(), gpt.params() + n, current.begin());
    std::copy(previous.begin(), previous.end(), gpt.params());  // W(t-1) for the passes
    dp.set_step(k);
    dp.begin_step(kShape.A);
    double loss = 0;
    for (int a = 0; a < kShape.A; a++) {
      data.fill(k, G, T, a * B, B, T, inputs.data(), targets.data());
      gpt.set_batch_position(k, (int64_t)a * B * T);
      loss += (double)gpt.forward(inputs.data(), targets.data(), B, T) * B * T;
      gpt.backward(1.0f / (float)(G * T));
      dp.end_micro_batch();
    }
    dp.finish_reductions();
    run.losses.push_back((float)(loss / (G * T)));
    previous = current;  // W(t) is the next step's
    std::copy(current.begin(), current.end(), gpt.params());
    const double norm = dp.grad_norm();
    dp.clip(norm, adamw.grad_clip);
    dp.optimizer_step(optim::learning_rate(adamw, k, kSteps), k + 1);  // W(t+1)
  }
  run.params.assign(gpt.params(), gpt.params() + n);
  return run;
}

TEST(TwoBw, OneRankAppliesTheDelayedUpdate) {
  const Outcome two_bw = trainer_run(true), hand = by_hand(), plain = trainer_run(false);
  for (int k = 0; k < kSteps; k++) {
    EXPECT_EQ(two_bw.losses[k], hand.losses[k]) << "step " << k + 1;
    // The first step computes at W(0) in both; every later one at weights one update old.
    if (k == 0) EXPECT_EQ(two_bw.losses[k], plain.losses[k]);
    else EXPECT_NE(two_bw.losses[k], plain.losses[k]) << "step " << k + 1 << ": the delay changes the loss";
  }
  ASSERT_EQ(two_bw.params.size(), hand.params.size());
  EXPECT_TRUE(two_bw.params == hand.params) << "the final weights are the same bytes";
}

}  // namespace
}  // namespace meshtrain::test_two_bw
