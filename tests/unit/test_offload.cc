// Optimizer-state offload (--offload optimizer=nvme, --memory-budget; optim/shard_store.h):
//
//   OffloadedTrainingIsBitIdentical  the moments streamed from files in chunks much smaller
//                            than one tensor give the same losses, bit for bit, as in memory,
//                            on one rank and on dp2 ZeRO-1 (a file per rank); the optimizer
//                            bytes fall to the six chunk buffers, every step reads and
//                            writes both moments once, with O_DIRECT where the file system
//                            takes it.
//   MemoryBudgetOffloadsAndStaysUnder  a budget below the in-memory run's peak and above the
//                            offloaded one's: the run offloads by itself and its measured peak
//                            (the tracker's total) stays under the budget.
//   ResumeAfterACrash        an offloaded run (through the page cache) interrupted after its
//                            step-3 checkpoint resumes (offloaded) with the same losses as the
//                            uninterrupted run.
//   Bf16MasterWeightsStreamToo  a bf16 run (16-bit weights, fp32 master weights in the
//                            optimizer) streams master, m and v: bit-identical losses, 12
//                            bytes per parameter read and written per step, nine chunk
//                            buffers resident; and it resumes bit-exactly from a checkpoint.
//   Zero3ShardsInFilesTrainAsInMemory  ZeRO-Infinity: fp32 ZeRO-3 with the parameter and
//                            gradient shards (and the optimizer state) in files trains with
//                            the losses and norms of ZeRO-3 in memory, bit for bit: one rank
//                            with 2 micro-batches a step, dp 2, and pp 2 x dp 2 (one reduction
//                            per step, the tied embedding's copies summed through the files);
//                            the tracker's parameter and gradient bytes fall to zero, and a
//                            run cut after its step-3 checkpoint resumes with the same losses.
//   MemoryBudgetMovesShardsToo  a ZeRO-3 budget that the optimizer's files alone do not meet
//                            moves the gradient shard as well, and the run stays under it.
//   BadInputIsRejected       a budget too small even when offloaded, --offload without a
//                            folder, an unknown, repeated or misplaced --offload value:
//                            refused before any step.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "cli_test_util.h"
#include "multirank_test_util.h"

namespace meshtrain::test_offload {
namespace {

namespace fs = std::filesystem;
using namespace cli_test;
using multirank_test::step_dir;

class Offload : public CliTest {
 protected:
  const std::string kRun = "--model tiny --seq-len 32 --micro-batch 4 --steps 6 --eval-batches 1 --quiet";
  // The tiny model holds 3.32M parameters: m and v are 26.6 MB; 0.05 MB chunks (13107
  // floats, rounded up to 14336 = 7 alignment units of 2048 elements) split every large
  // tensor across chunks.
  const std::string kChunks = " --offload-chunk-mb 0.05";
  static constexpr int64_t kUnit = 2048;  // elements per alignment unit (4 KiB of 16-bit words)
  static int64_t aligned(int64_t floats) { return (floats + kUnit - 1) / kUnit * kUnit; }
  // Resident bytes of the three rotating buffers of `arrays` state arrays (each 4 KiB
  // longer than the chunk, to align it).
  static int64_t chunk_buffer_bytes(int arrays) {
    return 3 * arrays * (aligned((int64_t)(0.05 * 1024 * 1024 / 4)) * 4 + 4096);
  }
  // Bytes one step streams each way for `state_bytes` of `arrays` arrays: whole units.
  static int64_t streamed_bytes(int64_t state_bytes, int arrays) {
    return arrays * aligned(state_bytes / 4 / arrays) * 4;
  }
  // Whether this file system takes O_DIRECT (ext4 does, tmpfs does not).
  bool supports_direct_io() {
    fs::create_directories(path("probe"));
    const std::string f = path("probe") + "/f";
    int fd = ::open(f.c_str(), O_RDWR | O_CREAT | O_DIRECT, 0644);
    if (fd >= 0) ::close(fd);
    return fd >= 0;
  }

