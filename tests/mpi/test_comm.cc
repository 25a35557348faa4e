// Communication layer under mpirun (-n 2, 3, 4) and as a single process (SelfGroup):
// every collective against hand-computed results for this run's world size, point-to-point
// patterns that must not deadlock, overlap with compute, split groups, the mesh, the
// traffic counters, and (only when tests/mpi/expect_watchdog.sh runs it) the watchdog.
//
// Every test runs on every rank in the same order; decisions to skip depend only on the
// world size so that the collectives of all ranks match.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "comm/group.h"
#include "comm/mesh.h"
#include "comm/self_group.h"

using meshtrain::comm::AxisStats;
using meshtrain::comm::Group;
using meshtrain::comm::Mesh;
using meshtrain::comm::MeshCoord;
using meshtrain::comm::MeshShape;
using meshtrain::comm::ReduceOp;
using meshtrain::comm::RequestPtr;

Group& test_world();  // tests/mpi/main.cc

namespace {

// Small integers: every sum below is exact in float.
float val(int rank, size_t i) {
  return static_cast<float>(3 * (rank + 1) + static_cast<int>(i % 1000));
}

float sum_over_ranks(int n_ranks, size_t i) {
  float s = 0;
  for (int r = 0; r < n_ranks; ++r) s += val(r, i);
  return s;
}

// Number of i in [0, n) with got[i] != want(i); reports the first one.
template <typename F>
size_t mismatches(const std::vector<float>& got, size_t n, F want) {
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    const float w = want(i);
    if (got[i] != w) {
      if (bad == 0)
        ADD_FAILURE() << "first mismatch at " << i << ": got " << got[i] << ", want " << w;
      ++bad;
    }
  }
  return bad;
}

const std::vector<size_t> kSizes = {0, 1, 7, 1000, 1001, size_t{1} << 20};

}  // namespace

// ---------------------------------------------------------------------------- collectives

TEST(AllReduce, SumAndMax) {
  Group& w = test_world();
  const int N = w.size(), R = w.rank();
  for (size_t n : kSizes) {
    SCOPED_TRACE("n = " + std::to_string(n));
    std::vector<float> buf(n);
    for (size_t i = 0; i < n; ++i) buf[i] = val(R, i);
    w.all_reduce(buf.data(), n, ReduceOp::kSum);
    EXPECT_EQ(mismatches(buf, n, [&](size_t i) { return sum_over_ranks(N, i); }), 0u);

    for (size_t i = 0; i < n; ++i) buf[i] = val(R, i) * (i % 2 ? 1.f : -1.f);
    w.all_reduce(buf.data(), n, ReduceOp::kMax);
    EXPECT_EQ(mismatches(buf, n, [&](size_t i) { return i % 2 ? val(N - 1, i) : -val(0, i); }), 0u);
  }
}

TEST(AllReduce, Float64KeepsPrecision) {
  Group& w = test_world();
  const int N = w.size(), R = w.rank();
  // 1e15 + rank is not representable in float; the double sum is exact.
  std::vector<double> buf = {1e15 + R, 0.5 * (R + 1), -static_cast<double>(R), 0.0};
  w.all_reduce_f64(buf.data(), buf.size(), ReduceOp::kSum);
  EXPECT_EQ(buf[0], 1e15 * N + N * (N - 1) / 2.0);
  EXPECT_EQ(buf[1], 0.5 * N * (N + 1) / 2.0);
  EXPECT_EQ(buf[2], -N * (N - 1) / 2.0);
  EXPECT_EQ(buf[3], 0.0);

  std::vector<double> mx = {1e15 + R, -1e15 - R};
  w.all_reduce_f64(mx.data(), mx.size(), ReduceOp::kMax);
  EXPECT_EQ(mx[0], 1e15 + (N - 1));
  EXPECT_EQ(mx[1], -1e15);
  w.all_reduce_f64(nullptr, 0, ReduceOp::kSum);  // n = 0 is a valid (empty) collective
}

