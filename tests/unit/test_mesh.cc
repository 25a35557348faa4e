// Mesh shapes and coordinates (pure functions), the ring-volume byte convention, and the
// single-rank SelfGroup. Multi-rank behaviour is tested under mpirun in tests/mpi/.
#include <gtest/gtest.h>

#include <vector>

#include "comm/mesh.h"
#include "comm/self_group.h"
#include "comm/thread_group.h"

namespace meshtrain::comm::test_mesh {
namespace {

TEST(ResolveMesh, DerivesDp) {
  MeshShape s;
  ASSERT_TRUE(resolve_mesh(8, 2, 2, 0, &s).is_ok());
  EXPECT_EQ(s.tp, 2);
  EXPECT_EQ(s.pp, 2);
  EXPECT_EQ(s.dp, 2);
  EXPECT_EQ(s.world(), 8);
  ASSERT_TRUE(resolve_mesh(6, 3, 1, 2, &s).is_ok());
  EXPECT_EQ(s.dp, 2);
  ASSERT_TRUE(resolve_mesh(1, 1, 1, 0, &s).is_ok());
  EXPECT_EQ(s.world(), 1);
  EXPECT_EQ(MeshShape({2, 1, 4}).to_string(), "tp=2 pp=1 dp=4");
}

TEST(ResolveMesh, Errors) {
  MeshShape s;
  Status st = resolve_mesh(6, 4, 1, 0, &s);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("not divisible by tp·pp"), std::string::npos) << st.message();
  st = resolve_mesh(8, 2, 2, 4, &s);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("does not equal the world size 8"), std::string::npos)
      << st.message();
  st = resolve_mesh(4, 0, 1, 0, &s);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("(tp) must be >= 1"), std::string::npos) << st.message();
  st = resolve_mesh(4, 1, -2, 0, &s);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("(pp) must be >= 1"), std::string::npos) << st.message();
  st = resolve_mesh(4, 1, 1, -1, &s);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("(dp) must be >= 1"), std::string::npos) << st.message();
  st = resolve_mesh(0, 1, 1, 0, &s);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("world size must be >= 1"), std::string::npos) << st.message();
}

TEST(MeshCoordinates, TpFastestThenDpThenPp) {
  const MeshShape s{2, 3, 2};  // tp=2, pp=3, dp=2: 12 ranks
  // Hand-written table: rank = tp + 2·(dp + 2·pp).
  const int want[12][3] = {{0, 0, 0}, {1, 0, 0}, {0, 1, 0}, {1, 1, 0}, {0, 0, 1}, {1, 0, 1},
                           {0, 1, 1}, {1, 1, 1}, {0, 0, 2}, {1, 0, 2}, {0, 1, 2}, {1, 1, 2}};
  for (int r = 0; r < 12; ++r) {
    const MeshCoord c = Mesh::coordinates(r, s);
    EXPECT_EQ(c.tp, want[r][0]) << r;
    EXPECT_EQ(c.dp, want[r][1]) << r;
    EXPECT_EQ(c.pp, want[r][2]) << r;
    EXPECT_EQ(Mesh::rank_of(c, s), r);
  }
  for (MeshShape shape :
       {MeshShape{1, 1, 8}, MeshShape{8, 1, 1}, MeshShape{1, 8, 1}, MeshShape{4, 2, 3}}) {
    for (int r = 0; r < shape.world(); ++r)
      EXPECT_EQ(Mesh::rank_of(Mesh::coordinates(r, shape), shape), r);
  }
  const MeshCoord c = Mesh::coordinates(7, MeshShape{1, 1, 8});
  EXPECT_EQ(c.dp, 7);
  EXPECT_EQ(Mesh::coordinates(7, MeshShape{1, 8, 1}).pp, 7);
}

