// Shared by the end-to-end tests of the meshtrain command line (test_cli.cc,
// test_cli_practitioner.cc): running the real binary as a subprocess, reading what it wrote,
// and a fixture that gives each test the Brown corpus (prepared once per build, shared) and
// a temporary folder of its own. Every helper is inline so that each test file can include this header.
#pragma once
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace meshtrain::cli_test {

inline const std::string kBinary = MESHTRAIN_BINARY;
inline const std::string kPid = std::to_string(::getpid());
// A tiny model that trains a step in a few tens of milliseconds.
inline const std::string kTiny = "--model tiny --seq-len 32 --micro-batch 2 --vocab 50257";
inline constexpr int kVocab = 50257;

// ---- Subprocesses and files ------------------------------------------------------------

struct RunResult {
  int exit_code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), (std::streamsize)bytes.size());
}

// Runs `cmd` with /bin/sh: stdout through the pipe, stderr (of the whole command, pipelines
// included) into a temporary file.
inline RunResult run(const std::string& cmd) {
  static int counter = 0;
  const std::string err_path =
      (std::filesystem::temp_directory_path() /
       ("meshtrain_cli_stderr_" + kPid + "_" + std::to_string(counter++)))
          .string();
  RunResult r;
  std::FILE* pipe = ::popen(("{ " + cmd + " ; } 2> " + err_path).c_str(), "r");
  if (!pipe) {
    r.err = "popen failed: " + std::string(std::strerror(errno));
    return r;
  }
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) r.out.append(buf, n);
  const int status = ::pclose(pipe);
  if (WIFEXITED(status))
    r.exit_code = WEXITSTATUS(status);
  else if (WIFSIGNALED(status))
    r.exit_code = 128 + WTERMSIG(status);
  r.err = read_file(err_path);
  std::filesystem::remove(err_path);
  return r;
}

// Empties (or creates) the folder at `path` and returns it: a clean start however an
// earlier run of the same process id ended.
inline std::string fresh_dir(const std::filesystem::path& path) {
  std::filesystem::remove_all(path);
  std::filesystem::create_directories(path);
  return path.string();
}

inline std::string describe(const RunResult& r) {
  return "exit " + std::to_string(r.exit_code) + "\n--- stdout ---\n" + r.out +
         "--- stderr ---\n" + r.err;
}

inline std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) out.push_back(line);
  return out;
}

// A training progress line ("step     3/8 | loss ..." or "step     8 | val loss ...").
inline bool has_step_line(const std::string& out) {
  for (const auto& line : lines_of(out))
    if (line.starts_with("step")) return true;
  return false;
}

// The command failed with a message (on stderr) containing every one of `parts`, and
// printed no training progress.
inline void expect_failure(const RunResult& r, const std::vector<std::string>& parts) {
  EXPECT_NE(r.exit_code, 0) << describe(r);
  EXPECT_FALSE(has_step_line(r.out)) << describe(r);
  for (const auto& p : parts)
    EXPECT_NE(r.err.find(p), std::string::npos) << "'" << p << "' in\n" << describe(r);
}

// ---- metrics.jsonl ---------------------------------------------------------------------

struct Metrics {
  std::vector<nlohmann::json> steps;  // records with "loss", in file order
  std::vector<nlohmann::json> evals;  // records with "val_loss", in file order
};

inline Metrics read_metrics(const std::string& path) {
  Metrics m;
  for (const auto& line : lines_of(read_file(path))) {
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) {
      ADD_FAILURE() << path << ": not a JSON line: " << line;
      continue;
    }
    (j.contains("val_loss") ? m.evals : m.steps).push_back(j);
  }
  return m;
}

// The exact bit pattern of a JSON number (metrics store floats and doubles in their
// shortest round-trip form, so equal bits mean equal values as computed).
inline uint64_t bits(const nlohmann::json& v) { return std::bit_cast<uint64_t>(v.get<double>()); }

// ---- meshtrain serve -------------------------------------------------------------------

// A `meshtrain serve` in the background: its pid, and the URL and port its startup line
// names (empty and 0 if it did not start within a minute: the sanitizers' build loads slowly).
struct Served {
  std::string pid, url;
  int port = 0;
};

// `meshtrain serve ARGS`, its output in `out`.
inline Served start_serve(const std::string& args, const std::string& out) {
  Served s;
  RunResult started = run("sh -c '" + kBinary + " serve " + args + " > " + out + " 2>&1 & echo $!'");
  if (started.exit_code != 0) return s;
  s.pid = lines_of(started.out).at(0);
  for (int i = 0; i < 600 && s.url.empty(); i++) {
    const std::string text = read_file(out);
    if (const size_t at = text.find("http://127.0.0.1:"); at != std::string::npos && text.find(" (POST", at) != std::string::npos)
      s.url = text.substr(at, text.find(' ', at) - at);
    else
      ::usleep(100000);
  }
  if (!s.url.empty()) s.port = std::stoi(s.url.substr(s.url.rfind(':') + 1));
  return s;
}