TEST(ReduceScatter, SumAndMaxOfOwnBlock) {
  Group& w = test_world();
  const int N = w.size(), R = w.rank();
  for (size_t n : {size_t{0}, size_t{1}, size_t{13}, size_t{1001}, (size_t{1} << 20) / 3}) {
    SCOPED_TRACE("n = " + std::to_string(n));
    std::vector<float> send(n * N), recv(n, -7.f);
    for (size_t k = 0; k < n * N; ++k) send[k] = val(R, k);
    w.reduce_scatter(send.data(), recv.data(), n, ReduceOp::kSum);
    EXPECT_EQ(mismatches(recv, n, [&](size_t i) { return sum_over_ranks(N, R * n + i); }), 0u);

    w.reduce_scatter(send.data(), recv.data(), n, ReduceOp::kMax);
    EXPECT_EQ(mismatches(recv, n, [&](size_t i) { return val(N - 1, R * n + i); }), 0u);
  }
}

TEST(AllGather, OutOfPlace) {
  Group& w = test_world();
  const int N = w.size(), R = w.rank();
  for (size_t n : kSizes) {
    SCOPED_TRACE("n = " + std::to_string(n));
    std::vector<float> send(n), recv(n * N, -1.f);
    for (size_t i = 0; i < n; ++i) send[i] = val(R, i);
    w.all_gather(send.data(), recv.data(), n);
    EXPECT_EQ(
        mismatches(recv, n * N, [&](size_t k) { return val(static_cast<int>(k / n), k % n); }), 0u);
  }
}

TEST(AllGather, InPlace) {
  Group& w = test_world();
  const int N = w.size(), R = w.rank();
  for (size_t n : {size_t{0}, size_t{5}, size_t{1001}, size_t{1} << 18}) {
    SCOPED_TRACE("n = " + std::to_string(n));
    std::vector<float> buf(n * N, -1.f);
    for (size_t i = 0; i < n; ++i) buf[R * n + i] = val(R, i);
    w.all_gather(buf.data() + R * n, buf.data(), n);
    EXPECT_EQ(mismatches(buf, n * N, [&](size_t k) { return val(static_cast<int>(k / n), k % n); }),
              0u);
  }
}

TEST(Broadcast, FromEveryRoot) {
  Group& w = test_world();
  const int N = w.size(), R = w.rank();
  for (size_t n : {size_t{0}, size_t{1}, size_t{1000}, size_t{1} << 20}) {
    for (int root = 0; root < N; ++root) {
      SCOPED_TRACE("n = " + std::to_string(n) + ", root = " + std::to_string(root));
      std::vector<float> buf(n);
      for (size_t i = 0; i < n; ++i) buf[i] = R == root ? val(root, i) : -1.f;
      w.broadcast(buf.data(), n, root);
      EXPECT_EQ(mismatches(buf, n, [&](size_t i) { return val(root, i); }), 0u);
    }
  }
}

TEST(AllToAll, OutOfPlaceAndInPlace) {
  Group& w = test_world();
  const int N = w.size(), R = w.rank();
  // Block j of rank r's send holds code(r, j, i); rank R receives block R of every rank.
  auto code = [](int from, int to, size_t i) {
    return static_cast<float>(from * 100000 + to * 1000 + i % 1000);
  };
  for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{1} << 16}) {
    SCOPED_TRACE("n = " + std::to_string(n));
    std::vector<float> send(n * N), recv(n * N, -1.f);
    for (int j = 0; j < N; ++j)
      for (size_t i = 0; i < n; ++i) send[j * n + i] = code(R, j, i);
    w.all_to_all(send.data(), recv.data(), n);
    EXPECT_EQ(
        mismatches(recv, n * N, [&](size_t k) { return code(static_cast<int>(k / n), R, k % n); }),
        0u);

    w.all_to_all(send.data(), send.data(), n);  // in place
    EXPECT_EQ(
        mismatches(send, n * N, [&](size_t k) { return code(static_cast<int>(k / n), R, k % n); }),
        0u);
  }
}

