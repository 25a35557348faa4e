#include "comm/thread_group.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>
#include <vector>

#include "core/check.h"
#include "comm/self_group.h"

namespace meshtrain::comm {

// One collective call, as the ranks post it: each rank's copied input, then each rank's
// completion. Freed when every rank has completed.
struct Call {
  CommOp op = CommOp::kBarrier;
  std::vector<std::vector<char>> inputs;  // per rank
  std::vector<int> extra;                 // per rank: root (broadcast), color/key (split)
  int posted = 0, completed = 0;
  std::shared_ptr<void> result;           // split: the sub-worlds
};

struct ThreadWorld::Shared {
  explicit Shared(int n) : size(n), next_seq(n, 0) {}
  const int size;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int64_t> next_seq;  // per rank: its next collective's position
  std::map<int64_t, Call> calls;  // by position
  std::map<std::tuple<int, int, int>, std::deque<std::vector<char>>> mail;  // (src, dst, tag)
};

namespace {

using Shared = ThreadWorld::Shared;

class ThreadRequest final : public Request {
 public:
  explicit ThreadRequest(std::function<void()> finish) : finish_(std::move(finish)) {}
  void wait() override {
    if (finish_) finish_(), finish_ = nullptr;
  }
  bool done() override { return !finish_; }

 private:
  std::function<void()> finish_;
};

class ThreadGroup final : public Group {
 public:
  ThreadGroup(std::shared_ptr<Shared> shared, int rank, std::string axis)
      : Group(std::move(axis)), shared_(std::move(shared)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return shared_->size; }

