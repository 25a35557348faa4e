// Shared by the end-to-end multi-rank tests (test_data_parallel.cc, test_tensor_parallel.cc):
// running many `meshtrain train` jobs at once, each bounded by `timeout` so a hang fails a
// test instead of stalling the suite; a fixture that caches training runs per suite folder
// so tests of one process share them; and readers of checkpoints for the parity checks.
// Every helper is inline so that each test file can include this header.
#pragma once
#include <gtest/gtest.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "cli_test_util.h"
#include "model/gpt.h"

extern char** environ;

namespace meshtrain::multirank_test {

using Clock = std::chrono::steady_clock;

// ---- Running the binary, several runs at a time ------------------------------------------

struct Job {
  std::string cmd;  // run with /bin/sh -c, stdout and stderr captured
  int ranks = 1;    // cores it keeps busy
  int limit_s = 300;
  cli_test::RunResult result;
  double seconds = 0;
};

// The machine's core count (at least 1).
inline int core_count() { return (int)std::max(1u, std::thread::hardware_concurrency()); }

// MESHTRAIN_TEST_SLOTS when set (to run fewer jobs at once than there are cores), else the
// core count.
inline int slots_from_env_or_cores() {
  const char* slots = std::getenv("MESHTRAIN_TEST_SLOTS");
  return slots ? std::max(1, std::atoi(slots)) : core_count();
}

// Runs every job, as many at a time as `capacity` allows (a job counts its ranks, capped at
// the capacity; one job always runs), each under `timeout -k 10 LIMIT`. Output goes through
// files in `scratch`, removed once read.
inline void run_jobs(const std::vector<Job*>& jobs, const std::string& scratch, int capacity) {
  struct Running {
    Job* job;
    pid_t pid;
    int weight;
    std::string out, err;
    Clock::time_point t0;
  };
  static int counter = 0;  // unique scratch names across calls (and suites) of this process
  std::vector<Running> running;
  size_t next = 0;
  int used = 0;
  while (next < jobs.size() || !running.empty()) {
    while (next < jobs.size()) {
      Job* job = jobs[next];
      const int w = std::min(std::max(job->ranks, 1), capacity);
      if (!running.empty() && used + w > capacity) break;
      const std::string base = scratch + "/job" + std::to_string(counter++);
      Running r{job, -1, w, base + ".out", base + ".err", Clock::now()};
      posix_spawn_file_actions_t fa;
      posix_spawn_file_actions_init(&fa);
      posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
      posix_spawn_file_actions_addopen(&fa, 1, r.out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      posix_spawn_file_actions_addopen(&fa, 2, r.err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      std::vector<std::string> args = {"timeout", "-k", "10", std::to_string(job->limit_s),
                                       "/bin/sh", "-c", job->cmd};
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      const int rc = posix_spawnp(&r.pid, "timeout", &fa, nullptr, argv.data(), environ);
      posix_spawn_file_actions_destroy(&fa);
      next++;
      if (rc != 0) {
        job->result.exit_code = -1;
        job->result.err = "posix_spawnp failed: " + std::string(std::strerror(rc));
        continue;
      }
      used += w;
      running.push_back(std::move(r));
    }
    bool reaped = false;
    for (auto it = running.begin(); it != running.end();) {
      int status = 0;
      if (::waitpid(it->pid, &status, WNOHANG) != it->pid) {
        ++it;
        continue;
      }
      Job* job = it->job;
      job->seconds = std::chrono::duration<double>(Clock::now() - it->t0).count();
      job->result.exit_code = WIFEXITED(status)     ? WEXITSTATUS(status)
                              : WIFSIGNALED(status) ? 128 + WTERMSIG(status)
                                                    : -1;
      job->result.out = cli_test::read_file(it->out);
      job->result.err = cli_test::read_file(it->err);
      std::filesystem::remove(it->out);
      std::filesystem::remove(it->err);
      used -= it->weight;
      it = running.erase(it);
      reaped = true;
    }
    if (!reaped) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

// Occurrences of `part` in `text` (overlapping ones included): e.g. one message per rank.
inline size_t count_of(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) n++;
  return n;
}

// `meshtrain eval` of an exported model file and of the run folder it came from: both
// succeed, print the same, and print the run's final val loss (to its 4 printed decimals).
inline void expect_evals_reproduce(const Job& of_file, const Job& of_run, double val_loss) {
  ASSERT_EQ(of_file.result.exit_code, 0) << cli_test::describe(of_file.result);
  ASSERT_EQ(of_run.result.exit_code, 0) << cli_test::describe(of_run.result);
  const std::string& out = of_file.result.out;
  const size_t at = out.find("val loss ");
  ASSERT_NE(at, std::string::npos) << out;
  const double printed = std::atof(out.c_str() + at + 9);
  EXPECT_LE(std::fabs(printed - val_loss), 0.5e-4 + 1e-6)
      << "eval printed " << out << "the run's final val_loss is " << val_loss;
  EXPECT_EQ(of_file.result.out, of_run.result.out);
}

// A run refused before any work: it failed (not by the test's timeout), printed no step
// line, and wrote neither metrics.jsonl nor checkpoints into `out_dir`. Who refused it
// shows in the output: the launcher, before mpirun started any rank (a bad layout or flag:
// train::check_flags_and_layout), says every part once and starts nothing; otherwise the
// job was launched as `ranks` ranks and every rank said every part.
inline void expect_rejected_by_every_rank(const cli_test::RunResult& r, int ranks,
                                          const std::vector<std::string>& parts,
                                          const std::string& out_dir) {
  using cli_test::describe;
  EXPECT_NE(r.exit_code, 0) << describe(r);
  EXPECT_NE(r.exit_code, 124) << "killed by the test's timeout\n" << describe(r);
  EXPECT_FALSE(cli_test::has_step_line(r.out)) << describe(r);
  const bool launched = r.err.find("starting " + std::to_string(ranks) + " ranks") != std::string::npos;
  EXPECT_TRUE(launched || r.err.find("starting ") == std::string::npos) << describe(r);
  const size_t times = launched ? (size_t)ranks : 1;
  for (const auto& p : parts)
    EXPECT_EQ(count_of(r.err, p), times) << "'" << p << "' " << (launched ? "once per rank" : "once, by the launcher")
                                         << " in\n" << describe(r);
  EXPECT_FALSE(std::filesystem::exists(out_dir + "/metrics.jsonl"));
  EXPECT_FALSE(std::filesystem::exists(out_dir + "/checkpoints"));
}

// The worst differences of a layout's run from the reference run, and the steps off.
struct ParityMargins {
  double loss = 0, norm = 0;  // |loss diff|, relative grad_norm diff
  int bad = 0;
};

// Step s (0-based) of a layout's metrics `j` against the reference's `r`: the same step and
// token count, the loss within loss_tol, the grad norm within norm_rel_tol (relative). The
// first three steps off of a run are reported one by one; `m` keeps the worst margins.
inline void expect_step_parity(const nlohmann::json& j, const nlohmann::json& r, int s,
                               double loss_tol, double norm_rel_tol, ParityMargins* m) {
  EXPECT_EQ(j["step"], s + 1);
  EXPECT_EQ(j["tokens"], r["tokens"]);
  const double dl = std::fabs(j["loss"].get<double>() - r["loss"].get<double>());
  const double dn = std::fabs(j["grad_norm"].get<double>() / r["grad_norm"].get<double>() - 1);
  m->loss = std::max(m->loss, dl);
  m->norm = std::max(m->norm, dn);
  if (!(dl <= loss_tol && dn <= norm_rel_tol) && m->bad++ < 3)
    ADD_FAILURE() << "step " << s + 1 << ": loss " << j["loss"] << " vs " << r["loss"] << " (|diff| "
                  << dl << "), grad_norm " << j["grad_norm"] << " vs " << r["grad_norm"]
                  << " (relative " << dn << ")";
}

// ---- Checkpoints -------------------------------------------------------------------------

// RUN/checkpoints/step_NNNNNNNN, the folder the trainer writes for `step`.
inline std::string step_dir(const std::string& run, int step) {
  char name[32];
  std::snprintf(name, sizeof name, "step_%08d", step);
  return run + "/checkpoints/" + name;
}

// A copy of run `from` at `dir` as if it had stopped after `kept`'s checkpoint: `dropped`'s
// checkpoint removed and metrics.jsonl cut to the training steps up to `kept`.
inline void copy_interrupted_run(const std::string& from, const std::string& dir, int kept, int dropped) {
  std::filesystem::copy(from, dir, std::filesystem::copy_options::recursive);
  std::filesystem::remove_all(step_dir(dir, dropped));
  std::string lines;
  for (const auto& line : cli_test::lines_of(cli_test::read_file(dir + "/metrics.jsonl"))) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (!j.contains("val_loss") && j["step"] <= kept) lines += line + "\n";
  }
  cli_test::write_file(dir + "/metrics.jsonl", lines);
}

// The whole model's flat parameter buffer (tp = 1 layout) of a checkpoint of any writer
// layout (dp, ZeRO shards, tp slices), through the single-process loader that reassembles
// them.
inline std::vector<float> load_params(const std::string& dir, int64_t* step) {
  nlohmann::json index;
  Status s = checkpoint::read_checkpoint_index(dir, &index);
  EXPECT_TRUE(s.is_ok()) << s.message();
  if (!s.is_ok()) return {};
  model::GptConfig config;
  s = checkpoint::checkpoint_model_config(index, &config);
  EXPECT_TRUE(s.is_ok()) << s.message();
  if (!s.is_ok()) return {};
  model::Gpt gpt(config);
  s = checkpoint::load_checkpoint(dir, &gpt, nullptr, nullptr, step);
  EXPECT_TRUE(s.is_ok()) << dir << ": " << s.message();
  if (!s.is_ok()) return {};
  return std::vector<float>(gpt.params(), gpt.params() + gpt.num_elements());
}

// max |a − b| over the elements, and where it is (a NaN counts as the worst).
inline double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b,
                           size_t* where) {
  double worst = 0;
  *where = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); i++) {
    const double d = std::fabs((double)a[i] - (double)b[i]);
    if (!(d <= worst)) worst = d, *where = i;  // NaN counts as worst
  }
  return worst;
}

