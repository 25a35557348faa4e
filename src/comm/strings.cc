#include "comm/strings.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace meshtrain::comm {

std::string broadcast_string(Group& g, const std::string& text, int root) {
  // The length, then the bytes, each carried in floats whose bits a broadcast moves as they
  // are (nothing reads them as numbers).
  uint64_t size = text.size();
  float header[2];
  std::memcpy(header, &size, sizeof size);
  g.broadcast(header, 2, root);
  std::memcpy(&size, header, sizeof size);
  if (size == 0) return std::string();
  std::vector<float> words((size + 3) / 4);
  if (g.rank() == root) std::memcpy(words.data(), text.data(), size);
  g.broadcast(words.data(), words.size(), root);
  return std::string(reinterpret_cast<const char*>(words.data()), size);
}

std::vector<std::string> gather_strings(Group& g, const std::string& text) {
  // Sizes first, then the bytes padded to the longest.
  const uint64_t size = text.size();
  std::vector<uint8_t> sizes(8 * g.size());
  g.iall_gather(reinterpret_cast<const uint8_t*>(&size), sizes.data(), 8)->wait();
  auto size_of = [&](int r) {
    uint64_t s;
    std::memcpy(&s, &sizes[8 * r], sizeof s);
    return s;
  };
  uint64_t longest = 1;
  for (int r = 0; r < g.size(); r++) longest = std::max(longest, size_of(r));
  std::vector<uint8_t> padded(longest, 0), all(longest * g.size());
  std::copy(text.begin(), text.end(), padded.begin());
  g.iall_gather(padded.data(), all.data(), longest)->wait();
  std::vector<std::string> out;
  for (int r = 0; r < g.size(); r++) out.emplace_back(reinterpret_cast<const char*>(&all[r * longest]), size_of(r));
  return out;
}

}  // namespace meshtrain::comm