// Byte payloads (compressed blocks: packed signs, int8) travel bit for bit, every byte value
// included, and count one byte per element.
TEST(Bytes, AllToAllAndAllGather) {
  Group& w = test_world();
  const int N = w.size(), R = w.rank();
  auto code = [](int from, int to, size_t i) { return static_cast<uint8_t>(from * 71 + to * 13 + i); };
  const size_t n = 300;  // every byte value appears
  std::vector<uint8_t> send(n * N), recv(n * N, 0);
  for (int j = 0; j < N; ++j)
    for (size_t i = 0; i < n; ++i) send[j * n + i] = code(R, j, i);
  w.reset_stats();
  w.all_to_all(send.data(), recv.data(), n);
  for (size_t k = 0; k < n * N; ++k) ASSERT_EQ(recv[k], code(static_cast<int>(k / n), R, k % n)) << k;
  EXPECT_EQ(w.stats().bytes, (int64_t)((N - 1) * n));
  std::vector<uint8_t> gathered(n * N, 0);
  w.all_gather(send.data(), gathered.data(), n);
  for (size_t k = 0; k < n * N; ++k) ASSERT_EQ(gathered[k], code(static_cast<int>(k / n), 0, k % n)) << k;
}

// Rank r sends (r + j) % 3 elements to rank j (some blocks empty), each coding (from, to, i).
TEST(AllToAllV, VariableBlocksAndTheirBytes) {
  Group& w = test_world();
  const int N = w.size(), R = w.rank();
  auto count = [](int from, int to) { return (size_t)((from + to) % 3); };
  auto code = [](int from, int to, size_t i) { return static_cast<float>(from * 1000 + to * 10 + i); };
  std::vector<size_t> sc(N), rc(N);
  std::vector<float> send, expected;
  size_t others = 0;
  for (int j = 0; j < N; ++j) {
    sc[j] = count(R, j), rc[j] = count(j, R);
    others += j == R ? 0 : sc[j];
    for (size_t i = 0; i < sc[j]; ++i) send.push_back(code(R, j, i));
    for (size_t i = 0; i < rc[j]; ++i) expected.push_back(code(j, R, i));
  }
  std::vector<float> recv(expected.size() + 1, -1.f);  // one spare: nothing written past
  w.reset_stats();
  w.all_to_allv(send.data(), sc.data(), recv.data(), rc.data());
  for (size_t k = 0; k < expected.size(); ++k) EXPECT_EQ(recv[k], expected[k]) << k;
  EXPECT_EQ(recv.back(), -1.f);
  EXPECT_EQ(w.stats().bytes, (int64_t)(others * sizeof(float)));
}

TEST(Barrier, AllRanksPass) {
  for (int i = 0; i < 5; ++i) test_world().barrier();
}

// ---------------------------------------------------------------------- point-to-point

TEST(SendRecv, Ring) {
  Group& w = test_world();
  const int N = w.size(), R = w.rank();
  if (N < 2) GTEST_SKIP() << "needs 2 ranks";
  const int next = (R + 1) % N, prev = (R + N - 1) % N;
  for (size_t n : {size_t{1}, size_t{1000}, size_t{1} << 20}) {
    std::vector<float> out(n), in(n, -1.f);
    for (size_t i = 0; i < n; ++i) out[i] = val(R, i);
    RequestPtr s = w.isend(out.data(), n, next, 3);
    RequestPtr r = w.irecv(in.data(), n, prev, 3);
    r->wait();
    s->wait();
    EXPECT_EQ(mismatches(in, n, [&](size_t i) { return val(prev, i); }), 0u);
  }
}

// Both ranks of a pair send first, then receive; 4 MiB messages need a rendezvous, so a
// blocking send on either side would deadlock.
TEST(SendRecv, PairwiseExchangeBothSendFirst) {
  Group& w = test_world();
  const int N = w.size(), R = w.rank();
  if (N < 2) GTEST_SKIP() << "needs 2 ranks";
  const int partner = R ^ 1;
  const size_t n = size_t{1} << 20;
  std::vector<float> out(n), in(n, -1.f);
  for (size_t i = 0; i < n; ++i) out[i] = val(R, i);
  if (partner < N) {
    RequestPtr s = w.isend(out.data(), n, partner, 0);
    RequestPtr r = w.irecv(in.data(), n, partner, 0);
    s->wait();  // the send completes only because the receive was posted behind it
    r->wait();
    EXPECT_EQ(mismatches(in, n, [&](size_t i) { return val(partner, i); }), 0u);
  }
  w.barrier();
}

