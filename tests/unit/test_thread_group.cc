// The thread-backed Group (comm/thread_group.h): every collective on 1-4 in-process ranks
// against its definition, bit-identical results on every rank, non-blocking calls waited
// for out of order, point-to-point in FIFO order, split by color and key, and the byte
// accounting of comm_bytes.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "comm/self_group.h"
#include "comm/strings.h"
#include "comm/thread_group.h"

namespace meshtrain::comm::test_thread_group {
namespace {

// A value only rank r holds at index i: sums and maxima are then easy to predict exactly.
float value(int r, size_t i) { return 0.25f * (float)(r + 1) + (float)i; }

// all_to_allv on 1-4 ranks: rank r sends (r + j) % 3 elements to rank j (some empty); the
// bytes counted are the elements sent to other ranks.
TEST(ThreadGroup, AllToAllVMovesVariableBlocks) {
  for (int N : {1, 2, 3, 4}) {
    SCOPED_TRACE(N);
    ThreadWorld world(N);
    run_ranks(N, [&](int r) {
      auto g = world.group(r, "ep");
      std::vector<size_t> sc(N), rc(N);
      std::vector<float> send, expected;
      size_t others = 0;
      for (int j = 0; j < N; j++) {
        sc[j] = (size_t)((r + j) % 3), rc[j] = (size_t)((j + r) % 3);
        others += j == r ? 0 : sc[j];
        for (size_t i = 0; i < sc[j]; i++) send.push_back((float)(r * 1000 + j * 10 + i));
        for (size_t i = 0; i < rc[j]; i++) expected.push_back((float)(j * 1000 + r * 10 + i));
      }
      std::vector<float> recv(expected.size() + 1, -1.0f);
      g->all_to_allv(send.data(), sc.data(), recv.data(), rc.data());
      for (size_t k = 0; k < expected.size(); k++) EXPECT_EQ(recv[k], expected[k]) << "rank " << r << " at " << k;
      EXPECT_EQ(recv.back(), -1.0f);
      EXPECT_EQ(g->stats().bytes, (int64_t)(others * sizeof(float)));
    });
  }
}

TEST(ThreadGroup, CollectivesMatchTheirDefinitions) {
  for (int N : {1, 2, 3, 4}) {
    SCOPED_TRACE(N);
    ThreadWorld world(N);
    const size_t n = 5;
    std::vector<std::vector<float>> sums(N), scattered(N), gathered(N), broadcast(N), exchanged(N);
    std::vector<double> f64(N);
    run_ranks(N, [&](int r) {
      auto g = world.group(r, "dp");
      EXPECT_EQ(g->rank(), r);
      EXPECT_EQ(g->size(), N);
      std::vector<float> buf(n);
      for (size_t i = 0; i < n; i++) buf[i] = value(r, i);
      g->all_reduce(buf.data(), n);
      sums[r] = buf;
      std::vector<float> send(N * n), recv(n);
      for (size_t i = 0; i < send.size(); i++) send[i] = value(r, i);
      g->reduce_scatter(send.data(), recv.data(), n, ReduceOp::kMax);
      scattered[r] = recv;
      std::vector<float> all(N * n);
      std::vector<float> mine(n, (float)r);
      g->all_gather(mine.data(), all.data(), n);
      gathered[r] = all;
      std::vector<float> b(n, r == N - 1 ? 7.5f : -1.0f);
      g->broadcast(b.data(), n, N - 1);
      broadcast[r] = b;
      std::vector<float> to(N * n), from(N * n);
      for (int j = 0; j < N; j++)
        for (size_t i = 0; i < n; i++) to[j * n + i] = (float)(100 * r + j);
      g->all_to_all(to.data(), from.data(), n);
      exchanged[r] = from;
      double d = 0.1 * (r + 1);
      g->all_reduce_f64(&d, 1, ReduceOp::kSum);
      f64[r] = d;
      g->barrier();
    });
    for (int r = 0; r < N; r++) {
      for (size_t i = 0; i < n; i++) {
        float want = value(0, i);
        for (int k = 1; k < N; k++) want += value(k, i);  // rank order, as the group sums
        EXPECT_EQ(sums[r][i], want);
        EXPECT_EQ(scattered[r][i], value(N - 1, r * n + i));  // the max is the last rank's
        EXPECT_EQ(broadcast[r][i], 7.5f);
        for (int j = 0; j < N; j++) {
          EXPECT_EQ(gathered[r][j * n + i], (float)j);
          EXPECT_EQ(exchanged[r][j * n + i], (float)(100 * j + r));
        }
      }
      EXPECT_EQ(std::memcmp(sums[r].data(), sums[0].data(), n * sizeof(float)), 0);  // bitwise alike
      double want = 0;
      for (int k = 0; k < N; k++) want += 0.1 * (k + 1);
      EXPECT_EQ(f64[r], want);
    }
  }
}

// A non-blocking call copies its input when it is made: two in-place all-reduces waited for
// in the opposite order on one rank still pair by call order, and the 16-bit all-gather is a
// bit-exact copy.
TEST(ThreadGroup, NonBlockingCallsMatchByCallOrder) {
  ThreadWorld world(3);
  std::vector<std::vector<float>> a(3), b(3);
  std::vector<std::vector<uint16_t>> h(3);
  run_ranks(3, [&](int r) {
    auto g = world.group(r);
    std::vector<float> x(4, 1.0f + r), y(4, 10.0f * (r + 1));
    std::vector<uint16_t> word = {(uint16_t)(0x7C00 + r)}, words(3);
    RequestPtr rx = g->iall_reduce(x.data(), 4, ReduceOp::kSum);
    RequestPtr ry = g->iall_reduce(y.data(), 4, ReduceOp::kSum);
    RequestPtr rh = g->iall_gather(word.data(), words.data(), 1);
    if (r == 1) ry->wait(), rx->wait();
    else rx->wait(), ry->wait();
    rh->wait();
    EXPECT_TRUE(rx->done());
    a[r] = x, b[r] = y, h[r] = words;
  });
  for (int r = 0; r < 3; r++) {
    EXPECT_EQ(a[r], std::vector<float>(4, 6.0f));
    EXPECT_EQ(b[r], std::vector<float>(4, 60.0f));
    EXPECT_EQ(h[r], (std::vector<uint16_t>{0x7C00, 0x7C01, 0x7C02}));
  }
}

// send/recv: around a ring, and two messages on one tag in the order sent.
TEST(ThreadGroup, PointToPointIsFifoPerTag) {
  const int N = 4;
  ThreadWorld world(N);
  std::vector<std::vector<float>> got(N);
  run_ranks(N, [&](int r) {
    auto g = world.group(r, "pp");
    const int next = (r + 1) % N, prev = (r + N - 1) % N;
    std::vector<float> first(3, (float)r), second(3, (float)(10 + r)), in1(3), in2(3);
    RequestPtr s1 = g->isend(first.data(), 3, next, 7);
    RequestPtr s2 = g->isend(second.data(), 3, next, 7);
    g->recv(in1.data(), 3, prev, 7);
    g->recv(in2.data(), 3, prev, 7);
    s1->wait(), s2->wait();
    got[r] = {in1[0], in2[0]};
  });
  for (int r = 0; r < N; r++) EXPECT_EQ(got[r], (std::vector<float>{(float)((r + N - 1) % N), (float)(10 + (r + N - 1) % N)}));
}

// split: ranks of one color in key order, a collective inside each sub-group.
TEST(ThreadGroup, SplitGroupsByColorInKeyOrder) {
  const int N = 4;
  ThreadWorld world(N);
  std::vector<int> sub_rank(N), sub_size(N);
  std::vector<float> sums(N);
  run_ranks(N, [&](int r) {
    auto g = world.group(r);
    // Colors: even and odd ranks; keys reversed, so the highest rank comes first.
    std::unique_ptr<Group> s = g->split(r % 2, -r, "tp");
    EXPECT_EQ(s->axis(), "tp");
    sub_rank[r] = s->rank(), sub_size[r] = s->size();
    float x = (float)r;
    s->all_reduce(&x, 1);
    sums[r] = x;
    g->barrier();  // the parent group still works after a split
  });
  EXPECT_EQ(sub_size, (std::vector<int>{2, 2, 2, 2}));
  EXPECT_EQ(sub_rank, (std::vector<int>{1, 1, 0, 0}));
  EXPECT_EQ(sums, (std::vector<float>{2, 4, 2, 4}));
}

// Bytes as comm_bytes counts them, as the MPI backend does.
TEST(ThreadGroup, StatsFollowTheByteConvention) {
  ThreadWorld world(4);
  std::vector<AxisStats> stats(4);
  run_ranks(4, [&](int r) {
    auto g = world.group(r);
    std::vector<float> buf(100), big(400);
    g->all_reduce(buf.data(), 100);
    g->reduce_scatter(big.data(), buf.data(), 100);
    stats[r] = g->stats();
  });
  for (const AxisStats& s : stats) {
    EXPECT_EQ(s.calls, 2);
    EXPECT_EQ(s.bytes, comm_bytes(CommOp::kAllReduce, 100, 4, 4) + comm_bytes(CommOp::kReduceScatter, 100, 4, 4));
  }
}

}  // namespace
}  // namespace meshtrain::comm::test_thread_group

