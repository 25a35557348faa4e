// Status: the result of an operation that can fail for reasons outside the program
// (a missing file, a bad flag, a corrupt checkpoint). Programming errors use CHECK.
#pragma once
#include <string>
#include <utility>

namespace meshtrain {

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  static Status ok() { return Status(); }
  static Status error(std::string message) { return Status(std::move(message)); }

  bool is_ok() const { return !failed_; }
  const std::string& message() const { return message_; }

  // Prefixes context ("reading foo.bin: ") to an error; OK stays OK.
  Status with_context(const std::string& context) const {
    return failed_ ? Status(context + ": " + message_) : *this;
  }

 private:
  explicit Status(std::string message) : failed_(true), message_(std::move(message)) {}
  bool failed_ = false;
  std::string message_;
};

}  // namespace meshtrain

// Returns the status from the enclosing function if it is an error.
#define RETURN_IF_ERROR(expr)                       \
  do {                                              \
    ::meshtrain::Status status_ = (expr);           \
    if (!status_.is_ok()) return status_;           \
  } while (0)
