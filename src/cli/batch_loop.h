// Continuous batching for `serve`: one loop thread owns the model and a CompletionBatch.
// HTTP handlers submit completions; before each decode step the loop lets the waiting join,
// up to max_batch sequences, and marks those whose client went away to leave; finished ones
// leave inside the step. Its callbacks run on the loop thread.
//
// On a tensor- or pipeline-parallel model group every rank must run the same batch, so the
// loop runs on rank 0 and broadcasts each step's plan (who joins, with their prompts' tokens
// and settings; who leaves; or stop) to the other ranks, which follow it
// (follow_batch_loop), as Megatron's text generation server broadcasts its requests.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/completion.h"
#include "comm/group.h"

namespace meshtrain::cli {

class BatchLoop {
 public:
  // `world`: the model group's ranks when there are several (this is rank 0), else null.
  BatchLoop(const model::Gpt& gpt, const data::Tokenizer& tok, int max_batch, int threads,
            infer::DecodeGroups groups, comm::Group* world);
  // Finishes the completions in progress and stops, the followers with it.
  ~BatchLoop();
  // The members of one request, queued together: they join the same step when there is room.
  void submit(std::vector<CompletionBatch::Member> members);
  // What the loop has done so far (GET /stats): max_batch, running, waiting, joined, steps,
  // largest_batch, busy_seconds (time spent in decode steps).
  nlohmann::json stats();

 private:
  struct Joining {
    uint64_t key;
    CompletionBatch::Member member;
  };
  // A member in the batch: whether its client is gone (asked between steps), and the flag
  // its abandoned() reads, set only when a plan says so (the same step on every rank).
  struct Tracked {
    std::function<bool()> gone;
    std::shared_ptr<bool> leave;
  };
  void run(int threads);
  void join(Joining j);

  CompletionBatch batch_;
  const int max_batch_;
  comm::Group* world_;
  std::map<uint64_t, Tracked> tracked_;  // the loop thread's only
  uint64_t next_key_ = 0;
  std::mutex mu_;
  std::condition_variable wake_;
  std::deque<CompletionBatch::Member> waiting_;
  bool stopping_ = false;
  int running_ = 0, largest_ = 0;  // sequences in the batch: now, and at most
  int64_t joined_ = 0, steps_ = 0;
  double busy_s_ = 0;
  std::thread thread_;  // last: starts once the rest is built
};

// Ranks 1.. of the model group: runs every step rank 0's BatchLoop plans, until it stops.
void follow_batch_loop(const model::Gpt& gpt, const data::Tokenizer& tok, infer::DecodeGroups groups,
                       comm::Group& world);

}  // namespace meshtrain::cli
