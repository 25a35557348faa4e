#include "model/config.h"

namespace meshtrain::model {

Status preset_config(const std::string& name, GptConfig* out) {
  GptConfig c;
  if (name == "tiny") {
    c.layers = 2, c.heads = 4, c.dim = 64, c.max_seq_len = 64;
  } else if (name == "small") {
    c.layers = 6, c.heads = 6, c.dim = 384, c.max_seq_len = 256;
  } else if (name == "gpt2-124m") {
    c.layers = 12, c.heads = 12, c.dim = 768, c.max_seq_len = 1024;
  } else if (name == "gpt2-350m") {
    c.layers = 24, c.heads = 16, c.dim = 1024, c.max_seq_len = 1024;
  } else {
    return Status::error("unknown model preset '" + name +
                         "' (choose tiny, small, gpt2-124m or gpt2-350m)");
  }
  *out = c;
  return Status::ok();
}

Status validate(const GptConfig& c) {
  if (c.layers < 1) return Status::error("--layers must be >= 1, got " + std::to_string(c.layers));
  if (c.heads < 1) return Status::error("--heads must be >= 1, got " + std::to_string(c.heads));
  if (c.dim < 1) return Status::error("--dim must be >= 1, got " + std::to_string(c.dim));
  if (c.dim % c.heads != 0)
    return Status::error("--heads " + std::to_string(c.heads) + " does not divide --dim " +
                         std::to_string(c.dim));
  if (c.max_seq_len < 1) return Status::error("--seq-len must be >= 1");
  if (c.vocab < 2 || c.vocab > 65536)
    return Status::error("--vocab must be in [2, 65536] (tokens are stored as uint16), got " +
                         std::to_string(c.vocab));
  return Status::ok();
}

Status validate_tp(const GptConfig& c, int tp) {
  if (tp < 1) return Status::error("--tp must be >= 1, got " + std::to_string(tp));
  auto need = [&](const char* what, int64_t n) -> Status {
    if (n % tp != 0)
      return Status::error("--tp " + std::to_string(tp) + " does not divide " + what + " (" +
                           std::to_string(n) + ")");
    return Status::ok();
  };
  RETURN_IF_ERROR(need("the number of heads", c.heads));
  RETURN_IF_ERROR(need("4 x dim, the MLP width", 4LL * c.dim));
  RETURN_IF_ERROR(need("the padded vocabulary", c.padded_vocab()));
  return Status::ok();
}

int64_t num_parameters(const GptConfig& c) {
  const int64_t C = c.dim, L = c.layers;
  const int64_t per_layer = 2 * C + (3 * C * C + 3 * C) + (C * C + C) + 2 * C + (4 * C * C + 4 * C) +
                            (4 * C * C + C);
  return (int64_t)c.vocab * C + (int64_t)c.max_seq_len * C + L * per_layer + 2 * C;
}

}  // namespace meshtrain::model
