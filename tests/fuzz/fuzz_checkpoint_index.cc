// index.json of a training checkpoint: parse_checkpoint_index. An accepted index must be
// loadable: with shard files of the sizes it lists, the shard reader finds every element of
// every unit, at every tp rank, within the files (no missing unit, no read out of bounds).
#include <map>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_index.h"
#include "checkpoint/shard_reader.h"
#include "core/file_io.h"
#include "fuzz_util.h"

namespace meshtrain::fuzz {
namespace {

// Loading is simulated only for indexes whose shards are small, to keep runs fast.
constexpr uint64_t kMaxSimulatedBytes = 1 << 22;

// Zero-filled shards of the listed sizes, with the index's checksums made to match them.
std::map<std::string, std::string> fake_shards(checkpoint::CheckpointIndex* index) {
  std::map<std::string, std::string> files;
  for (auto& f : index->files) {
    std::string bytes(f.bytes, '\0');
    f.checksum = to_hex(checksum64(bytes.data(), bytes.size()));
    files[f.name] = std::move(bytes);
  }
  return files;
}

void load_every_unit(const checkpoint::CheckpointIndex& index, const std::map<std::string, std::string>& files) {
  const auto read = [&](const std::string& name, std::shared_ptr<const checkpoint::ByteSource>* file) {
    auto it = files.find(name);
    if (it == files.end()) return Status::error(name + " is not listed");
    *file = checkpoint::memory_source(it->second);
    return Status::ok();
  };
  for (int t = 0; t < index.tp_size; t++) {
    const model::ParamLayout whole(index.model, index.tp_size, t);
    std::vector<float> dst(whole.total());
    checkpoint::ShardReader reader("fuzz", index, whole, t, read);
    for (int section = 0; section < checkpoint::kNumSections; section++)
      for (const auto& u : whole.units())
        expect_ok(reader.copy(section, u.id, 0, u.numel, dst.data() + u.offset), "ShardReader::copy");
  }
}

}  // namespace
}  // namespace meshtrain::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace meshtrain;
  checkpoint::CheckpointIndex index;
  if (!checkpoint::parse_checkpoint_index(std::string(fuzz::as_text(data, size)), "index.json", &index).is_ok())
    return 0;
  model::GptConfig config;
  fuzz::expect_ok(checkpoint::index_model_config(index.json, "index.json", &config), "index_model_config");
  uint64_t total = 0;
  for (const auto& f : index.files) total += f.bytes;
  if (total * (uint64_t)index.tp_size > fuzz::kMaxSimulatedBytes) return 0;
  fuzz::load_every_unit(index, fuzz::fake_shards(&index));
  return 0;
}
