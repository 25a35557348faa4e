// ZeRO-Infinity's parts, in process (no mpirun):
//
//   ShardStore.FilesHoldWhatMemoryHolds   arrays in memory and in files read back the same
//                            values through every path: whole copies, asynchronous requests
//                            in the order made, and chunked streaming, which writes back only
//                            what it is asked to; the bytes moved are counted.
//   SumOfSquaresStream.PiecesGiveTheWholeSum  the norm's fixed-order sum fed in pieces of any
//                            size equals optim::sum_of_squares of the whole, bit for bit.
//   InitialWeights.EveryUnitAsTheWholeModelDrawsIt  unit-by-unit initialisation equals
//                            Gpt::init_weights for the whole model, a tp-2 slice and a
//                            pipeline part, in order and out of order.
//   DataParallelThreads.FileBackedZero3IsBitIdentical  fp32 ZeRO-3 with the parameter and
//                            gradient shards in files (and the optimizer state too), read
//                            ahead 1 or 3 units, on 1, 2 and 4 thread ranks with 2
//                            micro-batches per step (gradients read, added to and written
//                            back): losses and final parameters equal, bit for bit, those of
//                            the same run in memory, which equal the packed in-memory layout's.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <random>
#include <vector>

#include "comm/thread_group.h"
#include "data/loader.h"
#include "model/gpt.h"
#include "model/initial_weights.h"
#include "optim/adamw.h"
#include "optim/loss_scale.h"
#include "optim/shard_store.h"
#include "parallel/data_parallel.h"
#include "thread_ranks_test_util.h"
#include "train/trainer.h"

namespace meshtrain::test_zero_infinity {
namespace {

namespace fs = std::filesystem;
using optim::ShardStore;

std::string scratch_dir(const std::string& name) { return testing_util::scratch_dir("zero_inf", name); }

std::vector<float> ramp(size_t n, float scale) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; i++) v[i] = scale * (float)(i % 977) - 3.0f;
  return v;
}

