#include "planner/step_groups.h"

#include "planner/cluster.h"
#include "planner/time_model.h"

namespace meshtrain::planner {

namespace {

PlacedGroup placed(int stride, int size, const Cluster& c) { return {size, stride, place_group(stride, size, c)}; }

}  // namespace

StepGroups step_groups(const Layout& l, const Cluster& c) {
  using comm::MeshAxis;
  const int tp_stride = axis_stride(l, MeshAxis::kTp), dp_stride = axis_stride(l, MeshAxis::kDp);
  const int pp_stride = axis_stride(l, MeshAxis::kPp), cp_stride = axis_stride(l, MeshAxis::kCp);
  const int a2a = l.cp_comm == model::CpComm::kHybrid ? l.cp_a2a : 1;
  StepGroups g;
  g.tp = placed(tp_stride, l.tp, c);
  g.dp = placed(dp_stride, l.dp, c);
  g.pp = placed(pp_stride, l.pp, c);
  g.cp = placed(cp_stride, l.cp, c);
  g.cp_a2a = placed(cp_stride, a2a, c);
  g.cp_across = placed(cp_stride * a2a, l.cp / a2a, c);
  g.ep = placed(dp_stride, l.ep, c);
  g.edp = placed(dp_stride * l.ep, l.dp / l.ep, c);
  if (l.pp > 1) g.tied = placed((l.pp - 1) * pp_stride, 2, c);
  g.world = placed(1, l.world(), c);
  return g;
}

}  // namespace meshtrain::planner
