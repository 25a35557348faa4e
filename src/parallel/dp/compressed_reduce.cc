#include "parallel/dp/compressed_reduce.h"

#include <algorithm>
#include <cstring>

#include "trace/trace.h"

namespace meshtrain::parallel {

namespace {

// Every two-dimensional tensor of the layout as a row-major block of the flat buffer.
std::vector<compress::MatrixBlock> matrices(const model::ParamLayout& layout) {
  std::vector<compress::MatrixBlock> out;
  for (const model::ParamTensor& t : layout.tensors())
    if (t.shape.size() == 2) out.push_back({t.offset, (int)t.shape[0], (int)t.shape[1]});
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.offset < b.offset; });
  return out;
}

}  // namespace

CompressedReduction::CompressedReduction(comm::Group& group, const model::ParamLayout& layout,
                                         const Compression& config)
    : config_(config), error_(MemCategory::kOptim, layout.total()) {
  std::memset(error_.data(), 0, error_.bytes());
  powersgd_ = std::make_unique<compress::PowerSgd>(group, layout.total(), matrices(layout), config.rank, config.seed);
}

void CompressedReduction::reduce(float* grads) {
  trace::Tracer::Span span(trace::Lane::kComm, "powersgd", trace::category::kCollective);
  powersgd_->reduce(grads, error_.data(), compress::PowerSgd::Result::kSum);
}

}  // namespace meshtrain::parallel
