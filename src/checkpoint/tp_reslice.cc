#include "checkpoint/tp_reslice.h"

#include <algorithm>
#include <cstring>

#include "core/check.h"

namespace meshtrain::checkpoint {

namespace {

// The tensors of whole-model unit `id` in `layout`, in their order inside the unit.
std::vector<const model::ParamTensor*> unit_tensors(const model::ParamLayout& layout, int id) {
  const int u = layout.local_unit(id);
  CHECK_MSG(u >= 0, "tp reslice: a layout without the unit");
  std::vector<const model::ParamTensor*> out;
  for (const auto& t : layout.tensors())
    if (t.unit == u) out.push_back(&t);
  return out;
}

void ensure(Buffer<float>& b, size_t n) {
  if (b.size() >= n) return;
  b.release();
  b.allocate(MemCategory::kWorkspace, n);
}

}  // namespace

TpResliceReader::TpResliceReader(const std::string& dir, const CheckpointIndex& index,
                                 const model::GptConfig& config, const model::ParamLayout& target)
    : target_(target), saved_tp_(index.tp_size), global_(config) {
  const model::ExpertTp target_experts =
      target.experts_replicated() ? model::ExpertTp::kReplicated : model::ExpertTp::kSplit;
  direct_ = index.tp_size == target.tp() && index.expert_layout() == target_experts;
  if (direct_) {
    readers_.emplace_back(dir, index, target, target.tp_rank());
    return;
  }
  for (int r = 0; r < saved_tp_; r++) {
    saved_.emplace_back(config, saved_tp_, r, model::ModelPart{}, 1, 0, index.expert_layout());
    readers_.emplace_back(dir, index, saved_.back(), r);
  }
}

Status TpResliceReader::copy(int section, int id, size_t begin, size_t end, float* dst) {
  if (direct_) return readers_.front().copy(section, id, begin, end, dst);
  if (section != cached_section_ || id != cached_id_) RETURN_IF_ERROR(assemble(section, id));
  std::memcpy(dst, cached_.data() + begin, (end - begin) * sizeof(float));
  return Status::ok();
}

// Every writer tp rank's slice of the unit goes into its whole form (replicated tensors are
// the same on every writer, so later ranks rewrite equal values), which is then cut to the
// target's slice.
Status TpResliceReader::assemble(int section, int id) {
  cached_section_ = cached_id_ = -1;
  const auto whole = unit_tensors(global_, id);
  const model::ParamUnit& whole_unit = global_.units()[global_.local_unit(id)];
  ensure(whole_unit_, whole_unit.numel);
  std::fill(whole_unit_.data(), whole_unit_.data() + whole_unit.numel, 0.0f);
  for (int r = 0; r < saved_tp_; r++) {
    const model::ParamLayout& slice = saved_[r];
    const auto tensors = unit_tensors(slice, id);
    CHECK_MSG(tensors.size() == whole.size(), "tp reslice: unit tensors differ between tp sizes");
    const size_t numel = slice.units()[slice.local_unit(id)].numel;
    ensure(saved_unit_, numel);
    RETURN_IF_ERROR(readers_[r].copy(section, id, 0, numel, saved_unit_.data()));
    for (size_t i = 0; i < tensors.size(); i++)
      model::local_to_global(*tensors[i], saved_tp_, r, saved_unit_.data() + slice.offset_in_unit(*tensors[i]),
                             whole_unit_.data() + global_.offset_in_unit(*whole[i]));
  }
  const auto tensors = unit_tensors(target_, id);
  CHECK_MSG(tensors.size() == whole.size(), "tp reslice: unit tensors differ between tp sizes");
  ensure(cached_, target_.units()[target_.local_unit(id)].numel);
  for (size_t i = 0; i < tensors.size(); i++)
    model::global_to_local(*tensors[i], target_.tp(), target_.tp_rank(),
                           whole_unit_.data() + global_.offset_in_unit(*whole[i]),
                           cached_.data() + target_.offset_in_unit(*tensors[i]));
  cached_section_ = section, cached_id_ = id;
  return Status::ok();
}

}  // namespace meshtrain::checkpoint
