// The data-parallel store's parts (parallel/dp/), each alone, on in-process ranks
// (comm::ThreadWorld) where it talks to others; every test runs in milliseconds.
//
//   BucketAllReduce.BucketsAreRunsOfAdjacentUnits   buckets tile a group's units in backward
//                            order, each at least the bucket size unless its run of adjacent
//                            units ends, and never span a gap between a group's units.
//   BucketAllReduce.EveryRankHoldsTheSum   a bucket starts only when its last unit is final
//                            (never before finish() without overlap); afterwards every rank
//                            holds the sum of all ranks' gradients, as fp32 and as bf16 words.
//   ShardReduceScatter.SinkGetsTheOwnedSumInStartOrder   each unit's owned shard of the sum
//                            reaches the sink once, in the order started; with one reduction
//                            in flight the older ones retire as a new one starts, with no
//                            limit only in wait_all(); start_from reads a full fp32 or bf16
//                            gradient.
//   HalfStorage.PackedViewsHoldTheOtherTensors   bf16 views hold every tensor but the GEMM
//                            weights (parameters) or the linear weights' (gradients), packed,
//                            widened and added exactly; fp16 views are whole units.
//   FileBackedShards.ReadsAheadAndAccumulatesGradients   shards read ahead, or on demand,
//                            hold the file's values; an update's hand-over needs no read; a
//                            gradient written twice in a step is the sum, in pieces, its
//                            squares those of what was written; units not reached are zero.
//   UnitsInUse.LastReleaseFreesUnlessItStays   an acquired unit holds the all-gathered shards
//                            of every rank; it is freed at its last release only, stays when
//                            kept (to drop_idle(true)) or held (freed by drop_idle(false) too),
//                            and a prefetch never acquired is waited for and freed by
//                            drop_idle(true).
//   DataParallelThreads.ParamGroupsReduceOverTheirOwnGroups   ZeRO-2 with the embedding and
//                            final norm in a group of their own trains as one group does, and
//                            each group's communicator carries exactly its units' bytes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <vector>

#include "comm/thread_group.h"
#include "model/gpt.h"
#include "model/param_layout.h"
#include "optim/shard_store.h"
#include "parallel/data_parallel.h"
#include "parallel/dp/file_shards.h"
#include "parallel/dp/half_storage.h"
#include "parallel/dp/reducer.h"
#include "parallel/dp/units_in_use.h"
#include "thread_ranks_test_util.h"
#include "train/trainer.h"

