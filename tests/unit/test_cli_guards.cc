// Guards against a run that cannot work and the failures a user meets without them
// (issue 42, parts 4 and 7): the up-front memory check and named out-of-memory errors, a
// binary config file, non-finite real flags, heartbeats that record the step at once and a
// watchdog summary that blames the rank behind, export's --init and missing folders, and
// the README's resume example. Each CLI case is a tiny run of a few seconds.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "cli_test_util.h"
#include "comm/group.h"
#include "core/text.h"
#include "machine/memory_limit.h"
#include "train/heartbeat.h"

namespace meshtrain::test_cli_guards {
namespace {

namespace fs = std::filesystem;
using cli_test::bits;
using cli_test::describe;
using cli_test::expect_failure;
using cli_test::kBinary;
using cli_test::kTiny;
using cli_test::read_file;
using cli_test::read_metrics;
using cli_test::run;
using cli_test::RunResult;
using cli_test::write_file;
using Guards = cli_test::CliTest;

// kTiny without its --seq-len, for the cases that choose their own.
const std::string kTinyAnyT = "--model tiny --micro-batch 2 --vocab 50257";

// ---- Memory ------------------------------------------------------------------------------

// At --seq-len 2048 the tiny model's logits alone are B x T x V x 4 = 0.82 GB. With 0.5 GB
// to use (MESHTRAIN_MEMORY_LIMIT_GB stands in for the host's memory) the run is refused
// before step 1, naming the predicted peak, the limit and its source, and changes that fit;
// the default tiny run fits the same limit and trains.
TEST_F(Guards, RunTooLargeForMemoryIsRefusedBeforeStepOne) {
  const std::string limit = "MESHTRAIN_MEMORY_LIMIT_GB=0.5 ";
  const RunResult big = run(limit + train(kTinyAnyT + " --seq-len 2048 --steps 1 --out " + path("big")));
  expect_failure(big, {"rank 0 would need ", " GB at its peak", "activations", "more than the 0.5 GB it can use",
                       "MESHTRAIN_MEMORY_LIMIT_GB", "refused before any allocation", "Changes that fit: ",
                       "--micro-batch 1 --grad-accum 2", "--seq-len "});
  EXPECT_FALSE(fs::exists(path("big/metrics.jsonl"))) << describe(big);
  // 16-bit storage: a lower bound from the fp32 replay (activations are fp32 at any precision).
  expect_failure(run(limit + train(kTinyAnyT + " --seq-len 2048 --precision bf16 --steps 1")),
                 {"rank 0 would need at least ", "(16-bit storage: a lower bound from the fp32 replay)"});
  const RunResult small = run(limit + train(kTiny + " --steps 1 --quiet"));
  EXPECT_EQ(small.exit_code, 0) << describe(small);
}

// A bad layout from a plain shell is one error from the launcher, before mpirun starts any
// rank (issue 44: --tp 64 used to start 64 ranks that each printed the same error), and it
// lists every rule the layout breaks. Under mpirun itself every rank says it, before any
// work.
TEST_F(Guards, TheLauncherRefusesABadLayoutOnceBeforeStartingRanks) {
  const auto t0 = std::chrono::steady_clock::now();
  const RunResult r = run(train(kTiny + " --tp 64 --steps 1 --out " + path("tp64")));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  expect_failure(r, {"--tp 64 does not divide the number of heads (4)"});
  EXPECT_EQ(r.err.find("starting "), std::string::npos) << "no rank started\n" << describe(r);
  EXPECT_EQ(cli_test::lines_of(r.err).size(), 1u) << "one error\n" << describe(r);
  EXPECT_LT(seconds, 5.0) << describe(r);
  EXPECT_FALSE(fs::exists(path("tp64/metrics.jsonl")));
  // Every broken rule at once.
  const RunResult many = run(train(kTiny + " --tp 3 --pp 1 --dp 2 --zero 3 --schedule 2bw --compress powersgd --steps 1"));
  expect_failure(many, {"--tp 3 does not divide the number of heads (4)",
                        "--schedule 2bw keeps the weights before the last update", "--schedule 2bw does not run with --compress yet",
                        "--compress powersgd runs with --zero 0 (its bucket all-reduce), got --zero 3"});
  EXPECT_EQ(many.err.find("starting "), std::string::npos) << describe(many);
#ifdef MESHTRAIN_HAVE_MPI
  const RunResult ranks =
      run("mpirun --oversubscribe --allow-run-as-root -n 2 " + train(kTiny + " --tp 2 --heads 3 --dim 48 --steps 1"));
  EXPECT_NE(ranks.exit_code, 0) << describe(ranks);
  size_t said = 0;
  for (const std::string& line : cli_test::lines_of(ranks.err))
    said += line.find("--tp 2 does not divide the number of heads (3)") != std::string::npos;
  EXPECT_EQ(said, 2u) << "once per rank\n" << describe(ranks);
#endif
}

// Two ranks on one host share its memory: each may use half, and each refuses the run with
// its own figures before any work (the verdict is agreed, so neither waits for the other).
TEST_F(Guards, EveryRankRefusesARunTooLargeForItsShare) {
  const RunResult r = run("MESHTRAIN_MEMORY_LIMIT_GB=0.5 " + train(kTinyAnyT + " --seq-len 1024 --dp 2 --steps 1"));
  expect_failure(r, {"more than the 0.25 GB it can use (MESHTRAIN_MEMORY_LIMIT_GB 0.5 GB shared by 2 ranks "
                     "on this host)"});
  for (const char* rank : {"rank 0 would need ", "rank 1 would need "})
    EXPECT_NE(r.err.find(rank), std::string::npos) << describe(r);
}

// A real limit: the process's address space (ulimit -v, 1.5 GB) is read as one, and a run
// that cannot fit it (about 1.9 GB at --seq-len 4096) is refused up front.
TEST_F(Guards, AddressSpaceLimitIsReadAsTheMemoryToUse) {
#ifdef MESHTRAIN_SANITIZED
  GTEST_SKIP() << "AddressSanitizer reserves terabytes of address space: ulimit -v stops it from starting";
#endif
  const RunResult r = run("ulimit -v 1500000 && " + train(kTinyAnyT + " --seq-len 4096 --steps 1"));
  expect_failure(r, {"rank 0 would need ", "ulimit -v (RLIMIT_AS)", "refused before any allocation"});
}

// An allocation that fails (the check told, through MESHTRAIN_MEMORY_LIMIT_GB, that the host
// has memory that ulimit -v does not give) names the buffer's category and size, not
// "std::bad_alloc".
TEST_F(Guards, OutOfMemoryNamesTheAllocation) {
#ifdef MESHTRAIN_SANITIZED
  GTEST_SKIP() << "AddressSanitizer needs more address space than ulimit -v leaves, and aborts on a failed allocation";
#endif
  const RunResult r = run("ulimit -v 1500000 && MESHTRAIN_MEMORY_LIMIT_GB=1000 " +
                          train(kTinyAnyT + " --seq-len 8192 --steps 1"));
  expect_failure(r, {"meshtrain: error: out of memory: allocating ", " GB for ", " failed; this process's tracked "
                     "buffers held "});
  EXPECT_EQ(r.err.find("std::bad_alloc"), std::string::npos) << describe(r);
}

TEST(MemoryLimit, ParsesMeminfoAndCgroupFiles) {
  EXPECT_EQ(machine::parse_mem_available("MemTotal: 100 kB\nMemAvailable:   2048 kB\n"), 2048.0 * 1024);
  EXPECT_LT(machine::parse_mem_available("MemTotal: 100 kB\n"), 0);
  EXPECT_EQ(machine::parse_cgroup_limit("1073741824\n"), 1073741824.0);
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_EQ(machine::parse_cgroup_limit("max\n"), inf);
  EXPECT_EQ(machine::parse_cgroup_limit("9223372036854771712\n"), inf);  // v1's "no limit"
  EXPECT_LT(machine::parse_cgroup_limit("garbage"), 0);
}

// ---- Config files and real flags -----------------------------------------------------------

TEST(Text, FindsTheFirstNonTextByte) {
  EXPECT_EQ(first_non_text_byte("a = 1\n\tb = \"h\xC3\xA9\"\r\n"), std::string::npos);
  EXPECT_EQ(first_non_text_byte(std::string("ab\0c", 4)), 2u);
  EXPECT_EQ(first_non_text_byte("ab\xFF"), 2u);
  EXPECT_EQ(first_non_text_byte("\xC0\x80"), 0u);       // overlong NUL
  EXPECT_EQ(first_non_text_byte("x\xED\xA0\x80"), 1u);  // a surrogate
  EXPECT_EQ(first_non_text_byte("\x1B[0m"), 0u);        // an escape sequence
  EXPECT_EQ(escaped_excerpt(std::string("ab\0\xFF", 4), 2), "ab\\x00\\xFF");
}

// A config file of binary bytes is named as such, with the offending byte escaped and its
// place; the message carries no NUL or raw byte.
TEST_F(Guards, BinaryConfigFileIsNamedCleanly) {
  const std::string file = path("garbage.toml");
  const char bytes[] = "steps = 2\nx\0\x01\xFF\xFE = \x80\x81\n";
  write_file(file, std::string(bytes, sizeof bytes - 1));
  const RunResult r = run(train("--config " + file));
  expect_failure(r, {"config file " + file + " is not a UTF-8 text TOML file: byte 0x00 at line 2, column 2",
                     "near \"ps = 2\\x0Ax\\x00\\x01\\xFF\\xFE = \\x80\\x81\""});
  for (const char c : r.err) EXPECT_TRUE(((unsigned char)c >= 0x20 && (unsigned char)c < 0x7F) || c == '\n') << (int)c;
}

// NaN, infinities and negative values of real-valued flags are refused by name; --grad-clip
// 0 stays "no clipping", as documented.
TEST_F(Guards, NonFiniteAndNegativeRealFlagsAreRefused) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--grad-clip nan", "--grad-clip must be a finite norm > 0, or 0 for no clipping, got nan"},
      {"--grad-clip -1", "--grad-clip must be a finite norm > 0, or 0 for no clipping, got -1"},
      {"--lr inf", "--lr must be a finite number >= 0, got inf"},
      {"--min-lr nan", "--min-lr must be a finite number >= 0"},
      {"--weight-decay inf", "--weight-decay must be a finite number >= 0, got inf"},
      {"--beta1 nan", "--beta1 must be in [0, 1)"},
      {"--eps inf", "--eps must be a finite number > 0, got inf"},
      {"--dropout nan", "--dropout must be in [0, 1)"},
      {"--comm-timeout inf", "--comm-timeout must be a finite number of seconds >= 0"},
      {"--peak-gflops nan", "--peak-gflops must be a finite number >= 0"},
  };
  for (const auto& [flags, message] : cases) {
    SCOPED_TRACE(flags);
    expect_failure(run(kBinary + " train --data " + corpus_ + " --threads 2 " + kTiny + " --steps 1 " + flags),
                   {message});
  }
  const RunResult off = run(train(kTiny + " --steps 1 --quiet --grad-clip 0"));
  EXPECT_EQ(off.exit_code, 0) << describe(off);
}