// The q-quantile of |a − b| over the elements.
inline double abs_diff_quantile(const std::vector<float>& a, const std::vector<float>& b,
                                double q) {
  std::vector<double> d(std::min(a.size(), b.size()));
  for (size_t i = 0; i < d.size(); i++) d[i] = std::fabs((double)a[i] - (double)b[i]);
  if (d.empty()) return 0;
  const size_t k = std::min(d.size() - 1, (size_t)(q * (double)d.size()));
  std::nth_element(d.begin(), d.begin() + (std::ptrdiff_t)k, d.end());
  return d[k];
}

// The final weights of a layout's run (its checkpoint of step `steps`, reassembled whole)
// against the reference run's: the largest |diff| within `tol` and the 99.9% quantile within
// `bulk_tol`. Sets *worst and *bulk (for the verbose margins line).
inline void expect_final_weights_match(const std::string& run_dir, int steps,
                                       const std::vector<float>& ref_params, double tol,
                                       double bulk_tol, double* worst, double* bulk) {
  int64_t step = 0;
  const std::vector<float> params = load_params(step_dir(run_dir, steps), &step);
  ASSERT_EQ(params.size(), ref_params.size());
  EXPECT_EQ(step, steps);
  size_t at = 0;
  *worst = max_abs_diff(params, ref_params, &at);
  EXPECT_LE(*worst, tol) << "final weights: element " << at << " is " << params[at] << ", single-rank "
                         << ref_params[at];
  *bulk = abs_diff_quantile(params, ref_params, 0.999);
  EXPECT_LE(*bulk, bulk_tol) << "final weights: 99.9% quantile of |diff|";
}