namespace meshtrain::comm::test_thread_group_strings {
namespace {

// Text between ranks: a broadcast of the root's string (empty, and with a zero byte and an
// odd length), and every rank's string of its own length gathered in rank order.
TEST(GroupStrings, BroadcastAndGatherKeepEveryByte) {
  ThreadWorld world(3);
  std::vector<std::vector<std::string>> got(3);
  run_ranks(3, [&](int r) {
    auto g = world.group(r);
    for (const std::string& text : {std::string(), std::string("a\0b\xff", 4) + "cd", std::string(1001, 'x')})
      got[r].push_back(broadcast_string(*g, r == 1 ? text : "ignored", 1));
    for (const std::string& s : gather_strings(*g, std::string(r * 2, char('a' + r)))) got[r].push_back(s);
  });
  for (int r = 0; r < 3; r++) {
    ASSERT_EQ(got[r].size(), 6u);
    EXPECT_EQ(got[r][0], "");
    EXPECT_EQ(got[r][1], std::string("a\0b\xff", 4) + "cd");
    EXPECT_EQ(got[r][2], std::string(1001, 'x'));
    EXPECT_EQ(got[r][3], "");
    EXPECT_EQ(got[r][4], "bb");
    EXPECT_EQ(got[r][5], "cccc");
  }
}

}  // namespace
}  // namespace meshtrain::comm::test_thread_group_strings
