// What a run guarantees when it is stopped, doubled, killed or damaged (issue 42): one job
// per run folder, ranks that end with their launcher, a stop between steps on SIGINT and
// SIGTERM at every layout, checkpoints that resume from the newest intact one, a folder that
// is checked before step 1 and never mixes two runs, and a limit on skipped steps. Each runs
// the real binary.
#include <signal.h>
#include <sys/mount.h>

#include <chrono>
#include <thread>

#include "cli_test_util.h"

namespace meshtrain::cli_test {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A job in the background: its pid, and where its stdout and stderr go.
struct Background {
  std::string pid, log;
};

class RunSafety : public CliTest {
 protected:
  Background start(const std::string& args, const std::string& log) {
    RunResult r = run("sh -c '" + train(args) + " > " + log + " 2>&1 & echo $!'");
    return {lines_of(r.out).at(0), log};
  }
  // Waits (up to a minute) until the run's metrics.jsonl holds `records` step records.
  bool wait_for_steps(const std::string& out, size_t records) {
    for (int i = 0; i < 600; i++) {
      if (fs::exists(out + "/metrics.jsonl") && read_metrics(out + "/metrics.jsonl").steps.size() >= records) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }
  // Whether a background job (not our child) has ended within `seconds`.
  bool wait_gone(const Background& b, int seconds) {
    for (int i = 0; i < seconds * 10; i++) {
      if (run("kill -0 " + b.pid + " 2>/dev/null").exit_code != 0) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }
};

// The processes whose command line names `marker` (the run folder) and meshtrain.
int processes_naming(const std::string& marker) {
  int n = 0;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos || name == kPid) continue;
    std::string cmd = read_file(e.path().string() + "/cmdline");
    std::replace(cmd.begin(), cmd.end(), '\0', ' ');
    if (cmd.find(marker) != std::string::npos && cmd.find("meshtrain train") != std::string::npos &&
        !cmd.starts_with("sh -c") && !cmd.starts_with("mpirun"))
      n++;
  }
  return n;
}

json heartbeat(const std::string& out, int rank) {
  char name[32];
  std::snprintf(name, sizeof name, "/heartbeat/rank_%05d.json", rank);
  return json::parse(read_file(out + name), nullptr, false);
}

// A script that runs `cmd` in the background, sends `sig` to it once `out` has `records`
// step records, and prints its exit code: the code of a process we started ourselves.
std::string signal_after_steps(const std::string& cmd, const std::string& out, int records, const char* sig) {
  return "sh -c '" + cmd + " & p=$!; for i in $(seq 600); do n=$(grep -c \"\\\"loss\\\"\" " + out +
         "/metrics.jsonl 2>/dev/null || echo 0); [ \"$n\" -ge " + std::to_string(records) +
         " ] && break; sleep 0.1; done; kill -" + sig + " $p; wait $p; echo \"exit $?\"'";
}

TEST_F(RunSafety, ASecondJobOnTheFolderIsRefusedNamingTheFirst) {
  const std::string out = path("run");
  const Background a = start(kTiny + " --steps 100000 --out " + out, path("a.log"));
  ASSERT_TRUE(wait_for_steps(out, 1)) << read_file(a.log);
  // One rank, and from a plain shell with two ranks (refused before any rank starts).
  for (const std::string& extra : {std::string(" --overwrite"), std::string(" --dp 2 --resume")}) {
    RunResult b = run(train(kTiny + " --steps 5 --out " + out + extra));
    expect_failure(b, {"the run folder " + out + " is in use by another job: pid " + a.pid + " on host"});
    EXPECT_EQ(b.err.find("starting 2 ranks"), std::string::npos) << b.err;
  }
  // The first job is untouched, and ends as a SIGTERM ends a run: saved, at a step boundary.
  ASSERT_EQ(run("kill -TERM " + a.pid).exit_code, 0);
  ASSERT_TRUE(wait_gone(a, 60)) << read_file(a.log);
  const std::string log = read_file(a.log);
  EXPECT_NE(log.find("interrupted by SIGTERM at step"), std::string::npos) << log;
  EXPECT_EQ(heartbeat(out, 0).value("state", ""), "interrupted");
  const Metrics m = read_metrics(out + "/metrics.jsonl");
  for (size_t i = 0; i < m.steps.size(); i++) EXPECT_EQ(m.steps[i]["step"].get<int>(), (int)i + 1);
}

// SIGINT (Ctrl-C) at pp 2 and SIGTERM at dp 2: every rank stops after the same step, the exit
// code is the shell's for the signal, the heartbeats say so, and SIGTERM saves the step.
TEST_F(RunSafety, SignalsStopEveryRankAtTheSameStep) {
  for (const auto& [sig, layout] : {std::pair{"INT", " --pp 2"}, std::pair{"TERM", " --dp 2"}}) {
    const std::string out = path(std::string("run_") + sig);
    RunResult r = run(signal_after_steps(train(kTiny + layout + " --steps 100000 --out " + out), out, 3, sig));
    const int code = std::string(sig) == "INT" ? 130 : 143;
    EXPECT_NE(r.out.find("exit " + std::to_string(code)), std::string::npos) << describe(r);
    const json b0 = heartbeat(out, 0), b1 = heartbeat(out, 1);
    EXPECT_EQ(b0.value("state", ""), "interrupted") << b0;
    EXPECT_EQ(b1.value("state", ""), "interrupted") << b1;
    EXPECT_EQ(b0.value("step", -1), b1.value("step", -2));
    const int64_t step = b0.value("step", (int64_t)0);
    EXPECT_NE(r.err.find("interrupted by SIG" + std::string(sig) + " at step " + std::to_string(step)), std::string::npos)
        << describe(r);
    char name[32];
    std::snprintf(name, sizeof name, "/checkpoints/step_%08lld", (long long)step);
    EXPECT_EQ(fs::exists(out + name), code == 143) << r.err;
    if (code == 143) EXPECT_NE(r.err.find("continue with: meshtrain train --config " + out), std::string::npos);
    else EXPECT_NE(r.err.find("are not saved (--save-on-exit always"), std::string::npos) << r.err;
  }
}

// The launcher SIGKILLed: its ranks do not train on, orphaned, and the folder is free again.
TEST_F(RunSafety, RanksEndWithTheirLauncher) {
  const std::string out = path("run");
  const Background a = start(kTiny + " --dp 2 --steps 100000 --out " + out, path("a.log"));
  ASSERT_TRUE(wait_for_steps(out, 2)) << read_file(a.log);
  EXPECT_EQ(processes_naming(out), 3) << "the launcher and two ranks";
  ASSERT_EQ(run("kill -KILL " + a.pid).exit_code, 0);
  int left = -1;
  for (int i = 0; i < 300 && left != 0; i++) {
    left = processes_naming(out);
    if (left) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(left, 0) << "ranks still running 30 s after their launcher was killed";
  // Nothing holds the folder: a restart runs, and never beside the job it replaces.
  RunResult again = run(train(kTiny + " --dp 2 --steps 3 --out " + path("run") + " --overwrite"));
  EXPECT_EQ(again.exit_code, 0) << describe(again);
}

TEST_F(RunSafety, ResumeTakesTheNewestIntactCheckpointAndSaysWhy) {
  const std::string out = path("run"), flags = kTiny + " --save-every 2 --keep-checkpoints 0 --out " + out;
  ASSERT_EQ(run(train(flags + " --steps 6 --quiet")).exit_code, 0);
  // Step 6's shard loses two bytes in the middle; step 4 loses its index.
  const std::string shard = out + "/checkpoints/step_00000006/shard_00000.bin";
  std::string bytes = read_file(shard);
  bytes[bytes.size() / 2] ^= 0x5a;
  write_file(shard, bytes);
  fs::remove(out + "/checkpoints/step_00000004/index.json");

  // Every command given the run folder takes the newest intact checkpoint, and says so.
  RunResult gen = run(kBinary + " generate --checkpoint " + out + " --prompt Hi --max-new-tokens 2 --threads 1");
  EXPECT_EQ(gen.exit_code, 0) << describe(gen);
  EXPECT_NE(gen.err.find("note: using " + out + "/checkpoints/step_00000002, the newest intact checkpoint of " + out +
                         ": step_00000006 is damaged"),
            std::string::npos) << gen.err;
  RunResult strict = run(train(flags + " --steps 8 --resume --resume-strict"));
  expect_failure(strict, {"--resume-strict: the newest checkpoint " + out + "/checkpoints/step_00000006 is damaged",
                          "checksum mismatch"});
  RunResult r = run(train(flags + " --steps 8 --resume"));
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_NE(r.out.find("resumed at step 2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("the newest intact checkpoint, step_00000002, was taken: step_00000006 is damaged"),
            std::string::npos) << r.out;
  EXPECT_NE(r.out.find("step_00000004 is damaged (cannot open " + out + "/checkpoints/step_00000004/index.json"),
            std::string::npos) << r.out;
  EXPECT_TRUE(fs::exists(out + "/checkpoints/damaged_step_00000006")) << "kept for a look";
  EXPECT_TRUE(fs::exists(out + "/checkpoints/step_00000006/index.json")) << "saved again by the resumed run";
  const Metrics m = read_metrics(out + "/metrics.jsonl");
  ASSERT_EQ(m.steps.size(), 8u);
  for (size_t i = 0; i < m.steps.size(); i++) EXPECT_EQ(m.steps[i]["step"].get<int>(), (int)i + 1);
}

TEST_F(RunSafety, AFolderThatHoldsARunIsNeverMixedSilently) {
  const std::string out = path("run");
  RunResult first = run(train(kTiny + " --steps 3 --out " + out));
  ASSERT_EQ(first.exit_code, 0) << describe(first);
  // The run's last lines: the loss, the checkpoint, how to continue and use it.
  EXPECT_NE(first.out.find("done: steps 1-3 in "), std::string::npos) << first.out;
  EXPECT_NE(first.out.find("checkpoint: " + out + "/checkpoints/step_00000003"), std::string::npos) << first.out;
  EXPECT_NE(first.out.find("continue with: meshtrain train --config " + out + "/config.toml --resume --steps 6"),
            std::string::npos) << first.out;
  RunResult again = run(train(kTiny + " --steps 2 --out " + out));
  expect_failure(again, {"--out " + out + " already holds a run (checkpoints/step_00000003 and metrics.jsonl with",
                         "give --resume to continue it, --overwrite"});
  expect_failure(run(train(kTiny + " --steps 2 --out " + out + " --resume --overwrite")), {"give one of them"});
  RunResult fresh = run(train(kTiny + " --steps 2 --out " + out + " --overwrite"));
  ASSERT_EQ(fresh.exit_code, 0) << describe(fresh);
  EXPECT_FALSE(fs::exists(out + "/checkpoints/step_00000003")) << "the old run's checkpoint stayed";
  const Metrics m = read_metrics(out + "/metrics.jsonl");
  ASSERT_EQ(m.steps.size(), 2u);
  // The continue line works as printed, and the README's resume example does too.
  RunResult more = run(kBinary + " train --config " + out + "/config.toml --resume --steps 4 --peak-gflops 100");
  ASSERT_EQ(more.exit_code, 0) << describe(more);
  EXPECT_NE(more.out.find("resumed at step 2"), std::string::npos) << more.out;
}

// A read-only file system (root writes through permission bits): refused before step 1,
// with the operating system's reason.
TEST_F(RunSafety, AnUnwritableFolderIsRefusedBeforeTheFirstStep) {
  const std::string ro = path("ro");
  fs::create_directories(ro);
  ASSERT_EQ(::mount("tmpfs", ro.c_str(), "tmpfs", MS_RDONLY, "size=1m"), 0) << "mount: " << std::strerror(errno);
  RunResult r = run(train(kTiny + " --steps 2 --out " + ro + "/run"));
  RunResult inside = run(train(kTiny + " --steps 2 --out " + ro));
  ::umount(ro.c_str());
  expect_failure(r, {"cannot create the run folder " + ro + "/run", "Read-only file system"});
  expect_failure(inside, {"cannot write into " + ro + ": Read-only file system"});
}

TEST_F(RunSafety, SkippedStepsInARowStopTheRun) {
  RunResult r = run(train(kTiny + " --steps 30 --lr 1e4 --warmup-steps 0 --on-nonfinite skip --max-skipped-steps 3"));
  EXPECT_EQ(r.exit_code, 1) << describe(r);
  EXPECT_NE(r.err.find("were all skipped (3 in a row, --max-skipped-steps 3): the run has diverged"), std::string::npos)
      << describe(r);
  EXPECT_EQ(r.out.find("step    30/30"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace meshtrain::cli_test
