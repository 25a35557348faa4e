// The reporter's contract (train/reporter.h), in-process on one rank: events in their
// order, and a subscriber's Reply::kStop ending the run at that step, quietly and saved.
//
//   StopAtAStepEndsTheRunThereAndSavesIt  a subscriber that answers kStop at step 3 of 8:
//                         the run returns ok with stopped_by_request, three losses, three
//                         step records in metrics.jsonl, a checkpoint of step 3, and no
//                         later step's event nor on_finish/on_end.
//   EventsArriveInOrder   on_start, then per step begin, end, step; eval where it evaluates;
//                         on_finish, on_end: the documented order, on a run that completes.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "cli_test_util.h"
#include "comm/self_group.h"
#include "train/console.h"
#include "train/reporter.h"
#include "train/trainer.h"

namespace meshtrain::test_reporter {
namespace {

namespace fs = std::filesystem;

// Records every event as a word; answers kStop at `stop_at` (0: never).
class Recorder : public train::RunSubscriber {
 public:
  explicit Recorder(int64_t stop_at) : stop_at_(stop_at) {}
  void on_start(const train::StartReport&) override { events.push_back("start"); }
  void on_step_begin(int64_t k) override { events.push_back("begin " + std::to_string(k)); }
  void on_step_end(int64_t k) override { events.push_back("end " + std::to_string(k)); }
  train::Reply on_step(const train::StepReport& r) override {
    events.push_back("step " + std::to_string(r.step));
    return r.step == stop_at_ ? train::Reply::kStop : train::Reply::kContinue;
  }
  void on_eval(const train::EvalReport&) override { events.push_back("eval"); }
  Status on_finish() override {
    events.push_back("finish");
    return Status::ok();
  }
  void on_end(const train::EndReport&) override { events.push_back("end-of-run"); }
  std::vector<std::string> events;

 private:
  int64_t stop_at_;
};

class Reporter : public cli_test::CliTest {
 protected:
  train::TrainOptions options(int64_t steps) const {
    train::TrainOptions o;
    o.data_dir = corpus_;
    o.layers = 2, o.heads = 2, o.dim = 32, o.seq_len = 32, o.vocab = 50257;
    o.micro_batch = 2, o.steps = steps, o.threads = 1, o.eval_every = 4, o.eval_batches = 1;
    o.out_dir = dir_ + "/run";
    return o;
  }
  static train::Console quiet_console() {
    train::Console c;
    c.out = [](const std::string&) {}, c.flush = [] {}, c.err = [](const std::string&) {};
    return c;
  }
};

TEST_F(Reporter, StopAtAStepEndsTheRunThereAndSavesIt) {
  comm::SelfGroup world;
  Recorder stopper(3);
  train::TrainResult result;
  const Status s = train::run_training(options(8), world, quiet_console(), &result, &stopper);
  ASSERT_TRUE(s.is_ok()) << s.message();
  EXPECT_TRUE(result.stopped_by_request);
  EXPECT_EQ(result.interrupted_by, 0);
  EXPECT_EQ(result.losses.size(), 3u);
  const cli_test::Metrics m = cli_test::read_metrics(dir_ + "/run/metrics.jsonl");
  EXPECT_EQ(m.steps.size(), 3u);
  EXPECT_TRUE(fs::exists(dir_ + "/run/checkpoints/step_00000003")) << "the stopped step is saved";
  for (const std::string& e : stopper.events) {
    EXPECT_NE(e, "begin 4") << "no step after the stop";
    EXPECT_NE(e, "finish");
    EXPECT_NE(e, "end-of-run");
  }
  ASSERT_FALSE(stopper.events.empty());
  EXPECT_EQ(stopper.events.back(), "step 3");
}

TEST_F(Reporter, EventsArriveInOrder) {
  comm::SelfGroup world;
  Recorder listener(0);
  train::TrainResult result;
  ASSERT_TRUE(train::run_training(options(4), world, quiet_console(), &result, &listener).is_ok());
  EXPECT_FALSE(result.stopped_by_request);
  std::vector<std::string> want = {"start"};
  for (int k = 1; k <= 4; k++)
    for (const std::string& e : {"begin ", "end ", "step "}) want.push_back(e + std::to_string(k));
  want.push_back("eval");  // --eval-every 4: after step 4
  want.push_back("finish");
  want.push_back("end-of-run");
  EXPECT_EQ(listener.events, want);
}

}  // namespace
}  // namespace meshtrain::test_reporter