// --doc-mask finds the data's end-of-text token in the tokenizer copy prep keeps (Brown's:
// GPT-2's 50256), says so in the banner and config.json; a separator outside the vocabulary,
// a --doc-separator without --doc-mask and data without a tokenizer copy are refused before
// training starts.
TEST_F(Guards, DocumentMasksFindTheirSeparatorOrSayWhy) {
  const RunResult ok = run(train(kTiny + " --steps 2 --doc-mask --out " + path("run")));
  ASSERT_EQ(ok.exit_code, 0) << describe(ok);
  EXPECT_NE(ok.out.find("document masks: each packed document attends only to itself, positions restart after "
                        "token 50256"),
            std::string::npos)
      << ok.out;
  EXPECT_NE(read_file(path("run") + "/config.json").find("\"doc_mask\": true"), std::string::npos);
  expect_failure(run(train(kTiny + " --steps 1 --doc-mask --doc-separator 50257")),
                 {"--doc-mask: the end-of-text token 50257 is not in the model's vocabulary of 50257 ids"});
  expect_failure(run(train(kTiny + " --steps 1 --doc-separator 13")), {"--doc-separator goes with --doc-mask"});
  // A bare token file: no tokenizer copy beside it.
  const std::string bare = path("bare");
  std::filesystem::create_directories(bare);
  std::filesystem::copy_file(corpus_ + "/train.bin", bare + "/train.bin");
  expect_failure(run(train(kTiny + " --steps 1 --doc-mask", bare)),
                 {"--doc-mask: --data " + bare + " holds no copy of its tokenizer", "give --doc-separator ID"});
  const RunResult named = run(train(kTiny + " --steps 1 --doc-mask --doc-separator 50256 --quiet", bare));
  EXPECT_EQ(named.exit_code, 0) << describe(named);
}

