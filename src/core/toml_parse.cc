#include "core/toml_parse.h"

#include <algorithm>

namespace meshtrain {

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

// Where a string or comment starting at text[i] ends (the index after it); `i` is at its
// opening quote or '#'. An unterminated one ends at the line's end (toml++ then names it).
size_t skip_string_or_comment(const std::string& text, size_t i) {
  if (text[i] == '#') return std::min(text.find('\n', i), text.size());
  const char q = text[i];
  const bool multi = text.compare(i, 3, std::string(3, q)) == 0;
  const std::string close = multi ? std::string(3, q) : std::string(1, q);
  for (size_t j = i + close.size(); j < text.size(); j++) {
    if (q == '"' && text[j] == '\\') j++;  // an escape: the next byte is not the end
    else if (text.compare(j, close.size(), close) == 0) return j + close.size();
    else if (!multi && text[j] == '\n') return j;
  }
  return text.size();
}

// TOML allows non-ASCII characters only inside strings and comments. toml++ 3.3 reaches an
// "unreachable" point (undefined behaviour) on some of them elsewhere, e.g. U+FDBF alone
// (found by fuzz_config_toml): such a file is refused here first, naming the place.
Status check_non_ascii_placement(const std::string& text, const std::string& what) {
  size_t line = 1, line_start = 0;
  for (size_t i = 0; i < text.size();) {
    const unsigned char c = (unsigned char)text[i];
    if (c == '"' || c == '\'' || c == '#') {
      const size_t end = skip_string_or_comment(text, i);
      for (size_t k = i; k < end; k++)
        if (text[k] == '\n') line++, line_start = k + 1;
      i = end;
      continue;
    }
    if (c >= 0x80)
      return Status::error("cannot parse " + what + " (line " + std::to_string(line) + ", column " +
                           std::to_string(i - line_start + 1) +
                           "): a non-ASCII character outside a quoted string or a comment, in: " +
                           line_text(text, line));
    if (c == '\n') line++, line_start = i + 1;
    i++;
  }
  return Status::ok();
}

}  // namespace

Status parse_toml(const std::string& text, const std::string& what, toml::table* out) {
  RETURN_IF_ERROR(check_non_ascii_placement(text, what));
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

}  // namespace meshtrain
