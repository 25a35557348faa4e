// Small text helpers shared by the parsers: suggesting a name for a misspelt one, and
// telling text from binary bytes.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

namespace meshtrain {

// Levenshtein distance: single-character insertions, deletions and substitutions.
size_t edit_distance(const std::string& a, const std::string& b);

// The offset of the first byte that makes `text` something other than UTF-8 text: an
// invalid or overlong sequence, a surrogate, or a control character other than tab, line
// feed and carriage return (a NUL included). npos: it is text.
size_t first_non_text_byte(std::string_view text);

// `text` around byte `at` (up to `width` bytes each side), printable: bytes outside
// printable ASCII as \xHH, so a message can show binary bytes without carrying them.
std::string escaped_excerpt(std::string_view text, size_t at, size_t width = 8);

}  // namespace meshtrain
