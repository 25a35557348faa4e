#include "train/console.h"

#include <cstdarg>
#include <cstdio>

namespace meshtrain::train {

Console silent_console() {
  return {[](const std::string&) {}, [] {}, [](const std::string&) {}, false};
}

std::string formatted(const char* format, ...) {
  va_list args;
  va_start(args, format);
  va_list again;
  va_copy(again, args);
  const int n = std::vsnprintf(nullptr, 0, format, args);
  va_end(args);
  std::string text(n > 0 ? (size_t)n : 0, '\0');
  if (n > 0) std::vsnprintf(text.data(), text.size() + 1, format, again);
  va_end(again);
  return text;
}

}  // namespace meshtrain::train
