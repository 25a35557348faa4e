#include "core/check.h"

#include <atomic>
#include <string>

namespace meshtrain {

namespace {
std::atomic<bool> g_throw_on_check_failure{false};
}

void throw_on_check_failure(bool on) { g_throw_on_check_failure = on; }

[[noreturn]] void check_failed(const char* file, int line, const char* expr, const char* msg) {
  if (g_throw_on_check_failure)
    throw CheckFailure("internal error at " + std::string(file) + ":" + std::to_string(line) + ": CHECK(" + expr +
                       ") failed" + (msg ? std::string(": ") + msg : std::string()));
  std::fprintf(stderr, "meshtrain: internal error at %s:%d: CHECK(%s) failed%s%s\n", file, line,
               expr, msg ? ": " : "", msg ? msg : "");
  std::fflush(stderr);
  std::abort();
}

}  // namespace meshtrain