  RequestPtr iall_reduce(float* buf, size_t n, ReduceOp op) override {
    return collective(CommOp::kAllReduce, buf, n * sizeof(float), 0, n, sizeof(float), [=, this](const Call& c) {
      reduce(c, 0, n, op, buf);
    });
  }
  RequestPtr ireduce_scatter(const float* send, float* recv, size_t n, ReduceOp op) override {
    return collective(CommOp::kReduceScatter, send, size() * n * sizeof(float), 0, n, sizeof(float),
                      [=, this](const Call& c) { reduce(c, (size_t)rank_ * n, n, op, recv); });
  }
  RequestPtr iall_gather(const float* send, float* recv, size_t n) override {
    return gather(send, recv, n, sizeof(float));
  }
  RequestPtr iall_gather(const uint16_t* send, uint16_t* recv, size_t n) override {
    return gather(send, recv, n, sizeof(uint16_t));
  }
  RequestPtr iall_gather(const uint8_t* send, uint8_t* recv, size_t n) override { return gather(send, recv, n, 1); }
  RequestPtr ibroadcast(float* buf, size_t n, int root) override {
    CHECK_MSG(root >= 0 && root < size(), "broadcast root out of range");
    return collective(CommOp::kBroadcast, buf, rank_ == root ? n * sizeof(float) : 0, root, n, sizeof(float),
                      [=, this](const Call& c) {
                        if (rank_ != root) std::memcpy(buf, c.inputs[root].data(), n * sizeof(float));
                      });
  }
  RequestPtr iall_to_all(const float* send, float* recv, size_t n) override {
    return exchange(send, recv, n, sizeof(float));
  }
  RequestPtr iall_to_all(const uint8_t* send, uint8_t* recv, size_t n) override { return exchange(send, recv, n, 1); }
  // Each rank posts its counts then its data; a receiver finds its block in sender r's data
  // after r's blocks for the ranks before it.
  RequestPtr iall_to_allv(const float* send, const size_t* send_counts, float* recv,
                          const size_t* recv_counts) override {
    const int N = size();
    size_t total = 0, others = 0;
    for (int j = 0; j < N; j++) total += send_counts[j], others += j == rank_ ? 0 : send_counts[j];
    std::vector<char> posted(N * sizeof(size_t) + total * sizeof(float));
    std::memcpy(posted.data(), send_counts, N * sizeof(size_t));
    if (total > 0) std::memcpy(posted.data() + N * sizeof(size_t), send, total * sizeof(float));
    std::vector<size_t> want(recv_counts, recv_counts + N);
    return collective(CommOp::kAllToAllV, posted.data(), posted.size(), 0, others, sizeof(float),
                      [=, this](const Call& c) {
                        size_t at = 0;
                        for (int r = 0; r < N; r++) {
                          std::vector<size_t> counts(N);
                          std::memcpy(counts.data(), c.inputs[r].data(), N * sizeof(size_t));
                          CHECK_MSG(counts[rank_] == want[r], "all_to_allv: receive count differs from the send count");
                          size_t from = 0;
                          for (int j = 0; j < rank_; j++) from += counts[j];
                          const char* data = c.inputs[r].data() + N * sizeof(size_t) + from * sizeof(float);
                          if (want[r] > 0) std::memcpy(recv + at, data, want[r] * sizeof(float));
                          at += want[r];
                        }
                      });
  }
  RequestPtr isend(const float* buf, size_t n, int peer, int tag) override {
    CHECK_MSG(peer >= 0 && peer < size() && peer != rank_, "send to an invalid peer");
    account(CommOp::kSend, n, sizeof(float));
    std::vector<char> message((const char*)buf, (const char*)(buf + n));
    {
      std::lock_guard<std::mutex> lock(shared_->mu);
      shared_->mail[{rank_, peer, tag}].push_back(std::move(message));
    }
    shared_->cv.notify_all();
    return std::make_unique<ThreadRequest>(nullptr);
  }
  RequestPtr irecv(float* buf, size_t n, int peer, int tag) override {
    CHECK_MSG(peer >= 0 && peer < size() && peer != rank_, "recv from an invalid peer");
    account(CommOp::kRecv, n, sizeof(float));
    return std::make_unique<ThreadRequest>([=, s = shared_, me = rank_] {
      std::unique_lock<std::mutex> lock(s->mu);
      auto& queue = s->mail[{peer, me, tag}];
      s->cv.wait(lock, [&] { return !queue.empty(); });
      CHECK_MSG(queue.front().size() == n * sizeof(float), "recv of a message of another size");
      std::memcpy(buf, queue.front().data(), n * sizeof(float));
      queue.pop_front();
    });
  }
  void all_reduce_f64(double* buf, size_t n, ReduceOp op) override {
    collective(CommOp::kAllReduce, buf, n * sizeof(double), 0, n, sizeof(double), [=, this](const Call& c) {
      for (size_t i = 0; i < n; i++) {
        double v;
        std::memcpy(&v, c.inputs[0].data() + i * sizeof(double), sizeof v);
        for (int r = 1; r < size(); r++) {
          double w;
          std::memcpy(&w, c.inputs[r].data() + i * sizeof(double), sizeof w);
          v = op == ReduceOp::kSum ? v + w : std::max(v, w);
        }
        buf[i] = v;
      }
    })->wait();
  }
  void barrier() override {
    collective(CommOp::kBarrier, nullptr, 0, 0, 0, 0, [](const Call&) {})->wait();
  }
  std::unique_ptr<Group> split(int color, int key, const std::string& axis) override {
    // Post (color, key); every rank then builds, once, the sub-worlds of the colors.
    std::unique_ptr<Group> out;
    const int packed[2] = {color, key};
    collective(CommOp::kBarrier, packed, sizeof packed, 0, 0, 0, [&](const Call& c) {
      std::vector<std::pair<int, int>> members;  // (key, rank) of my color; ties by rank
      for (int r = 0; r < size(); r++) {
        int ck[2];
        std::memcpy(ck, c.inputs[r].data(), sizeof ck);
        if (ck[0] == color) members.emplace_back(ck[1], r);
      }
      std::sort(members.begin(), members.end());
      int my = 0;
      for (size_t i = 0; i < members.size(); i++)
        if (members[i].second == rank_) my = (int)i;
      auto& worlds = *std::static_pointer_cast<std::map<int, std::shared_ptr<Shared>>>(c.result);
      out = std::make_unique<ThreadGroup>(worlds.at(color), my, axis);
    }, /*split=*/true)->wait();
    return out;
  }

 private:
  void account(CommOp op, size_t n, size_t elem) {
    stats_.bytes += comm_bytes(op, n, size(), elem);
    stats_.calls += 1;
  }