TEST(ShardStore, FilesHoldWhatMemoryHolds) {
  const std::string dir = scratch_dir("store");
  const size_t n = 40000;  // not a multiple of the 2048-element alignment unit
  ShardStore store(n);
  store.add(optim::kMomentM, MemCategory::kOptim);
  store.add(optim::kMomentV, MemCategory::kOptim);
  const std::vector<float> a = ramp(n, 0.5f), b = ramp(n, -0.25f);
  store.write(optim::kMomentM, a.data());
  store.write(optim::kMomentV, b.data());
  ASSERT_TRUE(store.move_to_file(optim::kMomentM, dir, 3, true).is_ok());
  EXPECT_TRUE(store.in_file(optim::kMomentM));
  EXPECT_EQ(store.data(optim::kMomentM), nullptr) << "its memory is freed";
  EXPECT_TRUE(fs::exists(dir + "/adam_m_rank3.bin"));
  std::vector<float> back(n);
  store.read(optim::kMomentM, back.data());
  EXPECT_EQ(back, a);

  // Asynchronous: a write then a read of the same aligned range, in order.
  optim::IoBuffer w(MemCategory::kComm, 2048);
  for (size_t i = 0; i < 2048; i++) w.data()[i] = 100.0f + (float)i;
  optim::IoBuffer r(MemCategory::kComm, 2048);
  store.write_async(optim::kMomentM, 2048, 2048, std::move(w));
  store.wait(store.read_async(optim::kMomentM, 2048, 2048, r.data()));
  for (size_t i = 0; i < 2048; i++) ASSERT_EQ(r.data()[i], 100.0f + (float)i) << i;
  EXPECT_EQ(store.stats().bytes_written, 2048 * 4);
  EXPECT_EQ(store.stats().bytes_read, 2048 * 4);

  // Streaming both arrays, writing back only m: m's file changes, v (in memory) changes in
  // place as any in-memory array does; a file array outside write_mask does not.
  std::vector<float> expect_m(n);
  store.read(optim::kMomentM, expect_m.data());
  store.set_chunk(1500);  // rounds up to 2048: 20 chunks, the last partial
  EXPECT_EQ(store.chunk(), 2048u);
  store.reset_stats();
  size_t seen = 0;
  store.for_each_chunk(optim::bit(optim::kMomentM) | optim::bit(optim::kMomentV), optim::bit(optim::kMomentM),
                       [&](size_t begin, size_t end, const optim::ChunkPointers& arrays) {
                         EXPECT_EQ(begin, seen);
                         for (size_t i = 0; i < end - begin; i++) {
                           ASSERT_EQ(arrays.f(optim::kMomentM)[i], expect_m[begin + i]);
                           ASSERT_EQ(arrays.f(optim::kMomentV)[i], b[begin + i]);
                           arrays.f(optim::kMomentM)[i] += 1.0f;
                         }
                         seen = end;
                       });
  EXPECT_EQ(seen, n);
  store.read(optim::kMomentM, back.data());
  for (size_t i = 0; i < n; i++) ASSERT_EQ(back[i], expect_m[i] + 1.0f) << i;
  EXPECT_EQ(store.stats().bytes_read, (int64_t)ShardStore::aligned(n) * 4) << "whole 4 KiB units, once";
  EXPECT_EQ(store.stats().bytes_written, (int64_t)ShardStore::aligned(n) * 4);
  ASSERT_TRUE(store.move_to_file(optim::kMomentV, dir, 3, true).is_ok());
  store.for_each_chunk(optim::bit(optim::kMomentV), 0, [&](size_t, size_t e, const optim::ChunkPointers& arrays) {
    arrays.f(optim::kMomentV)[0] = 1e9f, (void)e;
  });
  store.read(optim::kMomentV, back.data());
  EXPECT_EQ(back, b) << "a file array outside write_mask is not written back";
}

TEST(SumOfSquaresStream, PiecesGiveTheWholeSum) {
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  for (size_t n : {0u, 1u, 7u, 63u, 64u, 65u, 1000u, 4099u, 70001u}) {
    std::vector<float> x(n);
    for (float& v : x) v = dist(rng);
    const double whole = optim::sum_of_squares(x.data(), n);
    for (size_t piece : {1u, 5u, 1024u, 3000u, 100000u}) {
      optim::SumOfSquaresStream stream(n);
      for (size_t b = 0; b < n; b += piece) stream.add(x.data() + b, std::min(piece, n - b));
      EXPECT_EQ(stream.total(), whole) << "n " << n << " piece " << piece;
    }
  }
}

model::GptConfig small_model() { return testing_util::small_gpt(4); }

TEST(InitialWeights, EveryUnitAsTheWholeModelDrawsIt) {
  const model::GptConfig c = small_model();
  for (int tp = 1; tp <= 2; tp++)
    for (bool staged : {false, true}) {
      SCOPED_TRACE(testing::Message() << "tp " << tp << (staged ? " last stage" : ""));
      model::ModelPart part;
      if (staged) part.chunks = {{2, 4}};  // the last two layers: final norm and tied embedding too
      for (int rank = 0; rank < tp; rank++) {
        const model::ParamLayout layout(c, tp, rank, part);
        std::vector<float> expect(layout.total());
        {
          model::Gpt whole(c, model::Gpt::LocalState::kParamsOnly);
          whole.init_weights(5);
          const model::ParamLayout whole_layout(c);
          for (const auto& t : layout.tensors())
            model::global_to_local(t, tp, rank, whole.params() + whole_layout.find(t.name)->offset,
                                   expect.data() + t.offset);
        }
        model::InitialWeights init(c, 5);
        std::vector<float> got(layout.total(), -1.0f);
        for (int u = 0; u < layout.num_units(); u++) init.unit(layout, u, got.data() + layout.units()[u].offset);
        EXPECT_EQ(got, expect);
        // Out of order: the generator starts again and draws the same values.
        const int last = layout.num_units() - 1;
        std::vector<float> again(layout.units()[0].numel);
        init.unit(layout, 0, again.data());
        EXPECT_TRUE(std::equal(again.begin(), again.end(), expect.begin() + layout.units()[0].offset));
        (void)last;
      }
    }
}

