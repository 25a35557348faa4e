// Shared by the fuzz targets: each feeds libFuzzer's bytes to one parser's from-bytes
// entry and checks the promise its header makes. A parser may reject any input with a
// Status; it may not crash, and what it accepts must be usable as documented. A broken
// promise aborts, which libFuzzer reports as a crash and keeps as an input.
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "core/status.h"

namespace meshtrain::fuzz {

inline std::string_view as_text(const uint8_t* data, size_t size) {
  return std::string_view(reinterpret_cast<const char*>(data), size);
}

[[noreturn]] inline void broken_promise(const std::string& what) {
  std::fprintf(stderr, "fuzz: broken promise: %s\n", what.c_str());
  std::abort();
}

// An accepted input's follow-up step must succeed.
inline void expect_ok(const Status& s, const char* step) {
  if (!s.is_ok()) broken_promise(std::string(step) + " failed after the parser accepted the input: " + s.message());
}

// Two files and a text, separated by NUL bytes (the tokenizer targets' input); false
// without the first NUL. A missing second NUL leaves the text empty.
inline bool split_two_files_and_text(std::string_view input, std::string_view* first, std::string_view* second,
                                     std::string_view* text) {
  const size_t a = input.find('\0');
  if (a == std::string_view::npos) return false;
  const size_t b = input.find('\0', a + 1);
  *first = input.substr(0, a);
  *second = input.substr(a + 1, b == std::string_view::npos ? std::string_view::npos : b - a - 1);
  *text = b == std::string_view::npos ? std::string_view() : input.substr(b + 1);
  return true;
}

}  // namespace meshtrain::fuzz
