// The JSON body of POST /v1/completions, read field by field into completion requests
// (one per prompt). Every field is known: OpenAI's that change the text (prompt,
// max_tokens, temperature, top_p, seed, stop, logprobs, stream, and top_k as an extension),
// those clients send that change nothing here (model, user), and those accepted only at
// their no-op value (n 1, best_of 1, echo false, presence_penalty and frequency_penalty 0,
// logit_bias empty, suffix null). Anything else is refused naming it, with the nearest
// known name when one is close ("temprature": did you mean 'temperature'?), so that a typo
// never silently answers with the default.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/completion.h"
#include "core/status.h"

namespace meshtrain::cli {

Status parse_completion_body(const nlohmann::json& body, std::vector<CompletionRequest>* out, bool* stream);

// The name among `known` nearest to `name` by edit distance, if it is near enough to be a
// typo of it (at most a third of its letters, and at most 3, changed); "" if none is.
std::string nearest_name(std::string_view name, const std::vector<std::string_view>& known);

}  // namespace meshtrain::cli