TEST(SendRecv, OneWayBlocking) {
  Group& w = test_world();
  const int N = w.size(), R = w.rank();
  if (N < 2) GTEST_SKIP() << "needs 2 ranks";
  const size_t n = size_t{1} << 20;
  std::vector<float> buf(n, -1.f);
  if (R == 0) {
    for (size_t i = 0; i < n; ++i) buf[i] = val(0, i);
    w.send(buf.data(), n, 1, 9);
  } else if (R == 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the receive comes late
    w.recv(buf.data(), n, 0, 9);
    EXPECT_EQ(mismatches(buf, n, [&](size_t i) { return val(0, i); }), 0u);
  }
  w.barrier();
}

// Messages with different tags are matched by tag, not by posting order.
TEST(SendRecv, TagsMatchOutOfOrder) {
  Group& w = test_world();
  const int N = w.size(), R = w.rank();
  if (N < 2) GTEST_SKIP() << "needs 2 ranks";
  std::vector<float> a(100, 1.f), b(200, 2.f), ra(100), rb(200);
  if (R == 0) {
    RequestPtr s1 = w.isend(a.data(), a.size(), 1, 1);
    RequestPtr s2 = w.isend(b.data(), b.size(), 1, 2);
    s2->wait();
    s1->wait();
  } else if (R == 1) {
    w.recv(rb.data(), rb.size(), 0, 2);
    w.recv(ra.data(), ra.size(), 0, 1);
    EXPECT_EQ(mismatches(ra, 100, [](size_t) { return 1.f; }), 0u);
    EXPECT_EQ(mismatches(rb, 200, [](size_t) { return 2.f; }), 0u);
  }
  w.barrier();
}

// Pipeline: micro-batches flow forward rank 0 → N−1 (blocking recv/send, each stage adds
// 1), then gradients flow backward with non-blocking sends waited at the end.
TEST(SendRecv, PipelineChains) {
  Group& w = test_world();
  const int N = w.size(), R = w.rank();
  if (N < 2) GTEST_SKIP() << "needs 2 ranks";
  const size_t n = 50000;
  const int micro = 4;
  for (int m = 0; m < micro; ++m) {
    std::vector<float> x(n);
    if (R == 0) {
      for (size_t i = 0; i < n; ++i) x[i] = static_cast<float>(m * 1000 + i % 1000);
    } else {
      w.recv(x.data(), n, R - 1, m);
    }
    for (float& v : x) v += 1.f;
    if (R < N - 1) {
      w.send(x.data(), n, R + 1, m);
    } else {
      EXPECT_EQ(
          mismatches(x, n, [&](size_t i) { return static_cast<float>(m * 1000 + i % 1000 + N); }),
          0u);
    }
  }
  std::vector<std::vector<float>> grads(micro, std::vector<float>(n));
  std::vector<RequestPtr> pending;
  for (int m = 0; m < micro; ++m) {
    std::vector<float>& g = grads[m];
    if (R == N - 1) {
      for (size_t i = 0; i < n; ++i) g[i] = static_cast<float>(m + i % 7);
    } else {
      w.recv(g.data(), n, R + 1, 100 + m);
    }
    for (float& v : g) v *= 2.f;
    if (R > 0) pending.push_back(w.isend(g.data(), n, R - 1, 100 + m));
    if (R == 0) {
      const float scale = static_cast<float>(1 << N);
      EXPECT_EQ(mismatches(g, n, [&](size_t i) { return scale * static_cast<float>(m + i % 7); }),
                0u);
    }
  }
  for (RequestPtr& p : pending) p->wait();
}

// Every rank posts receives from and sends to every other rank before waiting on any.
TEST(SendRecv, AllPairsOutstanding) {
  Group& w = test_world();
  const int N = w.size(), R = w.rank();
  if (N < 2) GTEST_SKIP() << "needs 2 ranks";
  const size_t n = 1 << 17;
  std::vector<std::vector<float>> in(N, std::vector<float>(n, -1.f));
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = val(R, i);
  std::vector<RequestPtr> reqs;
  for (int d = 1; d < N; ++d) reqs.push_back(w.isend(out.data(), n, (R + d) % N, 5));
  for (int d = 1; d < N; ++d)
    reqs.push_back(w.irecv(in[(R + N - d) % N].data(), n, (R + N - d) % N, 5));
  for (auto it = reqs.rbegin(); it != reqs.rend(); ++it) (*it)->wait();
  for (int p = 0; p < N; ++p) {
    if (p == R) continue;
    EXPECT_EQ(mismatches(in[p], n, [&](size_t i) { return val(p, i); }), 0u);
  }
}