data::TokenLoader tokens() { return testing_util::random_tokens(4000); }

// grad_clip 0.05 clips every step here: the clipping factor reaches the update.
optim::AdamWConfig adamw() { return testing_util::test_adamw(0.05f); }

struct Outcome {
  std::vector<float> losses;
  std::vector<float> params;  // rank 0's final parameter shard (its real elements)
  int64_t read_bytes = 0;
  int skipped = 0;  // fp16 steps skipped on overflow
};

enum class Where { kPacked, kMemory, kFiles, kAllFiles };

// kSteps steps of ZeRO-3 on `ranks` thread ranks, 2 micro-batches of 1 row each per rank,
// with fp32 or 16-bit storage (fp16 with a dynamic loss scale, as training runs it).
Outcome zero3(int ranks, Where where, int read_ahead, const std::string& dir,
              kernels::Precision storage = kernels::Precision::kFp32) {
  constexpr int kSteps = 4;
  const model::GptConfig c = small_model();
  model::Gpt full(c);
  full.init_weights(11);
  const data::TokenLoader data = tokens();
  comm::ThreadWorld world(ranks);
  std::vector<Outcome> out(ranks);
  comm::run_ranks(ranks, [&](int r) {
    std::unique_ptr<comm::Group> g = world.group(r, "dp");
    model::Gpt gpt(c, parallel::model_state_for_stage(3, storage));
    gpt.set_precision(storage);
    parallel::DpConfig config{3, 25, true, storage};
    config.align_shards = where != Where::kPacked;
    const bool files = where == Where::kFiles || where == Where::kAllFiles;
    config.files = {dir, r, files, files, true, read_ahead};
    parallel::DataParallel dp(gpt, *g, config, adamw(), full.params());
    if (where == Where::kAllFiles) {
      ASSERT_TRUE(dp.store().move_state_to_files(dir, r, 3000, true).is_ok());
    }
    std::unique_ptr<optim::DynamicLossScaler> scaler;
    if (storage == kernels::Precision::kFp16) scaler = std::make_unique<optim::DynamicLossScaler>(optim::LossScaleConfig{});
    for (int k = 0; k < kSteps; k++) {
      const train::StepResult step =
          train::train_step(gpt, dp, *g, adamw(), data, {1, 2, 16, ranks, r}, k, kSteps, nullptr, scaler.get());
      out[r].losses.push_back(step.loss);
      out[r].skipped += step.skipped;
    }
    optim::ShardStore& st = dp.store();
    // The parameters as fp32: the shard itself, or the master weights of a 16-bit run,
    // whose words must be their rounding.
    std::vector<float> shard(st.size());
    st.read(storage == kernels::Precision::kFp32 ? optim::kShardParams : optim::kMasterWeights, shard.data());
    if (storage != kernels::Precision::kFp32) {
      std::vector<uint16_t> words(st.size()), rounded(st.size());
      st.read(optim::kShardParams, words.data());
      kernels::to_half(storage, shard.data(), rounded.data(), shard.size());
      for (int u = 0; u < gpt.layout().num_units(); u++) {  // the real elements (padding is zero)
        const auto& s = dp.shards().units()[u];
        const size_t owned = dp.shards().own_end(u) - dp.shards().own_begin(u);
        for (size_t i = s.local_offset; i < s.local_offset + owned; i++)
          ASSERT_EQ(words[i], rounded[i]) << "unit " << u << " element " << i;
      }
      // As after a checkpoint load: the words rewritten from the master weights, wherever
      // they live.
      std::vector<uint16_t> zero(st.size(), 0), again(st.size());
      st.write(optim::kShardParams, zero.data());
      dp.params_from_master();
      st.read(optim::kShardParams, again.data());
      EXPECT_EQ(again, words);
    }
    for (int u = 0; u < gpt.layout().num_units(); u++) {
      const auto& s = dp.shards().units()[u];
      const size_t owned = dp.shards().own_end(u) - dp.shards().own_begin(u);
      out[r].params.insert(out[r].params.end(), shard.begin() + s.local_offset,
                           shard.begin() + s.local_offset + owned);
    }
    out[r].read_bytes = st.stats().bytes_read;
  });
  for (int r = 1; r < ranks; r++) EXPECT_EQ(out[r].losses, out[0].losses);
  return out[0];
}

