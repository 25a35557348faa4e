#include "cli/batch_loop.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <string>

#include "comm/strings.h"

namespace meshtrain::cli {

namespace {

using nlohmann::json;

// What a follower needs to run a member as rank 0 does: its key, its prompt's tokens and
// the request's settings (the text is not needed: only rank 0 answers).
json member_plan(uint64_t key, const CompletionBatch::Member& m) {
  const CompletionRequest& r = m.request;
  return {{"key", key},
          {"tokens", m.completion->prompt_tokens},
          {"max_tokens", r.max_tokens},
          {"temperature", r.sampling.temperature},
          {"top_k", r.sampling.top_k},
          {"top_p", r.sampling.top_p},
          {"seed", r.seed},
          {"stop", r.stop},
          {"logprobs", r.logprobs}};
}

CompletionRequest request_of(const json& j) {
  CompletionRequest r;
  r.max_tokens = j["max_tokens"];
  r.sampling = {j["temperature"].get<float>(), j["top_k"].get<int>(), j["top_p"].get<float>()};
  r.seed = j["seed"];
  r.stop = j["stop"].get<std::vector<std::string>>();
  r.logprobs = j["logprobs"];
  return r;
}

}  // namespace

BatchLoop::BatchLoop(const model::Gpt& gpt, const data::Tokenizer& tok, int max_batch, int threads,
                     infer::DecodeGroups groups, comm::Group* world)
    : batch_(gpt, tok, groups), max_batch_(max_batch), world_(world), thread_([this, threads] { run(threads); }) {}

BatchLoop::~BatchLoop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_one();
  thread_.join();
}

void BatchLoop::submit(std::vector<CompletionBatch::Member> members) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& m : members) waiting_.push_back(std::move(m));
  }
  wake_.notify_one();
}

json BatchLoop::stats() {
  std::lock_guard<std::mutex> lock(mu_);
  return {{"max_batch", max_batch_}, {"running", running_}, {"waiting", waiting_.size()},
          {"joined", joined_},      {"steps", steps_},     {"largest_batch", largest_},
          {"busy_seconds", busy_s_}};
}

void BatchLoop::join(Joining j) {
  Tracked t{std::move(j.member.abandoned), std::make_shared<bool>(false)};
  j.member.abandoned = [leave = t.leave] { return *leave; };
  j.member.on_done = [this, key = j.key, done = std::move(j.member.on_done)] {
    tracked_.erase(key);
    if (done) done();
  };
  tracked_[j.key] = std::move(t);
  batch_.join(std::move(j.member));
}

void BatchLoop::run(int threads) {
  if (threads > 0) omp_set_num_threads(threads);  // this thread's own setting
  for (;;) {
    std::vector<Joining> joining;
    json leaving = json::array();
    bool stop = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stopping_ || !waiting_.empty() || batch_.size() > 0; });
      stop = stopping_ && waiting_.empty() && batch_.size() == 0;
      for (auto& [key, t] : tracked_)
        if (!*t.leave && t.gone && t.gone()) *t.leave = true, leaving.push_back(key);
      while (!stop && !waiting_.empty() && batch_.size() + (int)joining.size() < max_batch_) {
        joining.push_back({next_key_++, std::move(waiting_.front())});
        waiting_.pop_front();
        joined_++;
      }
      running_ = batch_.size() + (int)joining.size();
      largest_ = std::max(largest_, running_);
      if (running_ > 0) steps_++;
    }
    if (world_) {
      json plan = {{"stop", stop}, {"leave", leaving}, {"join", json::array()}};
      for (const Joining& j : joining) plan["join"].push_back(member_plan(j.key, j.member));
      comm::broadcast_string(*world_, plan.dump(), 0);
    }
    if (stop) return;
    const auto start = std::chrono::steady_clock::now();
    for (Joining& j : joining) join(std::move(j));
    batch_.step();
    std::lock_guard<std::mutex> lock(mu_);
    running_ = batch_.size();
    busy_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
}

void follow_batch_loop(const model::Gpt& gpt, const data::Tokenizer& tok, infer::DecodeGroups groups,
                       comm::Group& world) {
  CompletionBatch batch(gpt, tok, groups);
  struct Follower {
    Completion completion;
    bool leave = false;
  };
  std::map<uint64_t, std::unique_ptr<Follower>> members;
  for (;;) {
    const json plan = json::parse(comm::broadcast_string(world, "", 0));
    if (plan["stop"].get<bool>()) return;
    for (const json& key : plan["leave"]) members.at(key.get<uint64_t>())->leave = true;
    for (const json& j : plan["join"]) {
      const uint64_t key = j["key"];
      auto f = std::make_unique<Follower>();
      f->completion.prompt_tokens = j["tokens"].get<std::vector<int>>();
      CompletionBatch::Member m{request_of(j), &f->completion, nullptr, [&members, key] { members.erase(key); },
                                [leave = &f->leave] { return *leave; }};
      members[key] = std::move(f);
      batch.join(std::move(m));
    }
    batch.step();
  }
}

}  // namespace meshtrain::cli