// A collective between outstanding point-to-point operations.
TEST(SendRecv, CollectiveWhileP2pInFlight) {
  Group& w = test_world();
  const int N = w.size(), R = w.rank();
  if (N < 2) GTEST_SKIP() << "needs 2 ranks";
  const size_t n = 1 << 18;
  std::vector<float> out(n, static_cast<float>(R)), in(n, -1.f), red(1000);
  for (size_t i = 0; i < red.size(); ++i) red[i] = val(R, i);
  RequestPtr r = w.irecv(in.data(), n, (R + N - 1) % N, 11);
  w.all_reduce(red.data(), red.size());
  RequestPtr s = w.isend(out.data(), n, (R + 1) % N, 11);
  s->wait();
  r->wait();
  EXPECT_EQ(mismatches(red, red.size(), [&](size_t i) { return sum_over_ranks(N, i); }), 0u);
  EXPECT_EQ(in[0], static_cast<float>((R + N - 1) % N));
  EXPECT_EQ(in[n - 1], static_cast<float>((R + N - 1) % N));
}

// ------------------------------------------------------------------------------ overlap

// The collective completes while this thread computes and never enters wait(): progress
// happens on the communication thread (a plain MPI_Iallreduce would not progress here).
TEST(Overlap, AllReduceProgressesDuringCompute) {
  Group& w = test_world();
  const int N = w.size(), R = w.rank();
  const size_t n = size_t{1} << 22;  // 16 MiB
  std::vector<float> buf(n);
  for (size_t i = 0; i < n; ++i) buf[i] = val(R, i);
  std::vector<float> a(1 << 16, 1.0001f);

  const auto t0 = std::chrono::steady_clock::now();
  RequestPtr req = w.iall_reduce(buf.data(), n, ReduceOp::kSum);
  double sink = 0;
  int rounds = 0;
  while (!req->done()) {
    for (float& v : a) v = v * 0.9999f + 0.0001f;  // "compute"
    sink += a[rounds % a.size()];
    ++rounds;
    if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(30)) break;
  }
  const double overlapped_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(req->done()) << "the all_reduce did not complete without wait() within 30 s";
  req->wait();
  if (rounds > 0) {
    EXPECT_GT(sink, 0.0);
  }
  EXPECT_EQ(mismatches(buf, n, [&](size_t i) { return sum_over_ranks(N, i); }), 0u);
  if (R == 0) {
    std::printf("[          ] 16 MiB all_reduce completed during %d compute rounds in %.1f ms\n",
                rounds, overlapped_s * 1e3);
  }
}

TEST(Overlap, SeveralOutstandingCollectivesCompleteInOrder) {
  Group& w = test_world();
  const int N = w.size(), R = w.rank();
  const size_t n = 100000;
  std::vector<std::vector<float>> bufs(6, std::vector<float>(n));
  std::vector<RequestPtr> reqs;
  for (int k = 0; k < 6; ++k) {
    for (size_t i = 0; i < n; ++i) bufs[k][i] = val(R, i) + static_cast<float>(k);
    reqs.push_back(w.iall_reduce(bufs[k].data(), n, ReduceOp::kSum));
  }
  reqs.back()->wait();  // FIFO: the last one done means all are
  for (int k = 0; k < 6; ++k) EXPECT_TRUE(reqs[k]->done()) << k;
  for (int k = 0; k < 6; ++k) {
    EXPECT_EQ(
        mismatches(bufs[k], n,
                   [&](size_t i) { return sum_over_ranks(N, i) + static_cast<float>(k * N); }),
        0u);
  }
}

// ------------------------------------------------------------------------ split, mesh

