#include "cli/toml_parse.h"

#include <algorithm>

namespace meshtrain::cli {

namespace {

// Line `line` (from 1) of `text`, without its line break, shortened when long.
std::string line_text(const std::string& text, size_t line) {
  size_t start = 0;
  for (size_t l = 1; l < line && start != std::string::npos; l++) {
    start = text.find('\n', start);
    if (start != std::string::npos) start++;
  }
  if (start == std::string::npos || start >= text.size()) return "";
  size_t end = std::min(text.find('\n', start), text.size());
  if (end > start && text[end - 1] == '\r') end--;
  std::string s = text.substr(start, std::min<size_t>(end - start, 80));
  return end - start > 80 ? s + "..." : s;
}

}  // namespace

Status parse_toml(const std::string& text, const std::string& what, toml::table* out) {
  try {
    *out = toml::parse(text, what);
  } catch (const toml::parse_error& e) {
    const auto& at = e.source().begin;
    const std::string line = line_text(text, at.line);
    return Status::error("cannot parse " + what + " (line " + std::to_string(at.line) + ", column " +
                         std::to_string(at.column) + "): " + std::string(e.description()) +
                         (line.empty() ? "" : ", in: " + line));
  }
  return Status::ok();
}

}  // namespace meshtrain::cli
