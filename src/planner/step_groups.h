// The communication groups of one training step of a layout, and where each sits on a
// cluster's hosts: the one place that says which ranks each axis's collectives span. The
// GPU time model (planner/time_model.cc) prices them as rings, the local model
// (planner/local.cc) as links of this machine's transport; both read them from here, so a
// new axis, or a new group made of axes, is one entry below.
//
// The first part of the planner's step assembly (docs/planning.md, "One step, two cost
// models"): what crosses which group is still listed by each cost model.
#pragma once
#include "planner/placement.h"

namespace meshtrain::planner {

struct Cluster;
struct Layout;

// `size` ranks, `stride` ranks apart in the rank order, placed on the hosts.
struct PlacedGroup {
  int size = 1, stride = 1;
  GroupPlacement placement;
};

struct StepGroups {
  PlacedGroup tp, dp, pp, cp;
  // cp's hybrid mode: its all-to-all groups (cp_a2a consecutive cp ranks) and the ring across
  // them (every cp_a2a-th cp rank); single ranks otherwise.
  PlacedGroup cp_a2a, cp_across;
  // MoE: the expert-parallel group (ep consecutive dp ranks) and the copies of one rank's
  // experts (every ep-th dp rank), which reduce the experts' gradients.
  PlacedGroup ep, edp;
  // The first and last pipeline stages ((p - 1) pp strides apart): the tied embedding's two
  // copies. A single rank when pp = 1.
  PlacedGroup tied;
  PlacedGroup world;
  // Gradients reduce over dp x cp, and experts' over edp x cp: the products of these groups
  // (each cost model combines two placed groups in its own way).
};

StepGroups step_groups(const Layout& l, const Cluster& c);

}  // namespace meshtrain::planner
