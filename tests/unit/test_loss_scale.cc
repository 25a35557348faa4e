// The fp16 dynamic loss scaler's policy (optim/loss_scale.h): growth after a window of
// good steps, backoff on overflow, a floor, and the error when the scale is stuck there.
#include <gtest/gtest.h>

#include "optim/loss_scale.h"

namespace meshtrain::optim::test_loss_scale {
namespace {

TEST(LossScale, GrowsAfterAWindowAndBacksOffOnOverflow) {
  DynamicLossScaler s({.initial = 1024, .growth = 2, .backoff = 0.5, .growth_interval = 3,
                       .min_scale = 1, .max_skips_at_floor = 4});
  EXPECT_EQ(s.scale(), 1024);
  ASSERT_TRUE(s.update(false).is_ok());
  ASSERT_TRUE(s.update(false).is_ok());
  EXPECT_EQ(s.scale(), 1024) << "not before the window is full";
  ASSERT_TRUE(s.update(false).is_ok());
  EXPECT_EQ(s.scale(), 2048);
  ASSERT_TRUE(s.update(false).is_ok());
  ASSERT_TRUE(s.update(true).is_ok());
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_EQ(s.skipped_steps(), 1);
  // An overflow restarts the window.
  ASSERT_TRUE(s.update(false).is_ok());
  ASSERT_TRUE(s.update(false).is_ok());
  EXPECT_EQ(s.scale(), 1024);
  ASSERT_TRUE(s.update(false).is_ok());
  EXPECT_EQ(s.scale(), 2048);
}

TEST(LossScale, StuckAtTheFloorIsAnError) {
  DynamicLossScaler s({.initial = 4, .growth = 2, .backoff = 0.5, .growth_interval = 100,
                       .min_scale = 1, .max_skips_at_floor = 3});
  ASSERT_TRUE(s.update(true).is_ok());  // 4 -> 2
  ASSERT_TRUE(s.update(true).is_ok());  // 2 -> 1 (the floor)
  EXPECT_EQ(s.scale(), 1);
  ASSERT_TRUE(s.update(true).is_ok());   // at the floor: 1 of 3
  ASSERT_TRUE(s.update(false).is_ok());  // a good step resets the count
  ASSERT_TRUE(s.update(true).is_ok());
  ASSERT_TRUE(s.update(true).is_ok());
  const Status st = s.update(true);      // the third in a row at the floor
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("loss scale stuck at its floor 1"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("6 skipped in all"), std::string::npos) << st.message();
  EXPECT_EQ(s.scale(), 1) << "never below the floor";
}

TEST(LossScale, RestoresItsWholeState) {
  LossScaleConfig c{.initial = 64, .growth = 2, .backoff = 0.5, .growth_interval = 2,
                    .min_scale = 1, .max_skips_at_floor = 10};
  DynamicLossScaler a(c), b(c);
  for (bool o : {false, true, false}) ASSERT_TRUE(a.update(o).is_ok());
  b.restore(a.state());
  for (bool o : {false, false, true, false}) {
    ASSERT_TRUE(a.update(o).is_ok());
    ASSERT_TRUE(b.update(o).is_ok());
    EXPECT_EQ(a.scale(), b.scale());
    EXPECT_EQ(a.skipped_steps(), b.skipped_steps());
  }
}

}  // namespace
}  // namespace meshtrain::optim::test_loss_scale