  RequestPtr gather(const void* send, void* recv, size_t n, size_t elem) {
    return collective(CommOp::kAllGather, send, n * elem, 0, n, elem, [=, this](const Call& c) {
      for (int r = 0; r < size(); r++) std::memcpy((char*)recv + (size_t)r * n * elem, c.inputs[r].data(), n * elem);
    });
  }

  // Block rank() of every rank's send[size() * n] into recv, in rank order.
  RequestPtr exchange(const void* send, void* recv, size_t n, size_t elem) {
    return collective(CommOp::kAllToAll, send, size() * n * elem, 0, n, elem, [=, this](const Call& c) {
      for (int r = 0; r < size(); r++)
        std::memcpy((char*)recv + (size_t)r * n * elem, c.inputs[r].data() + (size_t)rank_ * n * elem, n * elem);
    });
  }

  // Out[i] = op over ranks (in rank order) of input[from + i], i < n.
  void reduce(const Call& c, size_t from, size_t n, ReduceOp op, float* out) const {
    for (size_t i = 0; i < n; i++) {
      float v;
      std::memcpy(&v, c.inputs[0].data() + (from + i) * sizeof(float), sizeof v);
      for (int r = 1; r < size(); r++) {
        float w;
        std::memcpy(&w, c.inputs[r].data() + (from + i) * sizeof(float), sizeof w);
        v = op == ReduceOp::kSum ? v + w : std::max(v, w);
      }
      out[i] = v;
    }
  }

  // Posts this rank's copy of `bytes` of `input` at its next position; the request's wait()
  // blocks until every rank has posted that position, then runs `finish` on the inputs.
  RequestPtr collective(CommOp op, const void* input, size_t bytes, int extra, size_t n, size_t elem,
                        std::function<void(const Call&)> finish, bool split = false) {
    account(op, n, elem);
    int64_t seq;
    {
      std::lock_guard<std::mutex> lock(shared_->mu);
      seq = shared_->next_seq[rank_]++;
      Call& c = shared_->calls[seq];
      if (c.inputs.empty()) c.op = op, c.inputs.resize(size()), c.extra.resize(size());
      CHECK_MSG(c.op == op, "ranks called different collectives at the same position");
      c.inputs[rank_].assign((const char*)input, (const char*)input + bytes);
      c.extra[rank_] = extra;
      if (++c.posted == size() && split) {  // the last to arrive builds the sub-worlds
        auto worlds = std::make_shared<std::map<int, std::shared_ptr<Shared>>>();
        std::map<int, int> counts;
        for (int r = 0; r < size(); r++) {
          int ck[2];
          std::memcpy(ck, c.inputs[r].data(), sizeof ck);
          counts[ck[0]]++;
        }
        for (auto [color, count] : counts) (*worlds)[color] = std::make_shared<Shared>(count);
        c.result = worlds;
      }
    }
    shared_->cv.notify_all();
    return std::make_unique<ThreadRequest>([=, s = shared_, total = size()] {
      std::unique_lock<std::mutex> lock(s->mu);
      Call& c = s->calls[seq];
      s->cv.wait(lock, [&] { return c.posted == total; });
      finish(c);
      if (++c.completed == total) s->calls.erase(seq);
    });
  }

  std::shared_ptr<Shared> shared_;
  int rank_;
};

}  // namespace

ThreadWorld::ThreadWorld(int size) : shared_(std::make_shared<Shared>(size)) {
  CHECK_MSG(size >= 1, "a thread world needs at least one rank");
}
ThreadWorld::~ThreadWorld() = default;
int ThreadWorld::size() const { return shared_->size; }

std::unique_ptr<Group> ThreadWorld::group(int rank, const std::string& axis) {
  CHECK_MSG(rank >= 0 && rank < shared_->size, "rank out of range");
  return std::make_unique<ThreadGroup>(shared_, rank, axis);
}

void run_ranks(int ranks, const std::function<void(int)>& body) {
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(ranks);
  for (int r = 0; r < ranks; r++)
    threads.emplace_back([&, r] {
      try {
        body(r);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace meshtrain::comm
