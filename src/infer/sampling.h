// Choosing the next token from a model's logits, with the knobs of OpenAI's completions API
// and Hugging Face's generate(): temperature (0: greedy), top-k, top-p (nucleus), a seeded
// generator per sequence; the chosen token's log-probability under the model and the most
// likely alternatives; and stop strings over streamed text.
#pragma once
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace meshtrain::infer {

struct SampleOptions {
  float temperature = 1.0f;  // 0: greedy
  int top_k = 0;             // 0: the whole vocabulary
  // Nucleus sampling (Holtzman et al. 2020): after temperature and top-k, the smallest set of
  // most likely tokens whose probability reaches top_p (the token that crosses it included).
  // 1: no cut.
  float top_p = 1.0f;
};

// Draws a token from softmax(logits / temperature) restricted by top_k and top_p, with one
// 53-bit draw from `rng`, walked over the tokens likeliest first (ties by id) when truncated,
// in id order when not (the same distribution, without sorting the vocabulary).
// Deterministic for a given rng state.
int sample_token(const float* logits, int V, const SampleOptions& options, std::mt19937_64& rng);

// log softmax(logits)[token] over the V tokens: the model's own distribution, before
// temperature and truncation (what OpenAI's logprobs report). Computed in double.
double token_logprob(const float* logits, int V, int token);

struct TokenLogprob {
  int token = 0;
  double logprob = 0;
};
// The `count` most likely tokens and their log-probabilities, most likely first (ties by id).
std::vector<TokenLogprob> top_logprobs(const float* logits, int V, int count);

// Stop strings over text that arrives in pieces (streamed tokens). feed() returns the part
// of the text so far that can be shown: everything before a stop string, and nothing that
// could still be the start of one. Once a stop string is complete, stopped() is true, and the
// text before it has all been returned (the stop string itself never is, as in OpenAI's
// API). finish() returns what was held back when the text ends without a stop.
class StopStrings {
 public:
  explicit StopStrings(std::vector<std::string> stops);
  std::string feed(const std::string& piece);
  std::string finish();
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;  // text not shown yet: a possible start of a stop string
  bool stopped_ = false;
};

}  // namespace meshtrain::infer