  Metrics train_ok(const std::string& args, const std::string& out) {
    RunResult r = run(train(args + " --out " + out));
    EXPECT_EQ(r.exit_code, 0) << describe(r);
    return read_metrics(out + "/metrics.jsonl");
  }
};

TEST_F(Offload, OffloadedTrainingIsBitIdentical) {
  const Metrics mem = train_ok(kRun, path("mem"));
  const Metrics off = train_ok(kRun + " --offload optimizer=nvme --offload-dir " + path("files") + kChunks,
                               path("off"));
  ASSERT_EQ(mem.steps.size(), 6u);
  ASSERT_EQ(off.steps.size(), 6u);
  const int64_t state_bytes = mem.steps.back()["mem"]["optim"].get<int64_t>();  // m and v
  for (size_t k = 0; k < 6; k++) {
    SCOPED_TRACE(k + 1);
    EXPECT_EQ(bits(off.steps[k]["loss"]), bits(mem.steps[k]["loss"]));
    EXPECT_EQ(bits(off.steps[k]["grad_norm"]), bits(mem.steps[k]["grad_norm"]));
    EXPECT_EQ(off.steps[k]["offload"]["read_bytes"].get<int64_t>(), streamed_bytes(state_bytes, 2))
        << "m and v read once";
    EXPECT_EQ(off.steps[k]["offload"]["written_bytes"].get<int64_t>(), streamed_bytes(state_bytes, 2))
        << "and written once";
    EXPECT_EQ(off.steps[k]["offload"]["direct_io"].get<bool>(), supports_direct_io());
  }
  EXPECT_EQ(off.steps.back()["mem"]["optim"].get<int64_t>(), chunk_buffer_bytes(2))
      << "three rotating (m, v) chunk buffers";
  EXPECT_TRUE(fs::is_directory(path("files")));
  EXPECT_FALSE(fs::exists(path("files") + "/adam_m_rank0.bin")) << "the files go with the run";
  EXPECT_FALSE(fs::exists(path("files") + "/adam_v_rank0.bin"));

#ifdef MESHTRAIN_HAVE_MPI
  // dp2 ZeRO-1: each rank streams its own shard's moments.
  const std::string dp = "--model tiny --seq-len 32 --micro-batch 2 --steps 6 --eval-batches 1 --quiet --dp 2 --zero 1";
  const Metrics dmem = train_ok(dp, path("dmem"));
  const Metrics doff = train_ok(dp + " --offload optimizer=nvme --offload-dir " + path("dfiles") + kChunks,
                                path("doff"));
  ASSERT_EQ(doff.steps.size(), 6u);
  for (size_t k = 0; k < 6; k++) EXPECT_EQ(bits(doff.steps[k]["loss"]), bits(dmem.steps[k]["loss"])) << k + 1;
#endif
}

TEST_F(Offload, MemoryBudgetOffloadsAndStaysUnder) {
  const Metrics mem = train_ok(kRun, path("mem"));
  const double in_memory_peak = mem.steps.back()["mem"]["total"].get<double>();
  const double optim = mem.steps.back()["mem"]["optim"].get<double>();
  // Between the offloaded need (in-memory peak minus most of the optimizer state) and the
  // in-memory peak.
  const double budget_gb = (in_memory_peak - optim / 2) / 1e9;
  const Metrics off = train_ok(kRun + " --memory-budget " + std::to_string(budget_gb) + " --offload-dir " +
                                   path("files") + kChunks,
                               path("off"));
  ASSERT_EQ(off.steps.size(), 6u);
  for (const auto& j : off.steps) {
    EXPECT_TRUE(j.contains("offload")) << "the budget made the run offload";
    EXPECT_LE(j["mem"]["total"].get<double>(), budget_gb * 1e9) << "measured peak under the budget";
  }
  EXPECT_EQ(bits(off.steps.back()["loss"]), bits(mem.steps.back()["loss"]));
}

TEST_F(Offload, ResumeAfterACrash) {
  // Through the page cache this time (--offload-page-cache), which must not change a bit.
  const std::string args = kRun + " --offload optimizer=nvme --offload-dir " + path("files") + kChunks +
                           " --offload-page-cache --save-every 3 --keep-checkpoints 0";
  const Metrics full = train_ok(args, path("full"));
  ASSERT_FALSE(full.steps.empty());
  EXPECT_FALSE(full.steps[0]["offload"]["direct_io"].get<bool>());
  // The crash: everything after the step-3 checkpoint is lost (the offload file included).
  fs::create_directories(path("cut") + "/checkpoints");
  fs::copy(step_dir(path("full"), 3), step_dir(path("cut"), 3), fs::copy_options::recursive);
  const Metrics resumed = train_ok(args + " --resume", path("cut"));
  ASSERT_EQ(full.steps.size(), 6u);
  ASSERT_EQ(resumed.steps.size(), 3u);
  for (size_t k = 0; k < 3; k++) EXPECT_EQ(bits(resumed.steps[k]["loss"]), bits(full.steps[k + 3]["loss"])) << k + 4;
}

TEST_F(Offload, Bf16MasterWeightsStreamToo) {
  const std::string bf16 = kRun + " --precision bf16 --save-every 3 --keep-checkpoints 0";
  const std::string offload = " --offload optimizer=nvme --offload-dir " + path("files") + kChunks;
  const Metrics mem = train_ok(bf16, path("mem"));
  const Metrics off = train_ok(bf16 + offload, path("off"));
  ASSERT_EQ(mem.steps.size(), 6u);
  ASSERT_EQ(off.steps.size(), 6u);
  const int64_t state_bytes = mem.steps.back()["mem"]["optim"].get<int64_t>();  // master, m, v
  const int64_t params = mem.steps.back()["mem"]["params"].get<int64_t>() / 2;  // 16-bit weights
  EXPECT_EQ(state_bytes, 12 * params) << "fp32 master weights and both moments in memory";
  for (size_t k = 0; k < 6; k++) {
    SCOPED_TRACE(k + 1);
    EXPECT_EQ(bits(off.steps[k]["loss"]), bits(mem.steps[k]["loss"]));
    EXPECT_EQ(off.steps[k]["offload"]["read_bytes"].get<int64_t>(), streamed_bytes(state_bytes, 3)) << "read once";
    EXPECT_EQ(off.steps[k]["offload"]["written_bytes"].get<int64_t>(), streamed_bytes(state_bytes, 3))
        << "written once";
  }
  EXPECT_EQ(off.steps.back()["mem"]["optim"].get<int64_t>(), chunk_buffer_bytes(3))
      << "three rotating (master, m, v) chunk buffers";
  // Resume from the step-3 checkpoint: the master weights come back from it.
  fs::create_directories(path("cut") + "/checkpoints");
  fs::copy(step_dir(path("off"), 3), step_dir(path("cut"), 3), fs::copy_options::recursive);
  const Metrics resumed = train_ok(bf16 + offload + " --resume", path("cut"));
  ASSERT_EQ(resumed.steps.size(), 3u);
  for (size_t k = 0; k < 3; k++) EXPECT_EQ(bits(resumed.steps[k]["loss"]), bits(mem.steps[k + 3]["loss"])) << k + 4;
}

TEST_F(Offload, Zero3ShardsInFilesTrainAsInMemory) {
  const std::string zero3 = kRun + " --zero 3 --grad-accum 2";
  const std::string shards = " --offload params=nvme,grads=nvme --offload-dir " + path("files");
  const std::string saving = " --save-every 3 --keep-checkpoints 0";
  const Metrics mem = train_ok(zero3, path("mem"));
  const Metrics off = train_ok(zero3 + shards + saving, path("off"));
  ASSERT_EQ(mem.steps.size(), 6u);
  ASSERT_EQ(off.steps.size(), 6u);
  for (size_t k = 0; k < 6; k++) {
    SCOPED_TRACE(k + 1);
    EXPECT_EQ(bits(off.steps[k]["loss"]), bits(mem.steps[k]["loss"]));
    EXPECT_EQ(bits(off.steps[k]["grad_norm"]), bits(mem.steps[k]["grad_norm"]));
    const auto& o = off.steps[k]["offload"];
    EXPECT_EQ(o["arrays"], nlohmann::json({"params", "grads"}));
    // Every unit's parameter shard is read at least once a step (the update hands the first
    // units to the next forward, the backward's first unit is held from the forward).
    EXPECT_GE(o["units"]["read_bytes"].get<int64_t>(), mem.steps[k]["mem"]["params"].get<int64_t>());
    EXPECT_GT(o["units"]["written_bytes"].get<int64_t>(), 0);
    EXPECT_EQ(o["direct_io"].get<bool>(), supports_direct_io());
  }
  EXPECT_GT(mem.steps.back()["mem"]["params"].get<int64_t>(), 0);
  EXPECT_EQ(off.steps.back()["mem"]["params"].get<int64_t>(), 0) << "the parameter shard is in its file";
  EXPECT_EQ(off.steps.back()["mem"]["grads"].get<int64_t>(), 0) << "the gradient shard too";
  EXPECT_FALSE(fs::exists(path("files") + "/params_rank0.bin")) << "the files go with the run";

  // Resume from the step-3 checkpoint of the file-backed run: the shards come back into files.
  fs::create_directories(path("cut") + "/checkpoints");
  fs::copy(step_dir(path("off"), 3), step_dir(path("cut"), 3), fs::copy_options::recursive);
  const Metrics resumed = train_ok(zero3 + shards + saving + " --resume", path("cut"));
  ASSERT_EQ(resumed.steps.size(), 3u);
  for (size_t k = 0; k < 3; k++) EXPECT_EQ(bits(resumed.steps[k]["loss"]), bits(mem.steps[k + 3]["loss"])) << k + 4;

#ifdef MESHTRAIN_HAVE_MPI
  const std::string all = " --offload params=nvme,grads=nvme,optimizer=nvme --offload-dir " + path("files") + kChunks;
  // bf16 under a pipeline: 16-bit words in the files, the tied embedding's gradient summed
  // through them.
  for (const std::string layout : {" --dp 2", " --pp 2 --dp 2 --grad-accum 2", " --pp 2 --dp 2 --grad-accum 2 --precision bf16"}) {
    SCOPED_TRACE(layout);
    // --overwrite: each layout's runs start again in the same two folders.
    const std::string args =
        "--model tiny --seq-len 32 --micro-batch 2 --steps 4 --eval-batches 1 --quiet --zero 3 --overwrite" + layout;
    const Metrics dmem = train_ok(args, path("dmem"));
    const Metrics doff = train_ok(args + all, path("doff"));
    ASSERT_EQ(doff.steps.size(), 4u);
    for (size_t k = 0; k < 4; k++) {
      EXPECT_EQ(bits(doff.steps[k]["loss"]), bits(dmem.steps[k]["loss"])) << k + 1;
      EXPECT_EQ(bits(doff.steps[k]["grad_norm"]), bits(dmem.steps[k]["grad_norm"])) << k + 1;
    }
  }
#endif
}

TEST_F(Offload, MemoryBudgetMovesShardsToo) {
  const std::string zero3 = kRun + " --zero 3";
  const Metrics mem = train_ok(zero3, path("mem"));
  const auto& m = mem.steps.back()["mem"];
  const double peak = m["total"].get<double>(), optim = m["optim"].get<double>(), grads = m["grads"].get<double>();
  // Below what moving the optimizer state alone saves; above moving it and the gradients.
  const double budget_gb = (peak - optim - grads / 2) / 1e9;
  const Metrics off = train_ok(zero3 + " --memory-budget " + std::to_string(budget_gb) + " --offload-dir " +
                                   path("files") + kChunks,
                               path("off"));
  ASSERT_EQ(off.steps.size(), 6u);
  for (const auto& j : off.steps) {
    EXPECT_EQ(j["offload"]["arrays"], nlohmann::json({"adam_m", "adam_v", "grads"}));
    EXPECT_LE(j["mem"]["total"].get<double>(), budget_gb * 1e9) << "measured peak under the budget";
  }
  EXPECT_EQ(bits(off.steps.back()["loss"]), bits(mem.steps.back()["loss"]));
  expect_failure(run(train(zero3 + " --memory-budget 0.001 --offload-dir " + path("f2") + " --out " + path("b"))),
                 {"--memory-budget 0.001 GB is too small",
                  "with the optimizer state, grads in files"});  // params: its read-ahead would cost more
}

TEST_F(Offload, BadInputIsRejected) {
  expect_failure(run(train(kRun + " --memory-budget 0.001 --offload-dir " + path("f") + " --out " + path("a"))),
                 {"--memory-budget 0.001 GB is too small", "with the optimizer state in files"});
  expect_failure(run(train(kRun + " --offload optimizer=nvme --out " + path("b"))),
                 {"--offload ...=nvme needs --offload-dir DIR"});
  expect_failure(run(train(kRun + " --offload gpu --out " + path("c"))),
                 {"--offload: 'gpu' is not optimizer=, params= or grads= with cpu or nvme"});
  const std::string dir = " --offload-dir " + path("d");
  expect_failure(run(train(kRun + " --zero 1 --offload params=nvme" + dir + " --out " + path("e"))),
                 {"--offload params=nvme / grads=nvme needs --zero 3", "(got --zero 1)"});
  expect_failure(run(train(kRun + " --zero 3 --offload params=nvme,params=cpu" + dir + " --out " + path("g"))),
                 {"--offload names params twice"});
  expect_failure(run(train(kRun + " --zero 3 --offload params=disk" + dir + " --out " + path("h"))),
                 {"--offload: 'params=disk' is not"});
  expect_failure(run(train(kRun + " --zero 3 --offload-read-ahead 0" + dir + " --out " + path("i"))),
                 {"--offload-read-ahead must be >= 1"});
  EXPECT_FALSE(fs::exists(path("a") + "/metrics.jsonl"));
}

}  // namespace
}  // namespace meshtrain::test_offload