TEST(DataParallelThreads, FileBackedZero3IsBitIdentical) {
  for (int ranks : {1, 2, 4}) {
    SCOPED_TRACE(testing::Message() << ranks << " ranks");
    const std::string dir = scratch_dir("dp" + std::to_string(ranks));
    const Outcome packed = zero3(ranks, Where::kPacked, 2, dir);
    const Outcome memory = zero3(ranks, Where::kMemory, 2, dir);
    EXPECT_EQ(memory.losses, packed.losses) << "aligned shards change no arithmetic";
    EXPECT_EQ(memory.params, packed.params);
    EXPECT_EQ(memory.read_bytes, 0);
    for (int read_ahead : {1, 3}) {
      SCOPED_TRACE(testing::Message() << "read ahead " << read_ahead);
      const Outcome files = zero3(ranks, Where::kFiles, read_ahead, dir);
      EXPECT_EQ(files.losses, memory.losses);
      EXPECT_EQ(files.params, memory.params);
      EXPECT_GT(files.read_bytes, 0);
    }
    const Outcome all = zero3(ranks, Where::kAllFiles, 2, dir);
    EXPECT_EQ(all.losses, memory.losses);
    EXPECT_EQ(all.params, memory.params);
    for (const auto& e : fs::directory_iterator(dir)) ADD_FAILURE() << "left behind: " << e.path();
  }
}

// A bf16 or fp16 run's ZeRO-3 words in files: the same losses, master weights and words as
// the same run with its words in memory, on 1, 2 and 4 ranks.
TEST(DataParallelThreads, FileBacked16BitZero3IsBitIdentical) {
  for (kernels::Precision p : {kernels::Precision::kBf16, kernels::Precision::kFp16})
    for (int ranks : {1, 2, 4}) {
      SCOPED_TRACE(testing::Message() << kernels::precision_name(p) << ", " << ranks << " ranks");
      const std::string dir = scratch_dir("dp16_" + std::to_string(ranks));
      const Outcome packed = zero3(ranks, Where::kPacked, 2, dir, p);
      const Outcome memory = zero3(ranks, Where::kMemory, 2, dir, p);
      EXPECT_EQ(memory.losses, packed.losses) << "aligned shards change no arithmetic";
      EXPECT_EQ(memory.params, packed.params);
      EXPECT_LT(memory.skipped, 2) << "fp16: the updates happen";
      const Outcome files = zero3(ranks, Where::kFiles, ranks == 2 ? 1 : 2, dir, p);
      EXPECT_EQ(files.losses, memory.losses);
      EXPECT_EQ(files.params, memory.params);
      EXPECT_GT(files.read_bytes, 0);
      const Outcome all = zero3(ranks, Where::kAllFiles, 2, dir, p);
      EXPECT_EQ(all.losses, memory.losses);
      EXPECT_EQ(all.params, memory.params);
      for (const auto& e : fs::directory_iterator(dir)) ADD_FAILURE() << "left behind: " << e.path();
    }
}

}  // namespace
}  // namespace meshtrain::test_zero_infinity
