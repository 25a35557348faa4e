#include "core/check.h"

namespace meshtrain {

[[noreturn]] void check_failed(const char* file, int line, const char* expr, const char* msg) {
  std::fprintf(stderr, "meshtrain: internal error at %s:%d: CHECK(%s) failed%s%s\n", file, line,
               expr, msg ? ": " : "", msg ? msg : "");
  std::fflush(stderr);
  std::abort();
}

}  // namespace meshtrain