// ---- Fixture: the corpus (CliTest), a suite folder and the cache of runs -----------------

// One cached training run: the flags (model shape and training, without --out) that key it
// and the ranks it keeps busy.
struct RunSpec {
  std::string args;
  int ranks = 1;
};

// A small synthetic corpus in llm.c's token format (src/data/token_file.h), train.bin and
// val.bin: a header of 256 little-endian int32 (magic 20240520, version 1, token count,
// zeros), then uint16 tokens < 256 from a fixed-seed generator, with some repetition to
// learn and token 13 about every 8 tokens (a document separator). Parity runs train a
// vocabulary of a few hundred on it: GPT-2's 50,257 rows made the head and the loss most of
// a tiny model's step.
inline constexpr int kSmallCorpusSeparator = 13;
inline void write_small_corpus(const std::string& dir) {
  std::filesystem::create_directories(dir);
  std::mt19937 rng(1234);
  for (const auto& [name, count] : {std::pair{"train.bin", 1 << 17}, {"val.bin", 1 << 14}}) {
    std::vector<int32_t> header(256, 0);
    header[0] = 20240520, header[1] = 1, header[2] = count;
    std::vector<uint16_t> tokens(count);
    for (int i = 0; i < count; i++)
      tokens[i] = (uint16_t)(rng() % 8 == 0 ? kSmallCorpusSeparator
                             : i % 7 == 0   ? rng() % 256
                                            : (i * 31 + (int)(rng() % 4)) % 256);
    std::string bytes((const char*)header.data(), header.size() * sizeof(int32_t));
    bytes.append((const char*)tokens.data(), tokens.size() * sizeof(uint16_t));
    std::ofstream(dir + "/" + name, std::ios::binary) << bytes;  // little-endian host (x86)
  }
}

