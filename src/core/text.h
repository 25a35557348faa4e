// Small text helpers shared by the parsers that suggest a name for a misspelt one.
#pragma once
#include <cstddef>
#include <string>

namespace meshtrain {

// Levenshtein distance: single-character insertions, deletions and substitutions.
size_t edit_distance(const std::string& a, const std::string& b);

}  // namespace meshtrain
