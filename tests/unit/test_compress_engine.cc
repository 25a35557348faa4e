// Gradient compression in the engine (parallel/dp/compressed_reduce.h, `train --compress`):
// the steps before --compress-start are the plain run's bit for bit, the compressed steps
// send exactly the compressor's bytes (counted by the comm layer, checked against the
// formula from the model's tensors), the compressed run trains within a stated gap of the
// plain one, composes with pipelines, and bad combinations are refused before training.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include <nlohmann/json.hpp>

#include "cli_test_util.h"
#include "model/config.h"
#include "model/param_layout.h"

namespace meshtrain::test_compress_engine {
namespace {

class CompressCli : public cli_test::CliTest {
 protected:
  // One thread per rank: four ranks share the machine's cores.
  static std::string train1(const std::string& args) {
    return cli_test::kBinary + " train --data " + corpus_ + " --peak-gflops 100 --threads 1 " + args;
  }
};

using cli_test::describe;
using cli_test::kTiny;
using cli_test::read_metrics;
using cli_test::RunResult;

// PowerSGD's bytes per rank and step for the tiny model at rank r over N ranks, from the
// layout's tensors: every matrix with r (n + m) < n m sends P (n x r) and Q (m x r); every
// other element is all-reduced exactly; each of the three all-reduces moves 2 (N-1)/N of its
// bytes.
int64_t powersgd_bytes(int r, int N) {
  model::GptConfig c;
  EXPECT_TRUE(model::preset_config("tiny", &c).is_ok());
  c.vocab = 50257, c.max_seq_len = 32;
  const model::ParamLayout layout(c);
  int64_t low_rank = 0, exact = (int64_t)layout.total();
  for (const model::ParamTensor& t : layout.tensors()) {
    if (t.shape.size() != 2) continue;
    const int64_t n = t.shape[0], m = t.shape[1];
    if (r * (n + m) >= n * m) continue;
    low_rank += r * (n + m);
    exact -= n * m;
  }
  auto all_reduce = [&](int64_t elements) { return 2 * (N - 1) * elements * 4 / N; };
  return all_reduce(low_rank) + all_reduce(exact);
}

TEST_F(CompressCli, PowerSgdIsPlainBeforeItsStartThenSendsItsFormula) {
  const std::string flags = kTiny + " --dp 2 --steps 5 --quiet";
  RunResult plain = cli_test::run(train1(flags + " --out " + path("plain")));
  ASSERT_EQ(plain.exit_code, 0) << describe(plain);
  RunResult psgd = cli_test::run(train1(flags + " --compress powersgd --compress-start 2 --powersgd-rank 2 --out " + path("psgd")));
  ASSERT_EQ(psgd.exit_code, 0) << describe(psgd);
  const cli_test::Metrics a = read_metrics(path("plain/metrics.jsonl")), b = read_metrics(path("psgd/metrics.jsonl"));
  ASSERT_EQ(a.steps.size(), 5u);
  ASSERT_EQ(b.steps.size(), 5u);
  const int64_t formula = powersgd_bytes(2, 2);
  for (size_t i = 0; i < 5; i++) {
    SCOPED_TRACE("step " + std::to_string(i + 1));
    const int64_t bytes = b.steps[i]["comm"]["dp"]["bytes"].get<int64_t>() - 8;  // less the loss's fp64 sum
    if (i < 2) {
      EXPECT_EQ(b.steps[i]["loss"], a.steps[i]["loss"]);
      EXPECT_EQ(b.steps[i]["grad_norm"], a.steps[i]["grad_norm"]);
      EXPECT_EQ(b.steps[i]["comm"]["dp"]["bytes"], a.steps[i]["comm"]["dp"]["bytes"]);
    } else {
      EXPECT_EQ(bytes, formula);
      EXPECT_NE(b.steps[i]["grad_norm"], a.steps[i]["grad_norm"]);  // the compressed gradient
    }
  }
  // The compressed steps send under 1/20 of the plain all-reduce.
  EXPECT_LT(20 * formula, a.steps[4]["comm"]["dp"]["bytes"].get<int64_t>());
}

TEST_F(CompressCli, PowerSgdTrainsNearAdamWithPipelines) {
  // pp 2 x dp 2: each stage's dp group compresses its own units; the tied embedding's copies
  // are summed after. 8 steps of the tiny model at rank 4 from step 3, one thread per rank
  // (four ranks on the machine's cores).
  const std::string flags = kTiny + " --pp 2 --dp 2 --schedule 1f1b --grad-accum 2 --steps 8 --quiet";
  RunResult plain = cli_test::run(train1(flags + " --out " + path("plain")));
  ASSERT_EQ(plain.exit_code, 0) << describe(plain);
  RunResult psgd = cli_test::run(train1(flags + " --compress powersgd --compress-start 2 --out " + path("psgd")));
  ASSERT_EQ(psgd.exit_code, 0) << describe(psgd);
  const cli_test::Metrics a = read_metrics(path("plain/metrics.jsonl")), b = read_metrics(path("psgd/metrics.jsonl"));
  ASSERT_EQ(b.steps.size(), 8u);
  const double first = b.steps[0]["loss"].get<double>(), last = b.steps[7]["loss"].get<double>();
  const double plain_last = a.steps[7]["loss"].get<double>();
  EXPECT_LT(last, first - 0.1);  // it trains (0.19 when written)
  // The gap when this test was written: 0.0007 (10.6289 against 10.6296); the bound leaves
  // room for other machines' rounding, far below the 0.19 the run itself moves.
  EXPECT_NEAR(last, plain_last, 0.02);
}

TEST_F(CompressCli, BadCombinationsFailBeforeTraining) {
  cli_test::expect_failure(cli_test::run(train(kTiny + " --compress topk --steps 2")),
                           {"--compress must be none or powersgd, got 'topk'"});
  cli_test::expect_failure(cli_test::run(train(kTiny + " --compress powersgd --zero 1 --steps 2")),
                           {"--compress powersgd runs with --zero 0", "--zero 1"});
  cli_test::expect_failure(cli_test::run(train(kTiny + " --compress powersgd --precision bf16 --steps 2")),
                           {"needs --precision fp32"});
  cli_test::expect_failure(cli_test::run(train(kTiny + " --compress powersgd --powersgd-rank 0 --steps 2")),
                           {"--powersgd-rank must be >= 1"});
  cli_test::expect_failure(cli_test::run(train(kTiny + " --compress-start 3 --steps 2")),
                           {"need --compress powersgd"});
}

}  // namespace
}  // namespace meshtrain::test_compress_engine