TEST(Split, TwoAxes) {
  Group& w = test_world();
  const int N = w.size(), R = w.rank();
  // "row": ranks {0,1}, {2,3}, ...; "col": ranks of equal parity.
  std::unique_ptr<Group> row = w.split(R / 2, R, "row");
  std::unique_ptr<Group> col = w.split(R % 2, R, "col");
  std::vector<int> row_members, col_members;
  for (int r = 0; r < N; ++r) {
    if (r / 2 == R / 2) row_members.push_back(r);
    if (r % 2 == R % 2) col_members.push_back(r);
  }
  EXPECT_EQ(row->axis(), "row");
  EXPECT_EQ(col->axis(), "col");
  EXPECT_EQ(row->size(), static_cast<int>(row_members.size()));
  EXPECT_EQ(col->size(), static_cast<int>(col_members.size()));
  EXPECT_EQ(row->rank(), R % 2);
  EXPECT_EQ(col->rank(), R / 2);

  w.reset_stats();
  // Interleaved non-blocking collectives on both axes, waited in reverse order.
  float row_sum = static_cast<float>(R), col_sum = static_cast<float>(R);
  std::vector<float> col_gather(col->size(), -1.f);
  float mine = static_cast<float>(R);
  RequestPtr a = row->iall_reduce(&row_sum, 1, ReduceOp::kSum);
  RequestPtr b = col->iall_reduce(&col_sum, 1, ReduceOp::kSum);
  RequestPtr c = col->iall_gather(&mine, col_gather.data(), 1);
  c->wait();
  b->wait();
  a->wait();
  float want_row = 0, want_col = 0;
  for (int r : row_members) want_row += r;
  for (int r : col_members) want_col += r;
  EXPECT_EQ(row_sum, want_row);
  EXPECT_EQ(col_sum, want_col);
  for (size_t k = 0; k < col_members.size(); ++k)
    EXPECT_EQ(col_gather[k], static_cast<float>(col_members[k]));

  EXPECT_EQ(row->stats().calls, 1);
  EXPECT_EQ(col->stats().calls, 2);
  EXPECT_EQ(w.stats().calls, 0);

  // A split of a split.
  std::unique_ptr<Group> single = row->split(row->rank(), 0, "single");
  EXPECT_EQ(single->size(), 1);
  float x = 5.f;
  single->all_reduce(&x, 1);
  EXPECT_EQ(x, 5.f);
}

