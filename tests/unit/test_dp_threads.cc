// DataParallel on in-process ranks (comm::ThreadWorld): dp 2 at every ZeRO stage trains as
// one rank does, in well under a second, with no mpirun. The same promise as the
// DataParallel suite's (tests/unit/test_data_parallel.cc over MPI), at its tolerance.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "comm/self_group.h"
#include "comm/thread_group.h"
#include "data/loader.h"
#include "model/gpt.h"
#include "parallel/data_parallel.h"
#include "thread_ranks_test_util.h"
#include "train/trainer.h"

namespace meshtrain::test_dp_threads {
namespace {

constexpr int kSteps = 5;

model::GptConfig small_model() { return testing_util::small_gpt(2); }
data::TokenLoader tokens() { return testing_util::random_tokens(2000); }
optim::AdamWConfig adamw() { return testing_util::test_adamw(1.0f); }

// Losses of kSteps steps of 4 rows: one rank with 2 micro-batches of 2 rows.
std::vector<float> one_rank() {
  const model::GptConfig c = small_model();
  model::Gpt gpt(c);
  gpt.init_weights(11);
  comm::SelfGroup self("dp");
  parallel::DataParallel dp(gpt, self, {}, adamw());
  const data::TokenLoader data = tokens();
  std::vector<float> losses;
  for (int k = 0; k < kSteps; k++)
    losses.push_back(train::train_step(gpt, dp, self, adamw(), data, {2, 2, 16, 1, 0}, k, kSteps).loss);
  return losses;
}

TEST(DataParallelThreads, EveryZeroStageTrainsAsOneRank) {
  const std::vector<float> reference = one_rank();
  const model::GptConfig c = small_model();
  model::Gpt full(c);
  full.init_weights(11);
  const data::TokenLoader data = tokens();
  for (int zero = 0; zero <= 3; zero++) {
    SCOPED_TRACE(testing::Message() << "zero " << zero);
    comm::ThreadWorld world(2);
    std::vector<std::vector<float>> losses(2);
    comm::run_ranks(2, [&](int r) {
      std::unique_ptr<comm::Group> g = world.group(r, "dp");
      model::Gpt gpt(c, parallel::model_state_for_stage(zero));
      if (zero < 3) gpt.init_weights(11);
      parallel::DataParallel dp(gpt, *g, {zero, 25, true}, adamw(), full.params());
      for (int k = 0; k < kSteps; k++)
        losses[r].push_back(train::train_step(gpt, dp, *g, adamw(), data, {2, 1, 16, 2, r}, k, kSteps).loss);
    });
    for (int k = 0; k < kSteps; k++) {
      EXPECT_EQ(losses[0][k], losses[1][k]) << "step " << k;  // every rank reports the global loss
      EXPECT_NEAR(losses[0][k], reference[k], 1e-5) << "step " << k;
    }
  }
}

}  // namespace
}  // namespace meshtrain::test_dp_threads
