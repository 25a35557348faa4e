// A planner cluster file's text: parse_cluster_toml. An accepted cluster passes
// planner::validate, the check the planner's arithmetic relies on.
#include <string>

#include "planner/cluster_file.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace meshtrain;
  planner::Cluster c;
  if (!planner::parse_cluster_toml(std::string(fuzz::as_text(data, size)), "cluster.toml", &c).is_ok()) return 0;
  fuzz::expect_ok(planner::validate(c), "planner::validate");
  if (c.name.empty()) fuzz::broken_promise("accepted a cluster without a name");
  return 0;
}