TEST(Mesh, EveryShapeOfThisWorld) {
  Group& w = test_world();
  const int N = w.size(), R = w.rank();
  for (int tp = 1; tp <= N; ++tp) {
    for (int pp = 1; pp <= N; ++pp) {
      if (N % (tp * pp) != 0) continue;
      MeshShape shape;
      ASSERT_TRUE(meshtrain::comm::resolve_mesh(N, tp, pp, 0, &shape).is_ok());
      SCOPED_TRACE(shape.to_string());
      Mesh mesh(w, shape);
      const MeshCoord c = Mesh::coordinates(R, shape);
      EXPECT_EQ(mesh.tp_rank(), c.tp);
      EXPECT_EQ(mesh.dp_rank(), c.dp);
      EXPECT_EQ(mesh.pp_rank(), c.pp);
      EXPECT_EQ(mesh.tp().size(), shape.tp);
      EXPECT_EQ(mesh.dp().size(), shape.dp);
      EXPECT_EQ(mesh.pp().size(), shape.pp);
      EXPECT_EQ(mesh.tp().axis(), "tp");
      EXPECT_EQ(mesh.dp().axis(), "dp");
      EXPECT_EQ(mesh.pp().axis(), "pp");

      // Sum of world ranks along each axis, against the coordinates.
      float want_tp = 0, want_dp = 0, want_pp = 0;
      for (int t = 0; t < shape.tp; ++t) want_tp += Mesh::rank_of({t, c.dp, c.pp}, shape);
      for (int d = 0; d < shape.dp; ++d) want_dp += Mesh::rank_of({c.tp, d, c.pp}, shape);
      for (int p = 0; p < shape.pp; ++p) want_pp += Mesh::rank_of({c.tp, c.dp, p}, shape);
      mesh.reset_stats();
      float s_tp = static_cast<float>(R), s_dp = static_cast<float>(R),
            s_pp = static_cast<float>(R);
      mesh.tp().all_reduce(&s_tp, 1);
      mesh.dp().all_reduce(&s_dp, 1);
      mesh.pp().all_reduce(&s_pp, 1);
      EXPECT_EQ(s_tp, want_tp);
      EXPECT_EQ(s_dp, want_dp);
      EXPECT_EQ(s_pp, want_pp);

      // Pipeline neighbours exchange along pp.
      if (shape.pp > 1) {
        float from_prev = -1.f, me = static_cast<float>(R);
        const int next = (c.pp + 1) % shape.pp, prev = (c.pp + shape.pp - 1) % shape.pp;
        RequestPtr s = mesh.pp().isend(&me, 1, next, 0);
        mesh.pp().recv(&from_prev, 1, prev, 0);
        s->wait();
        EXPECT_EQ(from_prev, static_cast<float>(Mesh::rank_of({c.tp, c.dp, prev}, shape)));
      }

      // Expert parallelism over pairs of dp ranks: ep holds consecutive dp ranks, edp the
      // ranks with the same place in their pair.
      if (shape.dp % 2 == 0) {
        MeshShape with_ep = shape;
        with_ep.ep = 2;
        Mesh moe(w, with_ep);
        EXPECT_EQ(moe.ep().size(), 2);
        EXPECT_EQ(moe.ep().rank(), c.dp % 2);
        EXPECT_EQ(moe.edp().size(), shape.dp / 2);
        EXPECT_EQ(moe.edp().rank(), c.dp / 2);
        float dp_rank = (float)c.dp;
        moe.ep().all_reduce(&dp_rank, 1);
        EXPECT_EQ(dp_rank, (float)(c.dp / 2 * 4 + 1)) << "the pair's dp ranks";
      }

      const auto stats = mesh.stats();
      ASSERT_EQ(stats.size(), 6u);
      EXPECT_EQ(stats.at("tp").calls, 1);
      EXPECT_EQ(stats.at("dp").calls, 1);
      EXPECT_EQ(stats.at("pp").calls, shape.pp > 1 ? 3 : 1);
      EXPECT_EQ(stats.at("world").calls, 0);
      mesh.reset_stats();
      EXPECT_EQ(mesh.stats().at("pp").calls, 0);
    }
  }
}

TEST(Mesh, CoordinatesRoundTrip) {
  for (MeshShape s :
       {MeshShape{2, 2, 2}, MeshShape{4, 1, 2}, MeshShape{1, 3, 2}, MeshShape{3, 2, 1}}) {
    for (int r = 0; r < s.world(); ++r) EXPECT_EQ(Mesh::rank_of(Mesh::coordinates(r, s), s), r);
  }
  const MeshCoord c = Mesh::coordinates(5, MeshShape{2, 2, 2});  // 5 = 1 + 2·(0 + 2·1)
  EXPECT_EQ(c.tp, 1);
  EXPECT_EQ(c.dp, 0);
  EXPECT_EQ(c.pp, 1);
}

// ------------------------------------------------------------------------------- stats

