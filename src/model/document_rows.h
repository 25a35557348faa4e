// Document masks (--doc-mask, docs/long_context.md): a packed training row holds several
// documents, each ended by the separator token (end-of-text), and no token attends across
// a document's end. Each row's visible keys are then one contiguous range, from its
// document's first token to itself, and its position restarts at its document's first
// token (RoPE and learned positions alike), as Megatron's reset_position_ids and
// reset_attention_mask define them: the separator belongs to the document it ends.
#pragma once
#include <vector>

namespace meshtrain::model {

struct DocumentRows {
  std::vector<int> positions;  // [B*T] the row's position in its document
  std::vector<int> key_begin;  // [B*T] the index in its sequence of its document's first token
  std::vector<int> key_end;    // [B*T] its own index + 1
};

// The rows of a B x T micro-batch of tokens `inputs` whose documents end at `separator`.
DocumentRows document_rows(const int* inputs, int B, int T, int separator);

}  // namespace meshtrain::model
