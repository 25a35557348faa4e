// toml++ for the command line's TOML files (--config files, cluster files): one include, with
// the same settings in every file that uses it, and one form of parse error.
#pragma once
#include <string>

// toml++ (Debian's libtomlplusplus-dev), header-only: the whole TOML 1.0 grammar, nested
// tables included, with line and column in its errors. Its internal assertions are off:
// 3.3.0 asserts on a table header that starts with a dot ("[.x]", found by
// fuzz_cluster_file) where its parser goes on to report the error itself (line 2, column 2:
// "expected bare key starting character"), which is what a user should see.
#define TOML_ASSERT(expr) static_cast<void>(0)
#include <toml++/toml.h>

#include "core/status.h"

namespace meshtrain {

// Parses `text`; an error reads "cannot parse <what> (line L, column C): <toml++'s
// description>, in: <the line>", so that it points at what is there.
Status parse_toml(const std::string& text, const std::string& what, toml::table* out);

}  // namespace meshtrain