// --rank-order dp-tp-pp: dp varies fastest, so dp neighbours are consecutive ranks (and
// share a host's slots); every order is a bijection of the same coordinates.
TEST(MeshCoordinates, AnyRankOrder) {
  MeshShape s{2, 3, 2};  // tp=2, pp=3, dp=2
  ASSERT_TRUE(parse_rank_order("dp-tp-pp", &s.order).is_ok());
  // Hand-written: rank = dp + 2·(tp + 2·pp).
  for (int r = 0; r < 12; ++r) {
    const MeshCoord c = Mesh::coordinates(r, s);
    EXPECT_EQ(c.dp, r % 2) << r;
    EXPECT_EQ(c.tp, (r / 2) % 2) << r;
    EXPECT_EQ(c.pp, r / 4) << r;
  }
  EXPECT_EQ(s.to_string(), "tp=2 pp=3 dp=2 order=dp-tp-pp");
  for (const char* order : {"tp-dp-pp", "dp-tp-pp", "pp-dp-tp", "pp-tp-dp", "tp-pp-dp", "dp-pp-tp"}) {
    MeshShape shape{4, 2, 3};
    ASSERT_TRUE(parse_rank_order(order, &shape.order).is_ok()) << order;
    EXPECT_EQ(rank_order_name(shape.order), order);
    for (int r = 0; r < shape.world(); ++r) EXPECT_EQ(Mesh::rank_of(Mesh::coordinates(r, shape), shape), r) << order;
  }
  RankOrder o;
  for (const char* bad : {"", "tp", "tp-dp", "tp-dp-dp", "tp-dp-pp-", "tp-dp-pp-ep", "tp-dp-xp", "tp--dp"}) {
    const Status st = parse_rank_order(bad, &o);
    EXPECT_FALSE(st.is_ok()) << bad;
    EXPECT_NE(st.message().find("--rank-order must name tp, dp and pp once each"), std::string::npos) << bad;
  }
}

TEST(CommBytes, RingConvention) {
  // N = 4, n = 1000: all_reduce 2·1000·3/4 = 1500 elements.
  EXPECT_EQ(comm_bytes(CommOp::kAllReduce, 1000, 4, 4), 6000);
  EXPECT_EQ(comm_bytes(CommOp::kAllReduce, 1000, 4, 8), 12000);
  EXPECT_EQ(comm_bytes(CommOp::kAllReduce, 7, 3, 4), 4 * 9);  // 2·7·2/3 = 9.33 → 9
  EXPECT_EQ(comm_bytes(CommOp::kAllReduce, 5, 3, 4), 4 * 7);  // 6.67 → 7
  EXPECT_EQ(comm_bytes(CommOp::kReduceScatter, 10, 4, 4), 120);
  EXPECT_EQ(comm_bytes(CommOp::kAllGather, 10, 4, 4), 120);
  EXPECT_EQ(comm_bytes(CommOp::kAllToAll, 10, 4, 4), 120);
  EXPECT_EQ(comm_bytes(CommOp::kBroadcast, 10, 4, 4), 40);
  EXPECT_EQ(comm_bytes(CommOp::kBroadcast, 10, 1, 4), 0);
  EXPECT_EQ(comm_bytes(CommOp::kSend, 10, 2, 4), 40);
  EXPECT_EQ(comm_bytes(CommOp::kRecv, 10, 2, 4), 0);
  EXPECT_EQ(comm_bytes(CommOp::kBarrier, 0, 8, 0), 0);
  for (CommOp op :
       {CommOp::kAllReduce, CommOp::kReduceScatter, CommOp::kAllGather, CommOp::kAllToAll}) {
    EXPECT_EQ(comm_bytes(op, 12345, 1, 4), 0) << comm_op_name(op);
  }
}

TEST(SelfGroup, CollectivesAreCopies) {
  SelfGroup g("tp");
  EXPECT_EQ(g.rank(), 0);
  EXPECT_EQ(g.size(), 1);
  EXPECT_EQ(g.axis(), "tp");
  std::vector<float> a = {1, 2, 3}, b(3, 0.f);
  g.all_reduce(a.data(), 3);
  g.all_reduce(a.data(), 3, ReduceOp::kMax);
  EXPECT_EQ(a, (std::vector<float>{1, 2, 3}));
  g.reduce_scatter(a.data(), b.data(), 3);
  EXPECT_EQ(b, a);
  std::fill(b.begin(), b.end(), 0.f);
  g.all_gather(a.data(), b.data(), 3);
  EXPECT_EQ(b, a);
  g.all_gather(a.data(), a.data(), 3);  // in place
  EXPECT_EQ(a, (std::vector<float>{1, 2, 3}));
  std::fill(b.begin(), b.end(), 0.f);
  g.all_to_all(a.data(), b.data(), 3);
  EXPECT_EQ(b, a);
  g.broadcast(a.data(), 3, 0);
  double d[2] = {1.5, -2.0};
  g.all_reduce_f64(d, 2, ReduceOp::kSum);
  EXPECT_EQ(d[0], 1.5);
  g.barrier();
  RequestPtr r = g.iall_reduce(a.data(), 3, ReduceOp::kSum);
  EXPECT_TRUE(r->done());
  r->wait();
  r->wait();  // idempotent
  EXPECT_EQ(g.stats().bytes, 0);
  EXPECT_EQ(g.stats().calls, 10);
  g.reset_stats();
  EXPECT_EQ(g.stats().calls, 0);

  std::unique_ptr<Group> sub = g.split(3, 0, "dp");
  EXPECT_EQ(sub->size(), 1);
  EXPECT_EQ(sub->axis(), "dp");
}