// The fixture of a multi-rank suite. `Suite` (the derived fixture, a template argument so
// that every suite has a cache of its own) provides
//   static constexpr const char* kTag;            // "dp": folder meshtrain_dp_PID, "[ dp runs  ]"
//   static std::string train(const std::string&);  // the `meshtrain train` command for flags
//   static int job_capacity();                     // cores' worth of jobs run at once
// Without MPI every test of the suite is skipped.
template <class Suite>
class MultiRankTest : public cli_test::CliTest {
 protected:
  void SetUp() override {
#ifndef MESHTRAIN_HAVE_MPI
    GTEST_SKIP() << "built without MPI (MESHTRAIN_WITH_MPI=OFF): no multi-rank runs";
#endif
    CliTest::SetUp();
  }

  static void SetUpTestSuite() {
    CliTest::SetUpTestSuite();
    suite_dir_ = cli_test::fresh_dir(std::filesystem::temp_directory_path() /
                                     ("meshtrain_" + std::string(Suite::kTag) + "_" + cli_test::kPid));
    small_corpus_ = suite_dir_ + "/small";
    write_small_corpus(small_corpus_);
  }
  static void TearDownTestSuite() {
    std::printf("[ %s runs  ] %zu cached runs, %.1f s of run wall time in all\n", Suite::kTag,
                cache_.size(), run_seconds_);
    if (std::getenv("MESHTRAIN_TEST_VERBOSE"))
      for (const auto& [args, r] : cache_)
        std::printf("[ %s runs  ] %6.1f s  %s\n", Suite::kTag, r.job.seconds, args.c_str());
    if (const char* dir = std::getenv("MESHTRAIN_TEST_RECORD")) record_runs(dir);
    cache_.clear();
    std::filesystem::remove_all(suite_dir_);
    CliTest::TearDownTestSuite();
  }

  struct CachedRun {
    std::string dir;  // --out
    Job job;
  };

  // MESHTRAIN_TEST_RECORD=DIR (scripts/record_losses.sh): every cached run's exit code, each
  // step's loss and grad norm as written (full precision), and a hash of every checkpoint's
  // weights, to DIR/TAG.txt, in the order of the runs' flags. Two recordings of the same
  // suites are equal only if every run trained bit for bit the same.
  static void record_runs(const std::string& dir) {
    std::filesystem::create_directories(dir);
    std::string text;
    for (const auto& [args, r] : cache_) {
      text += "run " + args + "\nexit " + std::to_string(r.job.result.exit_code) + "\n";
      const std::string metrics = cli_test::read_file(r.dir + "/metrics.jsonl");
      for (const auto& line : cli_test::lines_of(metrics)) {
        const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
        for (const char* key : {"step", "loss", "grad_norm", "val_loss", "loss_scale"})
          if (j.is_object() && j.contains(key)) text += std::string(key) + "=" + j[key].dump() + " ";
        text += "\n";
      }
      std::error_code ec;
      std::vector<std::string> steps;
      for (const auto& e : std::filesystem::directory_iterator(r.dir + "/checkpoints", ec))
        if (e.path().filename().string().rfind("step_", 0) == 0) steps.push_back(e.path().string());
      std::sort(steps.begin(), steps.end());
      for (const auto& s : steps) {
        int64_t step = 0;
        const std::vector<float> w = load_params(s, &step);
        uint64_t h = 1469598103934665603ull;  // FNV-1a over the weights' bytes
        const auto* b = reinterpret_cast<const unsigned char*>(w.data());
        for (size_t i = 0; i < w.size() * sizeof(float); i++) h = (h ^ b[i]) * 1099511628211ull;
        text += "weights " + std::filesystem::path(s).filename().string() + " " + std::to_string(h) + "\n";
      }
    }
    std::ofstream(dir + "/" + Suite::kTag + ".txt", std::ios::app) << text;
  }