// Bytes follow the ring convention exactly (hand-written here, independent of
// comm_bytes), calls count each call, times are non-negative.
TEST(Stats, BytesMatchRingFormulas) {
  Group& w = test_world();
  const int N = w.size(), R = w.rank();
  const size_t n = 1001;
  std::vector<float> a(n * N, 1.f), b(n * N, 0.f);
  std::vector<double> d(n, 1.0);
  auto check = [&](const char* what, int64_t want_bytes, auto&& call) {
    w.reset_stats();
    call();
    const AxisStats& s = w.stats();
    EXPECT_EQ(s.bytes, want_bytes) << what;
    EXPECT_EQ(s.calls, 1) << what;
    EXPECT_GE(s.busy_s, 0.0) << what;
    EXPECT_GE(s.wait_s, 0.0) << what;
  };
  const int64_t ring_all_reduce_elems = std::llround(2.0 * (N - 1) * static_cast<double>(n) / N);
  check("all_reduce", 4 * ring_all_reduce_elems, [&] { w.all_reduce(a.data(), n); });
  check("all_reduce_f64", 8 * ring_all_reduce_elems,
        [&] { w.all_reduce_f64(d.data(), n, ReduceOp::kSum); });
  check("reduce_scatter", int64_t{4} * (N - 1) * n,
        [&] { w.reduce_scatter(a.data(), b.data(), n); });
  check("all_gather", int64_t{4} * (N - 1) * n, [&] { w.all_gather(a.data(), b.data(), n); });
  check("broadcast", N == 1 ? 0 : int64_t{4} * n, [&] { w.broadcast(a.data(), n, 0); });
  check("all_to_all", int64_t{4} * (N - 1) * n, [&] { w.all_to_all(a.data(), b.data(), n); });
  check("barrier", 0, [&] { w.barrier(); });
  if (N >= 2) {
    const int next = (R + 1) % N, prev = (R + N - 1) % N;
    w.reset_stats();
    RequestPtr s = w.isend(a.data(), n, next, 1);
    EXPECT_EQ(w.stats().bytes, int64_t{4} * n);  // send: n
    RequestPtr r = w.irecv(b.data(), n, prev, 1);
    EXPECT_EQ(w.stats().bytes, int64_t{4} * n);  // recv: 0
    r->wait();
    s->wait();
    EXPECT_EQ(w.stats().calls, 2);
  }
  // Odd n where 2·n·(N−1)/N is not whole: rounded to the nearest element.
  w.reset_stats();
  w.all_reduce(a.data(), 7);
  EXPECT_EQ(w.stats().bytes, 4 * std::llround(2.0 * (N - 1) * 7.0 / N));
  // Accumulation over calls.
  w.reset_stats();
  for (int k = 0; k < 3; ++k) w.all_gather(a.data(), b.data(), n);
  EXPECT_EQ(w.stats().bytes, int64_t{3} * 4 * (N - 1) * n);
  EXPECT_EQ(w.stats().calls, 3);
  // The backend's shared formula agrees.
  EXPECT_EQ(meshtrain::comm::comm_bytes(meshtrain::comm::CommOp::kAllReduce, n, N, 4),
            4 * ring_all_reduce_elems);
}

TEST(Stats, BusyAndWaitTimes) {
  Group& w = test_world();
  const size_t n = size_t{1} << 20;
  std::vector<float> buf(n, 1.f);
  w.reset_stats();
  w.all_reduce(buf.data(), n);
  if (w.size() > 1) {
    EXPECT_GT(w.stats().busy_s, 0.0);
    EXPECT_GT(w.stats().wait_s, 0.0);
  }
  // A request seen complete by done() adds no wait time.
  w.reset_stats();
  RequestPtr req = w.iall_reduce(buf.data(), n, ReduceOp::kSum);
  while (!req->done()) std::this_thread::sleep_for(std::chrono::microseconds(200));
  req->wait();
  if (w.size() > 1) {
    EXPECT_EQ(w.stats().wait_s, 0.0);  // SelfGroup counts its (empty) work
  }
  EXPECT_GE(w.stats().busy_s, 0.0);
}

// ---------------------------------------------------------------------------- watchdog

// Run only by tests/mpi/expect_watchdog.sh (MESHTRAIN_WATCHDOG_TEST=1, 2 ranks): rank 1
// never joins the all_reduce; rank 0's 2 s timeout must abort the whole job.
TEST(Watchdog, AllReduceTimeoutAbortsJob) {
  if (std::getenv("MESHTRAIN_WATCHDOG_TEST") == nullptr)
    GTEST_SKIP() << "run by expect_watchdog.sh";
  Group& w = test_world();
  if (w.size() < 2) GTEST_SKIP() << "needs 2 ranks";
  meshtrain::comm::set_current_step(42);
  if (w.rank() == 1) {
    std::this_thread::sleep_for(std::chrono::seconds(60));
    ADD_FAILURE() << "rank 1 was not ended by rank 0's watchdog";
    std::exit(3);
  }
  if (w.rank() == 0) meshtrain::comm::set_comm_timeout(2);
  std::vector<float> x(16, 1.f);
  w.all_reduce(x.data(), x.size());
  ADD_FAILURE() << "the all_reduce finished without rank 1";
  std::exit(3);
}