TEST(SelfGroupDeathTest, SendAndRecvHaveNoPeer) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  SelfGroup g;
  float x = 0;
  EXPECT_DEATH(g.send(&x, 1, 0, 0), "send on a single-rank group");
  EXPECT_DEATH(g.recv(&x, 1, 0, 0), "recv on a single-rank group");
}

TEST(Mesh, OnASingleRankWorld) {
  SelfGroup world("world");
  Mesh mesh(world, MeshShape{});
  EXPECT_EQ(mesh.tp().size(), 1);
  EXPECT_EQ(mesh.dp().axis(), "dp");
  EXPECT_EQ(mesh.pp_rank(), 0);
  float x = 2.f;
  mesh.dp().all_reduce(&x, 1);
  EXPECT_EQ(x, 2.f);
  const auto stats = mesh.stats();
  EXPECT_EQ(stats.size(), 6u);  // world, tp, dp, pp, ep, edp
  EXPECT_EQ(stats.at("dp").calls, 1);
  EXPECT_EQ(stats.at("tp").calls, 0);
  mesh.reset_stats();
  EXPECT_EQ(mesh.stats().at("dp").calls, 0);
}

}  // namespace
}  // namespace meshtrain::comm::test_mesh

namespace meshtrain::comm {
namespace {

// A fourth axis, cp, is one row of the axis table: an order may name it anywhere, an order
// that does not places it right after tp (so every earlier order string means what it did),
// and its sizes enter the world.
TEST(MeshCoordinates, ContextParallelAxisTakesItsDefaultPlace) {
  MeshShape s{2, 2, 2};  // tp=2, pp=2, dp=2
  s.cp = 2;
  EXPECT_EQ(s.world(), 16);
  EXPECT_EQ(rank_order_name(s.full_order()), "tp-cp-dp-pp");
  ASSERT_TRUE(parse_rank_order("dp-tp-pp", &s.order).is_ok());
  EXPECT_EQ(rank_order_name(s.full_order()), "dp-tp-cp-pp");
  ASSERT_TRUE(parse_rank_order("cp-pp-dp-tp", &s.order).is_ok());
  EXPECT_EQ(rank_order_name(s.order), "cp-pp-dp-tp");
  for (int r = 0; r < s.world(); ++r) {
    const MeshCoord c = Mesh::coordinates(r, s);
    EXPECT_EQ(c.cp, r % 2) << r;
    EXPECT_EQ(c.tp, r / 8) << r;
    EXPECT_EQ(Mesh::rank_of(c, s), r);
  }
  EXPECT_EQ(s.to_string(), "tp=2 pp=2 dp=2 cp=2 order=cp-pp-dp-tp");
  RankOrder o;
  EXPECT_FALSE(parse_rank_order("tp-cp-cp-dp-pp", &o).is_ok());
  EXPECT_FALSE(parse_rank_order("tp-cp-pp", &o).is_ok()) << "dp must be named";
}

// Groups from axes and from a product of axes: with tp 2, cp 2, dp 2 (8 ranks in threads)
// each rank's tp, cp and dp groups hold 2 ranks that differ only on that axis, and the
// gradient group dp x cp holds 4, the ranks that share the tp coordinate.
TEST(Mesh, GroupsOfAxesAndOfTheirProduct) {
  MeshShape s{2, 1, 2};
  s.cp = 2;
  ThreadWorld world(8);
  std::vector<std::vector<int>> sizes(8), ranks(8);
  run_ranks(8, [&](int r) {
    std::unique_ptr<Group> g = world.group(r);
    Mesh mesh(*g, s);
    const MeshCoord c = Mesh::coordinates(r, s);
    sizes[r] = {mesh.tp().size(), mesh.cp().size(), mesh.dp().size(), mesh.grad().size()};
    ranks[r] = {mesh.tp().rank(), mesh.cp().rank(), mesh.dp().rank(), mesh.grad().rank()};
    EXPECT_EQ(mesh.cp_rank(), c.cp);
    // The gradient group's rank: dp fastest, then cp (the order its axes were named).
    EXPECT_EQ(mesh.grad().rank(), c.dp + 2 * c.cp);
    std::vector<float> x = {(float)c.tp};
    mesh.grad().all_reduce(x.data(), 1);
    EXPECT_EQ(x[0], 4.0f * c.tp) << "only ranks of the same tp coordinate";
    EXPECT_EQ(mesh.stats().count("dpcp"), 1u);
  });
  for (int r = 0; r < 8; r++) EXPECT_EQ(sizes[r], (std::vector<int>{2, 2, 2, 4})) << r;
}

}  // namespace
}  // namespace meshtrain::comm
