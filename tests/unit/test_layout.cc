// parallel/layout.h: one layout value, one table of rules. The engine's check (what the
// launcher runs before mpirun and every rank runs first), the local planner and the GPU
// planner all read the same rules: over a grid of layouts they refuse the same ones with the
// same reasons, except the rules that name who they bind (an engine limit, a cost-model
// limit).
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "parallel/layout.h"
#include "planner/time_model.h"
#include "train/options.h"
#include "train/run.h"

namespace meshtrain {
namespace {

using parallel::LayoutReader;
using parallel::pp::ScheduleKind;

// A small dense model the grid splits: 4 layers, 4 heads of 16, vocabulary 256.
model::GptConfig grid_model() {
  model::GptConfig c;
  EXPECT_TRUE(model::preset_config("tiny", &c).is_ok());
  c.layers = 4, c.heads = 4, c.dim = 64, c.vocab = 256, c.max_seq_len = 64;
  return c;
}

train::TrainOptions grid_options() {
  train::TrainOptions o;
  o.layers = 4, o.heads = 4, o.dim = 64, o.vocab = 256, o.seq_len = 64;
  o.data_dir = "/nonexistent";  // (the vocabulary is given: no data is read)
  return o;
}

std::set<std::string> names(const std::vector<parallel::LayoutError>& errors) {
  std::set<std::string> out;
  for (const auto& e : errors) out.insert(e.rule);
  return out;
}

TEST(Layout, ValidateListsEveryBrokenRuleWithItsReason) {
  parallel::Layout l;
  l.tp = 3, l.dp = 2, l.pp = 1, l.zero = 3, l.ep = 4;
  l.schedule = ScheduleKind::kInterleaved, l.virtual_stages = 2;
  l.quantized.grads = false, l.quantized.weights = false;
  l.compression.kind = parallel::Compression::Kind::kPowerSgd;
  l.micro_batch = 2, l.global_batch = 6;
  const auto errors = parallel::validate(l, parallel::layout_model(grid_model()), LayoutReader::kEngine);
  EXPECT_EQ(names(errors), (std::set<std::string>{"global-batch", "tp-splits-model", "ep-inside-dp",
                                                   "ep-splits-experts", "schedule-needs-pipeline",
                                                   "compression-zero"}));
  const Status s = parallel::check_layout(l, parallel::layout_model(grid_model()), LayoutReader::kEngine);
  for (const char* part : {"--global-batch 6 is not divisible by --micro-batch x dp = 2 x 2",
                           "--tp 3 does not divide the number of heads (4)",
                           "--ep 4 must divide the data-parallel size dp = 2",
                           "--ep 4 needs a Mixture-of-Experts model",
                           "--schedule interleaved needs --pp > 1",
                           "--compress powersgd runs with --zero 0 (its bucket all-reduce), got --zero 3"})
    EXPECT_NE(s.message().find(part), std::string::npos) << part << "\nin\n" << s.message();
  EXPECT_EQ(std::count(s.message().begin(), s.message().end(), '\n'), 5) << "one reason per line";
}

TEST(Layout, ALegalLayoutBreaksNoRule) {
  parallel::Layout l;
  l.tp = 2, l.dp = 2, l.pp = 2, l.zero = 1, l.sp = true;
  l.schedule = ScheduleKind::kInterleaved, l.virtual_stages = 2;
  l.micro_batch = 1, l.global_batch = 4;
  EXPECT_TRUE(parallel::validate(l, parallel::layout_model(grid_model()), LayoutReader::kEngine).empty());
}

// Only the rules named as one reader's bind differently.
TEST(Layout, EngineLimitsBindTheLocalPlannerNotTheGpuPlanner) {
  parallel::Layout l;
  l.dp = 2, l.micro_batch = 1, l.global_batch = 2;
  l.precision = kernels::Precision::kBf16;
  l.compression.kind = parallel::Compression::Kind::kPowerSgd;
  const parallel::LayoutModel m = parallel::layout_model(grid_model());
  EXPECT_EQ(names(parallel::validate(l, m, LayoutReader::kEngine)), std::set<std::string>{"compression-fp32"});
  EXPECT_EQ(names(parallel::validate(l, m, LayoutReader::kLocalPlanner)), std::set<std::string>{"compression-fp32"});
  EXPECT_TRUE(parallel::validate(l, m, LayoutReader::kGpuPlanner).empty());
}

// One cell of a grid: the engine's verdict (train::check_flags_and_layout: what the
// launcher and every rank run) and the planners' (planner::validate on the same layout, as
// predict and predict_local call it) must be the same text: the local planner's exactly,
// the GPU planner's without the engine's own limits.
struct GridCounts {
  int cells = 0, refused = 0, engine_only = 0;
};

void expect_one_verdict(const train::TrainOptions& o, int world, const model::GptConfig& config, int T,
                        GridCounts* n) {
  const planner::ModelShape shape = planner::model_shape(config, T);
  const parallel::LayoutModel lm = parallel::layout_model(config);
  const Status engine = train::check_flags_and_layout(o, world);
  planner::Layout l;
  ASSERT_TRUE(train::to_layout(o, world, &l).is_ok());
  const Status local = planner::validate(shape, l, LayoutReader::kLocalPlanner);
  const Status local_vocab = parallel::check_layout(l, lm, LayoutReader::kLocalPlanner);
  const Status gpu = planner::validate(shape, l, LayoutReader::kGpuPlanner);
  n->cells++;
  n->refused += !engine.is_ok();
  EXPECT_EQ(engine.message(), local_vocab.message());
  // (The planner's model shape has no padded vocabulary to split; 256 rows split over every
  // tp of the grid that splits the heads.)
  EXPECT_EQ(engine.message(), local.message());
  const auto gpu_rules = parallel::validate(l, lm, LayoutReader::kGpuPlanner);
  std::string gpu_text;
  for (const auto& e : gpu_rules) gpu_text += (gpu_text.empty() ? "" : "\n") + e.reason;
  EXPECT_EQ(gpu.message(), gpu_text);
  n->engine_only += engine.is_ok() != gpu_rules.empty();
}

// The grid: tp, pp, dp, ZeRO, every schedule, v, compression, ZeRO++, sp and the
// micro-batches.
TEST(Layout, TheEngineRefusesExactlyWhatThePlannersSkipWithTheSameReasons) {
  const model::GptConfig config = grid_model();
  const std::vector<std::string> schedules = {"gpipe", "1f1b", "interleaved", "zb-h1", "zb-v", "2bw"};
  GridCounts n;
  for (int tp : {1, 2, 3})
    for (int pp : {1, 2})
      for (int dp : {1, 2})
        for (int zero : {0, 1, 3})
          for (const std::string& schedule : schedules)
            for (int v : {1, 2})
              for (const char* compress : {"none", "powersgd"})
                for (bool qg : {false, true})
                  for (bool sp : {false, true})
                    for (int accum : {1, 3}) {
                      train::TrainOptions o = grid_options();
                      o.tp = tp, o.pp = pp, o.dp = dp, o.zero = zero, o.schedule = schedule;
                      o.virtual_stages = v, o.compress = compress, o.zero_quantized_gradients = qg;
                      o.sp = sp, o.micro_batch = 1, o.grad_accum = accum;
                      SCOPED_TRACE("tp " + std::to_string(tp) + " pp " + std::to_string(pp) + " dp " +
                                   std::to_string(dp) + " zero " + std::to_string(zero) + " " + schedule + " v " +
                                   std::to_string(v) + " " + compress + (qg ? " qgZ" : "") + (sp ? " sp" : "") +
                                   " A " + std::to_string(accum));
                      expect_one_verdict(o, tp * pp * dp, config, 64, &n);
                    }
  EXPECT_EQ(n.cells, 3 * 2 * 2 * 3 * 6 * 2 * 2 * 2 * 2 * 2);
  // The grid is not all legal or all refused.
  EXPECT_GT(n.refused, n.cells / 4);
  EXPECT_LT(n.refused, n.cells);
  EXPECT_GT(n.engine_only, 0) << "no cell shows an engine limit the GPU planner does not apply";
}

// Context parallelism's rules the same way: cp with every --cp-comm and --cp-a2a, beside tp
// (which divides the heads a2a splits), on sequences that do and do not cut into 2 cp
// chunks.
TEST(Layout, TheCpRulesAreTheSameForTheEngineAndThePlanners) {
  model::GptConfig config = grid_model();
  GridCounts n;
  for (int T : {64, 48})
    for (int tp : {1, 2})
      for (int cp : {1, 2, 4, 8})
        for (const char* comm : {"ring", "a2a", "all-gather", "hybrid"})
          for (int a2a : {1, 2, 3, 4}) {
            train::TrainOptions o = grid_options();
            o.seq_len = T, o.tp = tp, o.cp = cp, o.cp_comm = comm, o.cp_a2a = a2a, o.dp = 1;
            config.max_seq_len = T;
            SCOPED_TRACE("T " + std::to_string(T) + " tp " + std::to_string(tp) + " cp " + std::to_string(cp) + " " +
                         comm + " a2a " + std::to_string(a2a));
            expect_one_verdict(o, tp * cp, config, T, &n);
          }
  EXPECT_EQ(n.cells, 2 * 2 * 4 * 4 * 4);
  EXPECT_GT(n.refused, n.cells / 4);
  EXPECT_LT(n.refused, n.cells);
}

// The CLI's edge parses each name once and says which flag is wrong.
TEST(Layout, TheEdgeParsesNamesOnce) {
  train::TrainOptions o = grid_options();
  parallel::Layout l;
  o.schedule = "zb-v";
  ASSERT_TRUE(train::to_layout(o, 2, &l).is_ok());
  EXPECT_EQ(l.virtual_stages, 2) << "zb-v runs two chunks with --virtual-stages unset";
  EXPECT_EQ(l.dp, 2);
  o.schedule = "1f1b", o.recompute = "sometimes";
  EXPECT_NE(train::to_layout(o, 2, &l).message().find("--recompute must be none, selective or full"), std::string::npos);
  o.recompute = "full", o.rank_order = "tp-pp";
  EXPECT_NE(train::to_layout(o, 2, &l).message().find("--rank-order must name tp, dp and pp"), std::string::npos);
  o.rank_order = "dp-tp-cp-pp";
  ASSERT_TRUE(train::to_layout(o, 2, &l).is_ok());
  EXPECT_EQ(l.recompute, model::Recompute::kFull);
  o.tp = 3;
  EXPECT_NE(train::to_layout(o, 2, &l).message().find("world size 2 is not divisible by tp"), std::string::npos);
}

// When data parallelism reduces and gathers: one derivation (parallel::dp_step) that the
// engine's DpConfig, both time models and the memory replay read.
TEST(Layout, DpStepSaysWhenGradientsReduceAndParametersGather) {
  parallel::Layout l;
  l.dp = 2, l.zero = 3;
  parallel::DpStep s = parallel::dp_step(l);
  EXPECT_TRUE(s.reduces_per_micro_batch && !s.reduce_once_per_step && !s.keep_gathered);
  EXPECT_EQ(s.gathers_per_use_step, 2);  // forward and backward
  l.recompute = model::Recompute::kFull;
  EXPECT_EQ(parallel::dp_step(l).gathers_per_use_step, 3) << "full recompute gathers again for its forward";
  l.pp = 2;  // a pipeline: once per step, kept to its end
  s = parallel::dp_step(l);
  EXPECT_TRUE(s.reduce_once_per_step && !s.reduces_per_micro_batch && s.keep_gathered);
  EXPECT_EQ(s.gathers_per_use_step, 0);
  l.offload.params = true;  // keeping every unit would hold the whole model
  EXPECT_FALSE(parallel::dp_step(l).keep_gathered);
  l.zero3_gather = parallel::Zero3Gather::kStep;
  EXPECT_TRUE(parallel::dp_step(l).keep_gathered);
  l.offload.params = false, l.zero3_gather = parallel::Zero3Gather::kUse;
  EXPECT_FALSE(parallel::dp_step(l).keep_gathered);
  l.zero = 1;
  s = parallel::dp_step(l);
  EXPECT_TRUE(s.gathers_updated_params && !s.reduces_per_micro_batch && s.gathers_per_use_step == 0);

  train::TrainOptions o = grid_options();
  o.zero3_gather = "sometimes";
  EXPECT_NE(train::to_layout(o, 2, &l).message().find("--zero3-gather must be auto, step or use, got 'sometimes'"),
            std::string::npos);
  o.zero3_gather = "use";
  ASSERT_TRUE(train::to_layout(o, 2, &l).is_ok());
  EXPECT_EQ(l.zero3_gather, parallel::Zero3Gather::kUse);
}

}  // namespace
}  // namespace meshtrain