// ---- Heartbeats and the watchdog's summary ---------------------------------------------------

// A new step is written at once, not at the next timed beat (5 s here): a rank that dies
// mid-step is reported at that step.
TEST(HeartbeatStep, IsWrittenAsSoonAsTheStepChanges) {
  const std::string out = (fs::temp_directory_path() / ("meshtrain_beat_" + cli_test::kPid)).string();
  fs::remove_all(out);
  fs::create_directories(out);
  {
    train::Heartbeat beat(out, 0, /*interval_s=*/5);
    auto step_seen = [&](int64_t step) {
      for (int i = 0; i < 100; i++) {
        const std::vector<train::RankBeat> b = train::read_heartbeats(out, 1);
        if (b[0].present && b[0].step == step) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      return false;
    };
    comm::set_current_step(6);
    EXPECT_TRUE(step_seen(6)) << "step 6 not written within 1 s";
    comm::set_current_step(7);
    EXPECT_TRUE(step_seen(7)) << "step 7 not written within 1 s";
    beat.finish(true);
  }
  comm::set_current_step(-1);
  fs::remove_all(out);
}

train::RankBeat beat(int rank, int64_t step, const std::string& op, double age_s = 0.5) {
  train::RankBeat b;
  b.rank = rank, b.present = true, b.host = "h" + std::to_string(rank / 2), b.state = "running";
  b.step = step, b.op = op, b.axis = op.empty() ? "" : "dp", b.waited_s = 2, b.age_s = age_s;
  return b;
}

// The rank behind is judged from every rank's beat, whichever rank's watchdog fired.
TEST(HeartbeatStep, TheRankBehindIsNotTheReporter) {
  const double stale = 4;
  // Rank 1 computes while rank 0 waits: rank 1.
  EXPECT_EQ(train::rank_behind({beat(0, 3, "all_reduce"), beat(1, 3, "")}, stale), 1);
  // Rank 2's beat went stale (the oldest): rank 2, though rank 1 also computes.
  EXPECT_EQ(train::rank_behind({beat(0, 3, "all_reduce"), beat(1, 3, ""), beat(2, 2, "", 9)}, stale), 2);
  // Everyone waits; rank 3 is a step behind.
  EXPECT_EQ(train::rank_behind({beat(0, 5, "all_reduce"), beat(1, 5, "all_reduce"), beat(2, 5, "all_reduce"),
                                beat(3, 4, "all_reduce")},
                               stale),
            3);
  // Everyone waits at one step: none (the network).
  EXPECT_EQ(train::rank_behind({beat(0, 5, "all_reduce"), beat(1, 5, "all_gather")}, stale), -1);
  const std::string list = train::list_heartbeats({beat(0, 5, "all_reduce"), beat(1, 4, "")}, "  ");
  EXPECT_EQ(list,
            "  rank 0 on h0: step 5, 0.5 s ago, waiting in all_reduce on dp for 2.0 s\n"
            "  rank 1 on h0: step 4, 0.5 s ago, running, not in a collective");
  // The ranks' own report names the one behind too, with each group's beat age.
  const std::string d = train::diagnose_ranks({beat(0, 5, "all_reduce"), beat(1, 4, "all_reduce")}, 0, stale);
  EXPECT_NE(d.find("at fault: rank 1 (host h0), behind at step 4 while others are at step 5"), std::string::npos) << d;
  EXPECT_NE(d.find("(beat 0.5 s ago)"), std::string::npos) << d;
}

// Rank 1 stalls at step 3 (not in any collective); rank 0's watchdog fires. The launcher's
// summary names rank 1 as the rank behind, not rank 0, and lists every rank's heartbeat.
TEST_F(Guards, WatchdogSummaryBlamesTheRankBehind) {
  const RunResult r = run(train(kTiny + " --dp 2 --debug-stall-rank 1 --debug-stall-step 3 --comm-timeout 2 --steps 6 "
                                        "--quiet --out " + path("stall")));
  EXPECT_NE(r.exit_code, 0) << describe(r);
  EXPECT_NE(r.err.find("the job failed: rank 0's watchdog fired: comm timeout: "), std::string::npos) << describe(r);
  EXPECT_NE(r.err.find("; the rank behind is rank 1 on host "), std::string::npos) << describe(r);
  EXPECT_NE(r.err.find("(step 3); no checkpoint was saved\nthe ranks' last heartbeats:\n  rank 0 on "),
            std::string::npos)
      << describe(r);
  EXPECT_NE(r.err.find(": step 3, "), std::string::npos) << describe(r);
  EXPECT_NE(r.err.find("running, not in a collective"), std::string::npos) << describe(r);
}

// ---- export ----------------------------------------------------------------------------------

// export --init writes the weights train --seed starts from: a run from that file trains
// bit for bit as the seeded run. --out's missing folders are made.
TEST_F(Guards, ExportInitStartsAnotherTrainerFromTheSameWeights) {
  const std::string file = path("new/folders/init.bin");
  const RunResult e = run(kBinary + " export --init --model tiny --seq-len 32 --vocab 50257 --seed 7 --format llmc "
                                    "--out " + file);
  ASSERT_EQ(e.exit_code, 0) << describe(e);
  const RunResult seeded = run(train(kTiny + " --seed 7 --steps 2 --quiet --out " + path("seeded")));
  const RunResult loaded = run(train(kTiny + " --init-from " + file + " --steps 2 --quiet --out " + path("loaded")));
  ASSERT_EQ(seeded.exit_code, 0) << describe(seeded);
  ASSERT_EQ(loaded.exit_code, 0) << describe(loaded);
  const auto want = read_metrics(path("seeded/metrics.jsonl")), got = read_metrics(path("loaded/metrics.jsonl"));
  ASSERT_EQ(got.steps.size(), 2u);
  for (size_t i = 0; i < 2; i++) EXPECT_EQ(bits(got.steps[i]["loss"]), bits(want.steps[i]["loss"])) << "step " << i + 1;
  const RunResult again = run(kBinary + " export --checkpoint " + file + " --out " + path("a/b/model.safetensors"));
  EXPECT_EQ(again.exit_code, 0) << describe(again);
  EXPECT_TRUE(fs::exists(path("a/b/model.safetensors")));
  expect_failure(run(kBinary + " export --out " + path("x.bin")), {"give --checkpoint", "or --init"});
}

// ---- The README ------------------------------------------------------------------------------

// The README's train-then-resume lines, run as written but with paths moved into the test's
// folder and fewer steps (2, then --steps 100 read as 3): the resume continues a finished run.
TEST_F(Guards, ReadmeResumeExampleWorksAsWritten) {
  std::vector<std::string> lines;
  for (const std::string& line : cli_test::lines_of(read_file(std::string(MESHTRAIN_SOURCE_DIR) + "/README.md")))
    if (line.starts_with("build/meshtrain train --config configs/tiny.toml --data data/brown --out runs/tiny") ||
        line.starts_with("build/meshtrain train --config runs/tiny/config.toml --resume"))
      lines.push_back(line.substr(0, line.find('#')));
  ASSERT_EQ(lines.size(), 2u) << "the README's two lines were not found";
  for (const std::string& line : lines) {
    std::string cmd = line;
    auto replace = [&](const std::string& from, const std::string& to) {
      for (size_t at = cmd.find(from); at != std::string::npos; at = cmd.find(from, at + to.size()))
        cmd.replace(at, from.size(), to);
    };
    replace("build/meshtrain", kBinary);
    replace("configs/", std::string(MESHTRAIN_SOURCE_DIR) + "/configs/");
    replace("data/brown", corpus_);
    replace("runs/", dir_ + "/runs/");
    replace("--steps 100", "--steps 3");
    if (cmd.find("--resume") == std::string::npos) cmd += " --steps 2";
    const RunResult r = run(cmd + " --threads 2 --peak-gflops 100 --quiet");
    ASSERT_EQ(r.exit_code, 0) << line << "\n" << describe(r);
  }
  EXPECT_EQ(read_metrics(dir_ + "/runs/tiny/metrics.jsonl").steps.size(), 3u);
}

}  // namespace
}  // namespace meshtrain::test_cli_guards
