// Sequence-length curriculum (train/curriculum.h): each schedule's lengths against the
// formula written out here, the tokens it counts, its errors, the LR schedule by tokens,
// the loader's shortened rows, and end to end: resume mid-curriculum bit for bit, MFU at the
// step's length, and dp and pp layouts training like one rank.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_test_util.h"
#include "core/memory.h"
#include "data/loader.h"
#include "model/gpt.h"
#include "multirank_test_util.h"
#include "optim/adamw.h"
#include "train/curriculum.h"

namespace meshtrain {
namespace {

using train::Curriculum;
using train::CurriculumOptions;

// The formula, independently: floor((k/N)^(1/r) (T - start) + start), down to a
// multiple of `step`, capped at T; T from step N on.
int expected_length(int64_t k, int T, int start, int N, double r, int step) {
  if (k >= N) return T;
  int L = (int)std::floor(std::pow((double)k / N, 1.0 / r) * (T - start) + start);
  L = L / step * step;
  return std::min(L, T);
}

Curriculum make(CurriculumOptions o, int T) {
  Curriculum c;
  const Status s = Curriculum::make(o, T, &c);
  EXPECT_TRUE(s.is_ok()) << s.message();
  return c;
}

TEST(Curriculum, LinearAndRootFollowTheFormula) {
  for (const char* schedule : {"linear", "root"}) {
    SCOPED_TRACE(schedule);
    CurriculumOptions o;
    o.kind = "seqlen", o.schedule = schedule, o.start = 64, o.steps = 100, o.step = 8, o.root = 3;
    const Curriculum c = make(o, 250);
    const double r = std::string(schedule) == "root" ? 3 : 1;
    for (int64_t k = 0; k < 130; k++) EXPECT_EQ(c.length(k), expected_length(k, 250, 64, 100, r, 8)) << "step " << k;
    EXPECT_EQ(c.length(0), 64);
    EXPECT_EQ(c.length(99) % 8, 0);
    EXPECT_EQ(c.length(100), 250) << "T itself, though not a multiple of 8, once the schedule ends";
  }
  // Written-out points: linear k = 50 of 100 is halfway, 64 + 96 = 160; root 2 at k = 25 too.
  CurriculumOptions o;
  o.kind = "seqlen", o.start = 64, o.steps = 100, o.step = 8;
  EXPECT_EQ(make(o, 256).length(50), 160);
  EXPECT_EQ(make(o, 256).length(1), 64) << "64 + 1.92, rounded down to a multiple of 8";
  o.schedule = "root", o.root = 2;
  EXPECT_EQ(make(o, 256).length(25), 160);
  CurriculumOptions linear;
  linear.kind = "seqlen", linear.start = 64, linear.steps = 100;
  EXPECT_GT(make(o, 256).length(5), make(linear, 256).length(5))
      << "the root schedule lengthens faster early";
}

TEST(Curriculum, DiscreteStepsThroughTheList) {
  CurriculumOptions o;
  o.kind = "seqlen", o.schedule = "discrete", o.discrete = "16:3,48:5";
  const Curriculum c = make(o, 64);
  const std::vector<int> want = {16, 16, 16, 48, 48, 64, 64};
  for (int k = 0; k < (int)want.size(); k++) EXPECT_EQ(c.length(k), want[k]) << "step " << k;
  EXPECT_EQ(c.lengths(), (std::vector<int>{16, 48, 64}));
}

TEST(Curriculum, OffIsTheFullLengthAndTokensSumTheLengths) {
  const Curriculum off = make(CurriculumOptions{}, 128);
  EXPECT_FALSE(off.on());
  EXPECT_EQ(off.length(0), 128);
  EXPECT_EQ(off.tokens_before(7, 4), 7 * 4 * 128);
  CurriculumOptions o;
  o.kind = "seqlen", o.start = 16, o.steps = 10, o.step = 16;
  const Curriculum c = make(o, 128);
  for (int64_t k : {0, 1, 5, 10, 11, 30}) {
    int64_t sum = 0;
    for (int64_t i = 0; i < k; i++) sum += 6 * c.length(i);
    EXPECT_EQ(c.tokens_before(k, 6), sum) << "step " << k;
  }
}

TEST(Curriculum, ErrorsNameTheFlag) {
  auto error = [](CurriculumOptions o, int T) {
    Curriculum c;
    const Status s = Curriculum::make(o, T, &c);
    EXPECT_FALSE(s.is_ok());
    return s.message();
  };
  CurriculumOptions base;
  base.kind = "seqlen", base.start = 64, base.steps = 10, base.step = 8;
  CurriculumOptions o = base;
  o.kind = "length";
  EXPECT_NE(error(o, 128).find("--curriculum must be none or seqlen"), std::string::npos);
  o = base, o.steps = 0;
  EXPECT_NE(error(o, 128).find("--curriculum-steps"), std::string::npos);
  o = base, o.start = 60;
  EXPECT_NE(error(o, 128).find("multiple of --curriculum-step"), std::string::npos);
  o = base, o.start = 256;
  EXPECT_NE(error(o, 128).find("longer than --seq-len 128"), std::string::npos);
  o = base, o.schedule = "cosine";
  EXPECT_NE(error(o, 128).find("--curriculum-schedule must be linear, root or discrete"), std::string::npos);
  o = base, o.schedule = "root", o.root = 0.5;
  EXPECT_NE(error(o, 128).find("--curriculum-root must be >= 1"), std::string::npos);
  o = base, o.schedule = "discrete", o.discrete = "64:10,32:20";
  EXPECT_NE(error(o, 128).find("must both increase, '32:20'"), std::string::npos);
  o.discrete = "64:10,x";
  EXPECT_NE(error(o, 128).find("'x' is not"), std::string::npos);
  o.discrete = "64:10,256:20";
  EXPECT_NE(error(o, 128).find("length 256 is longer than --seq-len 128"), std::string::npos);
  o = base, o.discrete = "64:10";
  EXPECT_NE(error(o, 128).find("needs --curriculum-schedule discrete"), std::string::npos);
  // A schedule flag without --curriculum seqlen is not silently ignored.
  o = base, o.kind = "none";
  EXPECT_NE(error(o, 128).find("--curriculum-steps needs --curriculum seqlen"), std::string::npos);
  o = CurriculumOptions{}, o.schedule = "root";
  EXPECT_NE(error(o, 128).find("--curriculum-schedule needs --curriculum seqlen"), std::string::npos);
}

// With every step the same length, the schedule by tokens is the schedule by steps.
TEST(Curriculum, LrByTokensIsLrByStepsWhenEveryStepIsFull) {
  optim::AdamWConfig c;
  c.lr = 1e-3f, c.min_lr = 1e-4f, c.warmup_steps = 5;
  const double per_step = 8.0 * 64;
  const int N = 40;
  for (int k = 0; k < N; k++)
    EXPECT_NEAR(optim::learning_rate_by_tokens(c, k * per_step, per_step, c.warmup_steps * per_step, N * per_step),
                optim::learning_rate(c, k, N), 1e-9)
        << "step " << k;
  // A short step advances the clock less: after a quarter-length warmup step the LR is a
  // quarter of a full one's.
  EXPECT_NEAR(optim::learning_rate_by_tokens(c, 0, per_step / 4, c.warmup_steps * per_step, N * per_step),
              optim::learning_rate(c, 0, N) / 4, 1e-9);
}

// A shortened row is the first L tokens of the row's T-token window; the window's position
// is that of T (data/loader.h).
TEST(Curriculum, ShortRowIsTheFirstTokensOfItsWindow) {
  std::vector<data::Token> tokens(1000);
  std::iota(tokens.begin(), tokens.end(), 0);
  const data::TokenLoader loader = data::TokenLoader::from_tokens(tokens);
  const int G = 4, T = 32, L = 8;
  for (int64_t step : {0, 3}) {
    std::vector<int> full_in(2 * T), full_tg(2 * T), in(2 * L), tg(2 * L);
    loader.fill(step, G, T, 1, 2, full_in.data(), full_tg.data());
    loader.fill(step, G, T, 1, 2, L, in.data(), tg.data());
    for (int r = 0; r < 2; r++)
      for (int i = 0; i < L; i++) {
        EXPECT_EQ(in[r * L + i], full_in[r * T + i]) << "step " << step << " row " << r << " token " << i;
        EXPECT_EQ(tg[r * L + i], full_tg[r * T + i]);
      }
    EXPECT_EQ(in[0], (int)(loader.window_start(step, G, T) + T)) << "row 1 starts one row of T into the window";
  }
}

// Activations reserved for the full length serve shorter rows in place: no more activation
// memory after the first forward (an evaluation between steps included), and forward and
// backward after a change of length give what a model without the reservation gives, bit
// for bit.
TEST(Curriculum, ReservedActivationsServeShorterRows) {
  model::GptConfig c;
  c.layers = 2, c.heads = 2, c.dim = 32, c.max_seq_len = 32, c.vocab = 97;
  std::vector<int> inputs(2 * 32), targets(2 * 32);
  for (size_t i = 0; i < inputs.size(); i++) inputs[i] = (int)(i * 7 % 97), targets[i] = (int)(i * 11 % 97);
  const std::vector<int> lengths = {8, 32, 16, 8, 24};
  // Each length's loss and gradient, from a fresh model's forward and backward.
  auto run = [&](bool reserve, std::vector<float>* losses, std::vector<std::vector<float>>* grads) {
    model::Gpt gpt(c);
    gpt.init_weights(5);
    if (reserve) gpt.reserve_activations(2, 32);
    const int64_t before = MemoryTracker::instance().stats().current[(int)MemCategory::kActivations];
    int64_t after_first = -1;
    for (int T : lengths) {
      gpt.zero_grads();
      losses->push_back(gpt.forward(inputs.data(), targets.data(), 2, T));
      gpt.backward(1.0f);
      grads->emplace_back(gpt.grads(), gpt.grads() + gpt.num_elements());
      if (T == 16) gpt.forward(inputs.data(), targets.data(), 2, 32);  // an evaluation: no backward
      const int64_t held = MemoryTracker::instance().stats().current[(int)MemCategory::kActivations] - before;
      if (after_first < 0) after_first = held;
      if (reserve) {
        EXPECT_EQ(held, after_first) << "allocated again at T = " << T;
      }
    }
  };
  std::vector<float> reserved_loss, plain_loss;
  std::vector<std::vector<float>> reserved_grads, plain_grads;
  run(true, &reserved_loss, &reserved_grads);
  run(false, &plain_loss, &plain_grads);
  for (size_t i = 0; i < lengths.size(); i++) {
    SCOPED_TRACE("T = " + std::to_string(lengths[i]));
    EXPECT_EQ(reserved_loss[i], plain_loss[i]);
    EXPECT_TRUE(reserved_grads[i] == plain_grads[i]);
  }
}

// ---- End to end ----------------------------------------------------------------------

class CurriculumCli : public cli_test::CliTest {};

using cli_test::bits;
using cli_test::describe;
using cli_test::kTiny;
using cli_test::read_metrics;
using cli_test::RunResult;

// kTiny has T = 32, B = 2: lengths 8, 8, 16, 24, then 32 over 4 steps (linear, step 8), and
// the LR clock by tokens.
const std::string kCurriculum =
    " --curriculum seqlen --curriculum-start 8 --curriculum-steps 4 --curriculum-step 8 --lr-unit tokens"
    " --warmup-steps 2";

TEST_F(CurriculumCli, StepsTrainAtTheirLengthAndResumeBitwise) {
  const std::string flags = kTiny + kCurriculum + " --steps 6 --save-every 3 --keep-checkpoints 0 --quiet";
  RunResult a = cli_test::run(train(flags + " --out " + path("A")));
  ASSERT_EQ(a.exit_code, 0) << describe(a);
  const cli_test::Metrics ma = read_metrics(path("A/metrics.jsonl"));
  ASSERT_EQ(ma.steps.size(), 6u);
  const std::vector<int> lengths = {8, 8, 16, 24, 32, 32};
  const nlohmann::json model = nlohmann::json::parse(cli_test::read_file(path("A/config.json")))["resolved_model"];
  const double per_length = 6.0 * model["layers"].get<int>() * model["dim"].get<int>();  // attention FLOPs per token
  int64_t tokens = 0;
  for (int s = 1; s <= 6; s++) {
    const nlohmann::json& m = ma.steps[s - 1];
    EXPECT_EQ(m["seq_len"], lengths[s - 1]) << "step " << s;
    tokens += 2 * lengths[s - 1];
    EXPECT_EQ(m["tokens"], tokens) << "step " << s;
    if (s > 1) {
      // MFU counts the step's FLOPs at its own length: FLOPs per token from the MFU, the peak
      // and the throughput differ between steps by exactly the attention term.
      const nlohmann::json& p = ma.steps[s - 2];
      auto flops_per_token = [](const nlohmann::json& x) {
        return x["mfu"].get<double>() * x["peak_gflops"].get<double>() * 1e9 / x["tokens_per_s"].get<double>();
      };
      EXPECT_NEAR(flops_per_token(m) - flops_per_token(p), per_length * (lengths[s - 1] - lengths[s - 2]),
                  1e-6 * flops_per_token(m))
          << "step " << s;
    }
  }
  // The LR clock by tokens: after step 2 the warmup has seen 2 rows of 8 + 8 tokens of its
  // 2 full steps' 2 x 2 x 32 (by steps it would be done).
  EXPECT_NEAR(ma.steps[1]["lr"].get<double>(), 6e-4 * 2 * (8 + 8) / (2.0 * 2 * 32), 1e-9);

  multirank_test::copy_interrupted_run(path("A"), path("B"), 3, 6);
  RunResult b = cli_test::run(train(flags + " --out " + path("B") + " --resume"));
  ASSERT_EQ(b.exit_code, 0) << describe(b);
  const cli_test::Metrics mb = read_metrics(path("B/metrics.jsonl"));
  ASSERT_EQ(mb.steps.size(), 6u);
  for (int s = 4; s <= 6; s++)
    for (const char* key : {"loss", "grad_norm", "lr", "tokens", "seq_len"})
      EXPECT_EQ(bits(ma.steps[s - 1][key]), bits(mb.steps[s - 1][key])) << key << " at step " << s;
  EXPECT_EQ(cli_test::read_file(path("A/checkpoints/step_00000006/shard_00000.bin")),
            cli_test::read_file(path("B/checkpoints/step_00000006/shard_00000.bin")));
}

// The same curriculum over dp 2 (ZeRO-1) and over pp 2 gives the one-rank losses within the
// parity tolerance of the dp and pp suites (1e-5).
TEST_F(CurriculumCli, DpAndPpLayoutsTrainLikeOneRank) {
  const std::string flags = kTiny + kCurriculum + " --steps 5 --global-batch 4 --quiet";
  RunResult one = cli_test::run(train(flags + " --out " + path("one")));
  ASSERT_EQ(one.exit_code, 0) << describe(one);
  const cli_test::Metrics ref = read_metrics(path("one/metrics.jsonl"));
  for (const auto& [name, layout] : {std::pair{"dp2", "--dp 2 --zero 1"}, std::pair{"pp2", "--pp 2 --schedule 1f1b"}}) {
    SCOPED_TRACE(layout);
    const std::string out = path(name);
    RunResult r = cli_test::run(train(flags + " " + std::string(layout) + " --out " + out));
    ASSERT_EQ(r.exit_code, 0) << describe(r);
    const cli_test::Metrics m = read_metrics(out + "/metrics.jsonl");
    ASSERT_EQ(m.steps.size(), ref.steps.size());
    for (size_t i = 0; i < m.steps.size(); i++) {
      EXPECT_EQ(m.steps[i]["seq_len"], ref.steps[i]["seq_len"]);
      EXPECT_NEAR(m.steps[i]["loss"].get<double>(), ref.steps[i]["loss"].get<double>(), 1e-5) << "step " << i + 1;
    }
  }
}

TEST_F(CurriculumCli, BadFlagsFailBeforeTraining) {
  cli_test::expect_failure(cli_test::run(train(kTiny + " --curriculum seqlen --curriculum-start 8 --steps 2")),
                           {"--curriculum-steps"});
  cli_test::expect_failure(
      cli_test::run(train(kTiny + " --curriculum seqlen --curriculum-start 64 --curriculum-steps 4 --steps 2")),
      {"--curriculum-start 64 is longer than --seq-len 32"});
  cli_test::expect_failure(cli_test::run(train(kTiny + " --lr-unit epochs --steps 2")),
                           {"--lr-unit must be steps or tokens"});
}

// A two-rank job (tp 2), so the sanitizer stage leaves it to the native one.
TEST_F(CurriculumCli, SpLengthsAreCheckedBeforeTraining) {
  // Sequence parallelism needs every length's tokens to split over tp: B=1, lengths 3, 15, 32.
  cli_test::expect_failure(
      cli_test::run(train("--model tiny --seq-len 32 --micro-batch 1 --tp 2 --sp --curriculum seqlen "
                          "--curriculum-start 3 --curriculum-step 3 --curriculum-steps 2 --steps 2")),
      {"--sp needs micro-batch x every curriculum length divisible by --tp 2; length 3"});
}

}  // namespace
}  // namespace meshtrain