namespace meshtrain::test_dp_parts {
namespace {

using namespace testing_util;
using parallel::BucketAllReduce;
using parallel::FullGradient;
using parallel::ShardLayout;
using parallel::ShardReduceScatter;

constexpr double kSmallBuckets = 0.02;  // MiB: 5242 floats, so a block (12.6k) fills one alone

// Small integers: their sums are exact in any order, in fp32 and in bf16.
float value(int rank, size_t i) { return (float)((i * 7 + (size_t)rank * 3) % 17) - 8.0f; }

std::vector<int> all_units(const model::ParamLayout& layout) {
  std::vector<int> u(layout.num_units());
  for (int i = 0; i < layout.num_units(); i++) u[i] = i;
  return u;
}

TEST(BucketAllReduce, BucketsAreRunsOfAdjacentUnits) {
  const model::ParamLayout layout(small_gpt(4));
  const size_t elems = (size_t)(kSmallBuckets * 1024 * 1024 / 4);
  comm::ThreadWorld world(1);
  std::unique_ptr<comm::Group> g = world.group(0, "dp");
  std::vector<float> grads(layout.total());
  BufferPool<float> pool;
  for (const std::vector<int>& units : {all_units(layout), std::vector<int>{0, 2, 3, 5}}) {
    BucketAllReduce reducer(*g, layout, units, kSmallBuckets, true, {grads.data()}, pool);
    std::vector<int> order;
    for (const BucketAllReduce::Bucket& b : reducer.buckets()) {
      size_t end = b.end;
      for (int u : b.units) {  // descending and adjacent: each unit ends where the one before began
        EXPECT_EQ(layout.units()[u].offset + layout.units()[u].numel, end);
        end = layout.units()[u].offset;
        order.push_back(u);
      }
      EXPECT_EQ(end, b.begin);
      const int lowest = b.units.back();
      const bool run_ends = lowest == units.front() ||
                            std::find(units.begin(), units.end(), lowest - 1) == units.end();
      if (!run_ends) {
        EXPECT_GE(b.end - b.begin, elems);
      }
    }
    EXPECT_EQ(order, std::vector<int>(units.rbegin(), units.rend()));  // every unit once, backward
  }
}

TEST(BucketAllReduce, EveryRankHoldsTheSum) {
  const model::ParamLayout layout(small_gpt(4));
  const size_t n = layout.total();
  constexpr int kRanks = 3;
  for (kernels::Precision p : {kernels::Precision::kFp32, kernels::Precision::kBf16})
    for (bool overlap : {true, false}) {
      SCOPED_TRACE(testing::Message() << (p == kernels::Precision::kBf16 ? "bf16" : "fp32") << " overlap " << overlap);
      comm::ThreadWorld world(kRanks);
      std::vector<std::vector<float>> result(kRanks, std::vector<float>(n));
      comm::run_ranks(kRanks, [&](int r) {
        std::unique_ptr<comm::Group> g = world.group(r, "dp");
        std::vector<float> fp32(n);
        std::vector<uint16_t> words(n);
        for (size_t i = 0; i < n; i++) fp32[i] = value(r, i);
        FullGradient grads{fp32.data()};
        if (p != kernels::Precision::kFp32) {
          kernels::to_half(p, fp32.data(), words.data(), n);
          grads = {nullptr, words.data(), p};
        }
        BufferPool<float> pool;
        BucketAllReduce reducer(*g, layout, all_units(layout), kSmallBuckets, overlap, grads, pool);
        reducer.begin_step();
        for (const BucketAllReduce::Bucket& b : reducer.buckets()) {
          const int64_t calls = g->stats().calls;
          for (size_t k = 0; k < b.units.size(); k++) {
            EXPECT_EQ(g->stats().calls, calls) << "a bucket started before its last unit was final";
            reducer.unit_final(b.units[k]);
          }
          EXPECT_EQ(g->stats().calls, calls + (overlap ? 1 : 0));
        }
        reducer.finish();
        EXPECT_EQ(g->stats().calls, (int64_t)reducer.buckets().size());
        if (grads.is_half()) kernels::from_half(p, words.data(), fp32.data(), n);
        result[r] = fp32;
      });
      std::vector<float> sum(n);
      for (size_t i = 0; i < n; i++)
        for (int r = 0; r < kRanks; r++) sum[i] += value(r, i);
      for (int r = 0; r < kRanks; r++) EXPECT_EQ(result[r], sum) << "rank " << r;
    }
}

TEST(ShardReduceScatter, SinkGetsTheOwnedSumInStartOrder) {
  const model::ParamLayout layout(small_gpt(2));
  constexpr int kRanks = 2;
  const std::vector<int> backward = {3, 2, 1, 0};
  for (int in_flight : {1, 0})
    for (kernels::Precision p : {kernels::Precision::kFp32, kernels::Precision::kBf16}) {
      SCOPED_TRACE(testing::Message() << "in flight " << in_flight << (p == kernels::Precision::kBf16 ? " bf16" : ""));
      comm::ThreadWorld world(kRanks);
      comm::run_ranks(kRanks, [&](int r) {
        std::unique_ptr<comm::Group> g = world.group(r, "dp");
        const ShardLayout shards(layout, kRanks, r);
        std::vector<int> order;
        std::map<int, std::vector<float>> got;
        BufferPool<float> pool;
        ShardReduceScatter reducer(*g, shards, in_flight, true, pool, [&](int u, const float* reduced) {
          order.push_back(u);
          got[u].assign(reduced, reduced + (shards.own_end(u) - shards.own_begin(u)));
        });
        std::vector<float> full(layout.total());
        std::vector<uint16_t> words(layout.total());
        for (size_t i = 0; i < full.size(); i++) full[i] = value(r, i);
        kernels::to_half(kernels::Precision::kBf16, full.data(), words.data(), full.size());
        for (size_t k = 0; k < backward.size(); k++) {
          const int u = backward[k];
          if (u == 0) {  // from a full gradient, as ZeRO 1 keeps it
            reducer.start_from(u, p == kernels::Precision::kFp32 ? FullGradient{full.data()}
                                                                  : FullGradient{nullptr, words.data(), p});
          } else {
            Buffer<float> send = reducer.staging(u);
            const parallel::UnitShard& s = shards.units()[u];
            for (size_t i = 0; i < s.numel; i++) send.data()[i] = value(r, s.global_offset + i);
            for (size_t i = s.numel; i < s.padded; i++) EXPECT_EQ(send.data()[i], 0.0f) << "padding is zero";
            reducer.start(u, std::move(send));
          }
          EXPECT_EQ(order.size(), in_flight ? k : 0) << "retired after unit " << u << " started";
          EXPECT_EQ(reducer.in_flight(), in_flight ? 1 : k + 1);
        }
        reducer.wait_all();
        EXPECT_EQ(order, backward);
        for (int u : backward) {
          std::vector<float> expect;
          for (size_t i = shards.own_begin(u); i < shards.own_end(u); i++) expect.push_back(value(0, i) + value(1, i));
          EXPECT_EQ(got[u], expect) << "unit " << u << " rank " << r;
        }
      });
    }
}

TEST(HalfStorage, PackedViewsHoldTheOtherTensors) {
  const model::ParamLayout layout(small_gpt(2));
  const size_t n = layout.total();
  std::vector<float> values(n);
  for (size_t i = 0; i < n; i++) values[i] = value(0, i) * 0.25f;
  for (kernels::Precision p : {kernels::Precision::kBf16, kernels::Precision::kFp16}) {
    SCOPED_TRACE(p == kernels::Precision::kBf16 ? "bf16" : "fp16");
    parallel::HalfStorage half(p, layout, n, n, true);
    kernels::to_half(p, values.data(), half.params(), n);
    half.zero_grads();
    const bool bf16 = p == kernels::Precision::kBf16;
    EXPECT_EQ(half.packs_params(), bf16);
    EXPECT_EQ(half.packs_grads(), bf16);
    for (int u = 0; u < layout.num_units(); u++) {
      const model::ParamUnit& unit = layout.units()[u];
      size_t kept = 0, kept_grads = 0;
      std::vector<float> view(half.fp32_unit_size(u));
      half.widen(u, half.params() + unit.offset, view.data());
      std::vector<float> grad(half.fp32_grad_size(u), 1.0f);
      half.add_unit_grads(u, grad.data());
      for (const model::ParamTensor& t : layout.tensors()) {
        if (layout.unit_of(t) != u) continue;
        const size_t at = layout.offset_in_unit(t);
        if (!bf16 || !t.gemm_weight) {
          kept += t.numel;
          const size_t o = half.param_offset(u, t);
          for (size_t j = 0; j < t.numel; j++) ASSERT_EQ(view[o + j], values[unit.offset + at + j]) << t.name;
        }
        if (!bf16 || !t.gemm_grad) {
          kept_grads += t.numel;
          EXPECT_LE(half.grad_offset(u, t) + t.numel, grad.size());
        }
        float g = 0;  // the linear weights' gradients are the GEMMs' to add (bf16)
        kernels::from_half(p, half.unit_grads(u) + at, &g, 1);
        EXPECT_EQ(g, !bf16 || !t.gemm_grad ? 1.0f : 0.0f) << t.name;
      }
      EXPECT_EQ(half.fp32_unit_size(u), kept);
      EXPECT_EQ(half.fp32_grad_size(u), kept_grads);
      if (!bf16) {
        EXPECT_EQ(kept, unit.numel);
      }
    }
  }
}

TEST(FileBackedShards, ReadsAheadAndAccumulatesGradients) {
  namespace fs = std::filesystem;
  const std::string dir = scratch_dir("dp_parts", "files");
  const model::ParamLayout layout(small_gpt(2));
  const ShardLayout shards(layout, 2, 1, optim::ShardStore::kAlign);  // rank 1's shards
  const std::vector<optim::AdamSegment> segments = shards.adam_segments(layout, true, true);
  {
    optim::ShardStore store(shards.local_total());
    ASSERT_TRUE(store.add_file(optim::kShardParams, dir, 1, true).is_ok());
    ASSERT_TRUE(store.add_file(optim::kShardGrads, dir, 1, true).is_ok());
    store.set_chunk(optim::ShardStore::kAlign);  // a block's shard (6.3k floats) in 4 pieces
    std::vector<float> params(shards.local_total());
    for (size_t i = 0; i < params.size(); i++) params[i] = value(1, i);
    store.write(optim::kShardParams, params.data());
    parallel::FileBackedShards files(store, shards, segments, 2);
    ASSERT_TRUE(files.params_in_file() && files.grads_in_file());
    auto shard_of = [&](const std::vector<float>& v, int u) {
      const parallel::UnitShard& s = shards.units()[u];
      return std::vector<float>(v.begin() + s.local_offset, v.begin() + s.local_offset + s.shard);
    };
    // Parameters: units 0 and 1 read ahead, 2 on demand.
    files.read({0, 1});
    for (int u : {0, 1, 2}) {
      optim::IoBuffer holder;
      const auto* got = static_cast<const float*>(files.take(u, &holder));
      EXPECT_EQ(std::vector<float>(got, got + shards.units()[u].shard), shard_of(params, u)) << "unit " << u;
      files.give_back(std::move(holder));
    }
    EXPECT_GT(store.stats().bytes_read, 0);
    // The update hands units 0 and 1 over as it writes them: no read follows.
    files.read({3});  // issued, then dropped by the hand-over (the parameters change)
    std::vector<float> updated(params.size());
    for (size_t i = 0; i < updated.size(); i++) updated[i] = value(0, i);
    optim::ParamsWritten hook = files.hand_over({0, 1});
    store.reset_stats();
    for (size_t b = 0; b < updated.size(); b += 5000)  // in chunks, as the update writes them
      hook(b, std::min(b + 5000, updated.size()), updated.data() + b);
    for (int u : {0, 1}) {
      optim::IoBuffer holder;
      const auto* got = static_cast<const float*>(files.take(u, &holder));
      EXPECT_EQ(std::vector<float>(got, got + shards.units()[u].shard), shard_of(updated, u)) << "unit " << u;
    }
    EXPECT_EQ(store.stats().bytes_read, 0);
    // Gradients: unit 1 written twice in the step (two micro-batches), the rest never.
    const size_t owned = shards.own_end(1) - shards.own_begin(1);
    std::vector<float> first(owned), second(owned);
    for (size_t i = 0; i < owned; i++) first[i] = value(0, i), second[i] = 0.5f * value(1, i);
    for (int step = 0; step < 2; step++) {  // the second step starts from zero again
      files.begin_step();
      files.add_reduced(1, first.data());
      files.add_reduced(1, second.data());
      files.fill_unwritten();
      files.wait_writes();
    }
    std::vector<float> grads(shards.local_total());
    store.read(optim::kShardGrads, grads.data());
    for (int u = 0; u < layout.num_units(); u++) {
      const parallel::UnitShard& s = shards.units()[u];
      const size_t real = shards.own_end(u) - shards.own_begin(u);
      for (size_t i = 0; i < real; i++)
        ASSERT_EQ(grads[s.local_offset + i], u == 1 ? first[i] + second[i] : 0.0f) << "unit " << u << " at " << i;
    }
    for (size_t i = 0; i < segments.size(); i++)
      EXPECT_EQ(files.squares(i), optim::sum_of_squares(grads.data() + segments[i].grad_offset, segments[i].count))
          << "segment " << i;
  }
  fs::remove_all(fs::path(dir).parent_path());
}

TEST(UnitsInUse, LastReleaseFreesUnlessItStays) {
  constexpr int kRanks = 2;
  const model::ParamLayout layout(small_gpt(2));
  comm::ThreadWorld world(kRanks);
  comm::run_ranks(kRanks, [&](int r) {
    std::unique_ptr<comm::Group> g = world.group(r, "dp");
    const ShardLayout shards(layout, kRanks, r);
    std::vector<float> shard(shards.local_total());  // this rank's part of full[i] = value(0, i)
    for (int u = 0; u < layout.num_units(); u++)
      for (size_t i = shards.own_begin(u); i < shards.own_end(u); i++)
        shard[shards.units()[u].local_offset + (i - shards.own_begin(u))] = value(0, i);
    std::vector<int> freed;
    parallel::UnitsInUse units(
        layout.num_units(),
        [&](int u, parallel::UnitsInUse::Unit& unit) {
          const parallel::UnitShard& s = shards.units()[u];
          unit.data.allocate(MemCategory::kGathered, s.padded);
          unit.request = g->iall_gather(shard.data() + s.local_offset, unit.data.data(), s.shard);
        },
        [&](parallel::UnitsInUse::Unit& unit) { freed.push_back((int)unit.data.size()); });
    using Stay = parallel::UnitsInUse::Stay;
    const parallel::UnitsInUse::Unit& one = units.acquire(1);
    const model::ParamUnit& p1 = layout.units()[1];
    for (size_t i = 0; i < p1.numel; i++) ASSERT_EQ(one.data.data()[i], value(0, p1.offset + i)) << i;
    units.start(2);  // a prefetch
    EXPECT_EQ(units.started(), 2);
    units.acquire(1);
    units.release(1, Stay::kFree);
    EXPECT_TRUE(freed.empty()) << "freed with a user left";
    units.release(1, Stay::kFree);
    EXPECT_EQ(freed.size(), 1u);
    EXPECT_EQ(units.find(1), nullptr);
    units.acquire(2), units.release(2, Stay::kKeep);
    units.acquire(3), units.release(3, Stay::kHold);
    units.start(0);  // never acquired
    EXPECT_EQ(units.started(), 3);
    units.drop_idle(false);
    EXPECT_EQ(freed.size(), 2u);
    EXPECT_EQ(units.find(3), nullptr) << "the held unit goes";
    EXPECT_NE(units.find(2), nullptr) << "the kept unit stays";
    units.drop_idle(true);
    EXPECT_EQ(freed.size(), 4u);
    EXPECT_EQ(units.started(), 0);
  });
}

TEST(DataParallelThreads, ParamGroupsReduceOverTheirOwnGroups) {
  constexpr int kRanks = 2, kSteps = 3, kMicroBatches = 2;
  const model::GptConfig c = small_gpt(2);
  model::Gpt full(c);
  full.init_weights(11);
  const data::TokenLoader data = random_tokens(2000);
  const optim::AdamWConfig opt = test_adamw(1.0f);
  struct Outcome {
    std::vector<float> losses;
    int64_t edge_bytes = 0, block_bytes = 0;
  };
  auto train = [&](bool two_groups) {
    comm::ThreadWorld world(kRanks);
    std::vector<Outcome> out(kRanks);
    comm::run_ranks(kRanks, [&](int r) {
      std::unique_ptr<comm::Group> dp = world.group(r, "dp");
      std::unique_ptr<comm::Group> edges = dp->split(0, r, "edges");  // the same ranks, its own communicator
      model::Gpt gpt(c, parallel::model_state_for_stage(2));
      gpt.init_weights(11);
      parallel::DpConfig config;
      config.zero_stage = 2;
      const int n = gpt.layout().num_units();
      if (two_groups) {
        config.groups = {{"edges", edges.get(), {0, n - 1}}, {"blocks", nullptr, {}}};
        for (int u = 1; u < n - 1; u++) config.groups[1].units.push_back(u);
      }
      parallel::DataParallel store(gpt, *dp, config, opt, full.params());
      ASSERT_EQ(store.num_groups(), two_groups ? 2u : 1u);
      dp->reset_stats();
      for (int k = 0; k < kSteps; k++)
        out[r].losses.push_back(
            train::train_step(gpt, store, *dp, opt, data, {1, kMicroBatches, 16, kRanks, r}, k, kSteps).loss);
      out[r].edge_bytes = edges->stats().bytes;
      out[r].block_bytes = dp->stats().bytes;
      // Per step and unit: a reduce-scatter per micro-batch and the all-gather after the
      // update, (N-1) shards each; per group the norm's all-reduce (8 bytes at N = 2); on
      // dp the loss's too.
      if (!two_groups) return;
      auto unit_bytes = [&](int u) { return (int64_t)(kMicroBatches + 1) * (kRanks - 1) * store.shards().units()[u].shard * 4; };
      int64_t edges_expect = 8, blocks_expect = 16;
      for (int u : config.groups[0].units) edges_expect += unit_bytes(u);
      for (int u : config.groups[1].units) blocks_expect += unit_bytes(u);
      EXPECT_EQ(out[r].edge_bytes, kSteps * edges_expect);
      EXPECT_EQ(out[r].block_bytes, kSteps * blocks_expect);
    });
    EXPECT_EQ(out[0].losses, out[1].losses);
    return out[0];
  };
  const Outcome one = train(false), two = train(true);
  EXPECT_EQ(one.edge_bytes, 0);
  for (int k = 0; k < kSteps; k++)  // the norm's sum is taken per group: its last bits may differ
    EXPECT_NEAR(two.losses[k], one.losses[k], 1e-6) << "step " << k;
}

}  // namespace
}  // namespace meshtrain::test_dp_parts