  static void run_jobs(const std::vector<Job*>& jobs, const std::string& scratch) {
    multirank_test::run_jobs(jobs, scratch, Suite::job_capacity());
  }

  // Runs (concurrently) every spec not run yet in this process; each gets its own --out.
  static void ensure(const std::vector<RunSpec>& specs) {
    std::vector<Job*> jobs;
    for (const auto& spec : specs) {
      if (cache_.count(spec.args)) continue;
      CachedRun& r = cache_[spec.args];
      r.dir = suite_dir_ + "/run" + std::to_string(cache_.size());
      r.job.cmd = Suite::train(spec.args + " --quiet --out " + r.dir);
      r.job.ranks = spec.ranks;
      jobs.push_back(&r.job);
    }
    const auto t0 = Clock::now();
    run_jobs(jobs, suite_dir_);
    run_seconds_ += std::chrono::duration<double>(Clock::now() - t0).count();
  }
  static const CachedRun& get(const std::string& args) { return cache_.at(args); }

  // The records of a cached run; a failed run is reported (with its output) where it is used.
  static cli_test::Metrics metrics_of(const std::string& args) {
    const CachedRun& r = get(args);
    EXPECT_EQ(r.job.result.exit_code, 0) << args << "\n" << cli_test::describe(r.job.result);
    if (r.job.result.exit_code != 0) return {};
    return cli_test::read_metrics(r.dir + "/metrics.jsonl");
  }

  // A run that every rank must refuse before any work, with these message parts.
  struct RejectedRun {
    std::string flags;
    int ranks;
    std::vector<std::string> parts;  // in the message, once per rank
  };
  // Runs every case as `train FLAGS --steps 2 --out DIR/badN` (concurrently; a case weighs
  // one core when `light`, its ranks otherwise) and checks expect_rejected_by_every_rank.
  void expect_all_rejected(const std::vector<RejectedRun>& cases, bool light = false) {
    std::vector<Job> jobs(cases.size());
    std::vector<Job*> ptrs;
    for (size_t i = 0; i < cases.size(); i++) {
      jobs[i].cmd = Suite::train(cases[i].flags + " --steps 2 --out " + path("bad" + std::to_string(i)));
      jobs[i].ranks = light ? 1 : cases[i].ranks;
      jobs[i].limit_s = 120;
      ptrs.push_back(&jobs[i]);
    }
    run_jobs(ptrs, dir_);
    for (size_t i = 0; i < cases.size(); i++) {
      SCOPED_TRACE(cases[i].flags);
      expect_rejected_by_every_rank(jobs[i].result, cases[i].ranks, cases[i].parts,
                                    path("bad" + std::to_string(i)));
    }
  }

  // One job run now (not cached).
  Job run_now(const std::string& cmd, int ranks = 1, int limit_s = 300) {
    Job job;
    job.cmd = cmd;
    job.ranks = ranks;
    job.limit_s = limit_s;
    run_jobs({&job}, dir_);
    return job;
  }

  static inline std::string suite_dir_;
  static inline std::string small_corpus_;  // write_small_corpus's files, in the suite's folder
  static inline std::map<std::string, CachedRun> cache_;
  static inline double run_seconds_ = 0;
};

}  // namespace meshtrain::multirank_test
