// Shared by the in-process data-parallel suites (test_dp_threads.cc, test_zero_infinity.cc,
// test_dp_parts.cc), which train on comm::ThreadWorld ranks: a small GPT, random tokens
// over its vocabulary, AdamW settings, and a scratch folder per process.
#pragma once
#include <unistd.h>

#include <filesystem>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "data/loader.h"
#include "model/config.h"
#include "optim/adamw.h"

namespace meshtrain::testing_util {

constexpr int kVocab = 97;

inline model::GptConfig small_gpt(int layers) {
  model::GptConfig c;
  c.layers = layers, c.heads = 2, c.dim = 32, c.max_seq_len = 16, c.vocab = kVocab;
  return c;
}

inline data::TokenLoader random_tokens(size_t n) {
  std::mt19937 rng(3);
  std::vector<data::Token> t(n);
  for (auto& x : t) x = rng() % kVocab;
  return data::TokenLoader::from_tokens(t);
}

inline optim::AdamWConfig test_adamw(float grad_clip) {
  optim::AdamWConfig a;
  a.lr = 1e-2f, a.min_lr = 1e-3f, a.warmup_steps = 2, a.weight_decay = 0.1f, a.grad_clip = grad_clip;
  return a;
}

// The per-process folders scratch_dir made, removed when the test process exits.
struct ScratchRoots {
  std::set<std::string> paths;
  ~ScratchRoots() {
    for (const std::string& p : paths) {
      std::error_code ec;
      std::filesystem::remove_all(p, ec);
    }
  }
};
inline ScratchRoots& scratch_roots() {
  static ScratchRoots roots;
  return roots;
}

// An empty folder under the system's temporary one, named for this process and `name`.
inline std::string scratch_dir(const std::string& suite, const std::string& name) {
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / ("meshtrain_" + suite + "_" + std::to_string(::getpid()));
  scratch_roots().paths.insert(root.string());
  const fs::path p = root / name;
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

}  // namespace meshtrain::testing_util