// SIGTERM, then its "stopped" line within 10 s (else a SIGKILL and a failure).
inline void stop_serve(const Served& s, const std::string& out) {
  EXPECT_EQ(run("kill -TERM " + s.pid).exit_code, 0);
  bool stopped = false;
  for (int i = 0; i < 100 && !stopped; i++) {
    stopped = read_file(out).find("stopped") != std::string::npos && run("kill -0 " + s.pid).exit_code != 0;
    if (!stopped) ::usleep(100000);
  }
  EXPECT_TRUE(stopped) << read_file(out);
  if (!stopped) (void)run("kill -9 " + s.pid);
}

// ---- Fixture ---------------------------------------------------------------------------

// Something the tests only read, made once per build of the binary and shared by every test
// process: ctest runs each test in a process of its own, and remaking the Brown corpus and
// the practitioner suite's base run in each (3 s and 4 s under the sanitizers) cost the test
// command minutes. It lives beside the binary in test_cache/<the binary's modification
// time>/NAME, so a rebuilt binary makes its own. A lock file serialises the processes, and
// a marker file says the folder is whole: a process that dies while making it leaves no
// marker, and the next one starts over. `make` fills the folder it is given and returns an
// error ("" when it succeeded); the folder's path is returned, or "" and `*error`.
inline std::string shared_once(const std::string& name, const std::function<std::string(const std::string&)>& make,
                               std::string* error) {
  namespace fs = std::filesystem;
  const fs::path binary(kBinary);
  const std::string build = std::to_string(fs::last_write_time(binary).time_since_epoch().count());
  const fs::path cache = binary.parent_path() / "test_cache", root = cache / build, dir = root / name;
  std::error_code ec;
  fs::create_directories(root, ec);
  const int lock = ::open((root.string() + "/" + name + ".lock").c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
  if (lock < 0 || ::flock(lock, LOCK_EX) != 0) {
    *error = "cannot lock " + (root / name).string() + ".lock: " + std::strerror(errno);
    if (lock >= 0) ::close(lock);
    return "";
  }
  const fs::path marker = root / (name + ".whole");
  std::string failure;
  if (!fs::exists(marker)) {
    // Earlier builds' caches go first (nothing runs their binary any more).
    for (const auto& entry : fs::directory_iterator(cache, ec))
      if (entry.path().filename() != build) fs::remove_all(entry.path(), ec);
    fs::remove_all(dir, ec);
    fs::create_directories(dir, ec);
    failure = make(dir.string());
    if (failure.empty())
      write_file(marker.string(), "");
    else
      fs::remove_all(dir, ec);
  }
  ::flock(lock, LOCK_UN);
  ::close(lock);
  if (!failure.empty()) *error = failure;
  return failure.empty() ? dir.string() : "";
}

// The Brown corpus, as `meshtrain prep --brown` writes it.
inline std::string shared_brown_corpus(std::string* error) {
  return shared_once("brown", [](const std::string& dir) {
    const RunResult r = run(kBinary + " prep --brown --out " + dir);
    return r.exit_code == 0 ? std::string() : describe(r);
  }, error);
}

// The shared Brown corpus, and a fresh temporary folder per test.
class CliTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    corpus_ = shared_brown_corpus(&prep_error_);
    prep_ok_ = !corpus_.empty();
  }
  static void TearDownTestSuite() {}

  void SetUp() override {
    ASSERT_TRUE(prep_ok_) << "meshtrain prep --brown failed:\n" << prep_error_;
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fresh_dir(std::filesystem::temp_directory_path() /
                     ("meshtrain_cli_" + kPid + "_" + info->test_suite_name() + "_" + info->name()));
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string path(const std::string& name) const { return dir_ + "/" + name; }

  // `meshtrain train` on DATA (default: the Brown corpus) with a fixed peak, two threads.
  static std::string train(const std::string& args, const std::string& data = "") {
    return kBinary + " train --data " + (data.empty() ? corpus_ : data) +
           " --peak-gflops 100 --threads 2 " + args;
  }

  static inline std::string corpus_;
  static inline bool prep_ok_ = false;
  static inline std::string prep_error_;
  std::string dir_;
};

}  // namespace meshtrain::cli_test
