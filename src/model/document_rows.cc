#include "model/document_rows.h"

namespace meshtrain::model {

DocumentRows document_rows(const int* inputs, int B, int T, int separator) {
  DocumentRows rows;
  const size_t N = (size_t)B * T;
  rows.positions.resize(N), rows.key_begin.resize(N), rows.key_end.resize(N);
  for (int b = 0; b < B; b++) {
    int first = 0;  // this document's first token
    for (int t = 0; t < T; t++) {
      const size_t i = (size_t)b * T + t;
      rows.positions[i] = t - first, rows.key_begin[i] = first, rows.key_end[i] = t + 1;
      if (inputs[i] == separator) first = t + 1;  // the next token starts the next document
    }
  }
  return rows;
}

}  // namespace meshtrain::model
