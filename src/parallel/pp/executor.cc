#include "parallel/pp/executor.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>

#include "core/check.h"
#include "trace/trace.h"

namespace meshtrain::parallel::pp {

namespace {

bool is_compute(ActionKind k) {
  return k == ActionKind::kForward || k == ActionKind::kBackward || k == ActionKind::kBackwardWeight;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

std::string span_name(char pass, int mb, int chunk, int v) {
  std::string name(1, pass);
  name += std::to_string(mb);
  if (v > 1) name.append(1, '.').append(std::to_string(chunk));
  return name;
}

PipelineExecutor::PipelineExecutor(model::Gpt& gpt, comm::Group& pp, ScheduleKind kind,
                                   int virtual_stages, comm::Group* everyone)
    : gpt_(gpt), pp_(pp), everyone_(everyone ? everyone : &pp), kind_(kind), v_(virtual_stages) {
  CHECK_MSG(gpt.num_chunks() == v_, "the model part must hold one chunk per virtual stage");
}

// Receives of one (kind, peer) pair arrive in the order the schedule lists them, so one tag
// per direction keeps them apart; the key records which micro-batch a buffer is for.
void PipelineExecutor::post_receive(const Action& a, int id, size_t n) {
  const Kind kind = a.kind == ActionKind::kRecvActivation ? kActivation : kGrad;
  Inbox& box = inbox_[{kind, id, a.chunk}];
  box.data.allocate(MemCategory::kComm, n);
  box.request = pp_.irecv(box.data.data(), n, a.peer, 1 + kind);
}

const float* PipelineExecutor::take(Kind kind, int mb, int chunk) {
  auto it = inbox_.find({kind, mb, chunk});
  CHECK_MSG(it != inbox_.end(), "pipeline: a stage input was never received");
  if (it->second.request) it->second.request->wait();  // none: handed over on this rank
  received_ = std::move(it->second.data);
  inbox_.erase(it);
  return received_.data();
}

// The chunk of this rank that runs `stage`, or -1.
int PipelineExecutor::chunk_of(int stage) const {
  for (int c = 0; c < v_; c++)
    if (stage_of(kind_, pp_.size(), v_, pp_.rank(), c) == stage) return c;
  return -1;
}

// A tensor for the next or previous stage when this rank runs it too (ZB-V's turn on the
// last rank): no message, a copy in the inbox, since the source is overwritten or freed.
void PipelineExecutor::hand_over(Kind kind, int mb, int from_chunk, const float* data, size_t n) {
  const int stage = stage_of(kind_, pp_.size(), v_, pp_.rank(), from_chunk);
  const int to = chunk_of(kind == kActivation ? stage + 1 : stage - 1);
  if (to < 0) return;
  Inbox& box = inbox_[{kind, mb, to}];
  box.data.allocate(MemCategory::kComm, n);
  std::memcpy(box.data.data(), data, sizeof(float) * n);
}

void PipelineExecutor::send(Kind kind, int mb, int chunk, const float* data, size_t n, int peer,
                            bool copy) {
  Outgoing out;
  out.key = {kind, mb, chunk};
  if (copy) {
    out.copy.allocate(MemCategory::kComm, n);
    std::memcpy(out.copy.data(), data, sizeof(float) * n);
    data = out.copy.data();
  }
  out.request = pp_.isend(data, n, peer, 1 + kind);
  outgoing_.push_back(std::move(out));
}

// Retires finished sends (all of them, waiting, when `all`).
void PipelineExecutor::wait_sends(bool all) {
  auto done = [&](Outgoing& o) {
    if (all) o.request->wait();
    return all || o.request->done();
  };
  outgoing_.erase(std::remove_if(outgoing_.begin(), outgoing_.end(), done), outgoing_.end());
}

int PipelineExecutor::set_id(int mb, int m, int64_t step) const {
  if (!never_flushes(kind_)) return mb;
  return (int)((step + mb / m) % 2) * m + mb % m;
}

namespace {

// Traces number a pass as the list does (2bw: the next step's micro-batches m..), in the step
// whose list ran it, so a timeline shows what each step's window held.
nlohmann::json where_in_step(const Action& a, int64_t step) {
  return nlohmann::json{{"step", step + 1}, {"mb", a.microbatch}, {"chunk", a.chunk}};
}

}  // namespace

// A compute action's micro-batch: its id in sets and messages, its index in this step's data,
// and whether it is the next step's (2bw: the list's micro-batches m..).
struct PipelineExecutor::Pass {
  int id, mb;
  bool next;
  int64_t mb_step;
};

void PipelineExecutor::run_forward(const Action& a, const Pass& pass, StepState& s) {
  const int c = a.chunk;
  // The first stage embeds the tokens, the last scores the targets; under a document mask
  // every stage places its rows in their documents.
  if (gpt_.is_first_stage(c) || gpt_.is_last_stage(c) || gpt_.document_mask())
    (pass.next ? s.data.fill_next : s.data.fill)(pass.mb, s.inputs.data(), s.targets.data());
  gpt_.set_batch_position(pass.mb_step, s.data.first_token_row(pass.mb));
  const float* in = gpt_.is_first_stage(c) ? nullptr : take(kActivation, pass.id, c);
  const double t0 = now_s();
  float loss;
  {
    trace::Tracer::Span span(trace::Lane::kCompute, span_name('F', a.microbatch, c, v_), trace::category::kForward,
                             where_in_step(a, s.step));
    loss = gpt_.forward_chunk(c, pass.id, s.inputs.data(), s.targets.data(), in, s.B, s.T);
  }
  times_.compute_s += now_s() - t0;
  times_.forward_s[c] += now_s() - t0;
  times_.carried += pass.next;
  if (gpt_.is_last_stage(c)) s.loss_sum += (double)loss * s.B * s.T;  // never a next step's: w = 0 there
  else hand_over(kActivation, pass.id, c, gpt_.chunk_output(c, pass.id), s.n);
  times_.peak_sets = std::max(times_.peak_sets, gpt_.pipeline().sets().in_flight());
}

void PipelineExecutor::run_backward(const Action& a, const Pass& pass, StepState& s) {
  const int c = a.chunk;
  // The activation sent from this set must be out before the set is reused.
  for (auto& o : outgoing_)
    if (o.key == Key{kActivation, pass.id, c}) o.request->wait();
  const float* dout = gpt_.is_last_stage(c) ? nullptr : take(kGrad, pass.id, c);
  const double t0 = now_s();
  {
    trace::Tracer::Span span(trace::Lane::kCompute, span_name('B', a.microbatch, c, v_), trace::category::kBackward,
                             where_in_step(a, s.step));
    gpt_.backward_chunk(c, pass.id, dout, s.loss_scale, s.split);
  }
  times_.compute_s += now_s() - t0;
  times_.backward_s[c] += now_s() - t0;
  if (!gpt_.is_first_stage(c)) hand_over(kGrad, pass.id, c, gpt_.input_grad(), s.n);
  if (!s.split) s.grads.end_micro_batch();
}

// A zero-bubble schedule's W: the B's weight gradients.
void PipelineExecutor::run_weight(const Action& a, const Pass& pass, StepState& s) {
  const double t0 = now_s();
  {
    trace::Tracer::Span span(trace::Lane::kCompute, span_name('W', a.microbatch, a.chunk, v_),
                             trace::category::kBackwardWeight, where_in_step(a, s.step));
    gpt_.pipeline().weight_pass(a.chunk, pass.id, *gpt_.param_store());
  }
  times_.compute_s += now_s() - t0;
  times_.weight_s[a.chunk] += now_s() - t0;
  s.grads.end_micro_batch();
}

void PipelineExecutor::run_action(const Action& a, StepState& s) {
  // 2bw: the list's micro-batches m.. are the next step's, computed with the current
  // weights; the step's own compute with the version before the last update.
  const bool next = a.microbatch >= s.m;
  const Pass pass{set_id(a.microbatch, s.m, s.step), a.microbatch % s.m, next, s.step + (next ? 1 : 0)};
  if (never_flushes(kind_) && is_compute(a.kind))
    gpt_.param_store()->use_weights(next ? model::WeightVersion::kCurrent : model::WeightVersion::kPrevious);
  switch (a.kind) {
    case ActionKind::kRecvActivation:
    case ActionKind::kRecvGrad:
      break;  // posted ahead; waited for by the compute that needs it
    case ActionKind::kForward:
      run_forward(a, pass, s);
      break;
    case ActionKind::kSendActivation:
      // The output stays in the micro-batch's activation set until its backward.
      send(kActivation, pass.id, a.chunk, gpt_.chunk_output(a.chunk, pass.id), s.n, a.peer, false);
      break;
    case ActionKind::kBackward:
      run_backward(a, pass, s);
      break;
    case ActionKind::kBackwardWeight:
      run_weight(a, pass, s);
      break;
    case ActionKind::kSendGrad:
      send(kGrad, pass.id, a.chunk, gpt_.input_grad(), s.n, a.peer, true);
      break;
  }
}

// After the list: the carried sends, the loss on every pipeline rank (waiting for the
// slowest closes the window in which this rank's idle time, the bubble, is counted), and
// the stage costs the zero-bubble schedules place their Ws by.
void PipelineExecutor::finish_step(int m, double start, double* loss_sum) {
  if (never_flushes(kind_)) gpt_.param_store()->use_weights(model::WeightVersion::kCurrent);
  // 2bw: the carried forwards' activations reach the next rank in the next step's list.
  carrying_ = times_.carried > 0;
  wait_sends(!carrying_);
  received_.release();
  pp_.all_reduce_f64(loss_sum, 1, comm::ReduceOp::kSum);
  times_.window_s = now_s() - start;
  share_stage_costs(m);
  if (splits_backward(kind_)) {
    last_costs_ = times_.stages;
    measured_ = true;
    for (size_t s = 0; s < last_costs_.forward.size(); s++)
      measured_ = measured_ && last_costs_.forward[s] > 0 && last_costs_.backward[s] > 0;
  }
}

double PipelineExecutor::train_step(int m, int B, int T, int64_t step, const MicroBatches& data,
                                    float loss_scale, GradSync& grads) {
  std::vector<Action> actions;
  const bool two_bw = never_flushes(kind_);
  const StepInRun where{!carrying_, !(two_bw && data.fill_next)};
  const Status made = make_schedule(kind_, pp_.size(), m, v_, pp_.rank(), &actions,
                                    splits_backward(kind_) && measured_ ? &last_costs_ : nullptr, where);
  CHECK_MSG(made.is_ok(), "pipeline schedule arguments were not validated");
  StepState s{m, B, T, step, data, loss_scale, grads, gpt_.boundary_elements(B, T), splits_backward(kind_),
              std::vector<int>((size_t)B * T), std::vector<int>((size_t)B * T), 0.0};
  times_ = PipelineTimes{};
  times_.forward_s.assign(v_, 0.0), times_.backward_s.assign(v_, 0.0), times_.weight_s.assign(v_, 0.0);
  gpt_.pipeline().tied_head().set_last_micro_batch(set_id(m - 1, m, step));
  const double start = now_s();
  size_t posted = 0;  // actions up to here have had their receives posted
  for (size_t i = 0; i < actions.size(); i++) {
    // Post the receives of the next two compute actions ahead of time.
    for (int computes = 0; posted < actions.size(); posted++) {
      const Action& a = actions[posted];
      if (is_compute(a.kind) && posted > i && ++computes > 2) break;
      if (a.kind == ActionKind::kRecvActivation || a.kind == ActionKind::kRecvGrad)
        post_receive(a, set_id(a.microbatch, m, step), s.n);
    }
    run_action(actions[i], s);
    wait_sends(false);
  }
  finish_step(m, start, &s.loss_sum);
  return s.loss_sum;
}

void PipelineExecutor::share_stage_costs(int m) {
  const int p = pp_.size(), S = p * v_;
  std::vector<double> sums(3 * (size_t)S, 0.0);  // this rank's stages; summed over the ranks
  for (int c = 0; c < v_; c++) {
    const int s = stage_of(kind_, p, v_, pp_.rank(), c);
    sums[s] = times_.forward_s[c] / m, sums[S + s] = times_.backward_s[c] / m, sums[2 * S + s] = times_.weight_s[c] / m;
  }
  // Summed over every rank (each stage once per pipeline group), averaged over the pipeline
  // groups, and rank 0's copy sent to all: every rank of the job places its Ws from the
  // very same numbers, so the stages' tp and dp peers run the same lists.
  everyone_->all_reduce_f64(sums.data(), sums.size(), comm::ReduceOp::kSum);
  const double groups = (double)everyone_->size() / p;
  std::vector<float> same(sums.size());
  for (size_t i = 0; i < sums.size(); i++) same[i] = (float)(sums[i] / groups);
  everyone_->broadcast(same.data(), same.size(), 0);
  auto part = [&](int k) { return std::vector<double>(same.begin() + (size_t)k * S, same.begin() + (size_t)(k + 1) * S); };
  times_.stages = {part(0), part(1), part(2)};
}

double PipelineExecutor::forward_only(const int* inputs, const int* targets, int B, int T) {
  // Its own set id and message tag: under 2bw, activations of the next step's first
  // micro-batches are in flight between the ranks (their sets kept, their messages maybe
  // not yet received).
  constexpr int kEvalSet = 1 << 30, kEvalTag = 3;
  const int p = pp_.size(), r = pp_.rank();
  const size_t n = gpt_.boundary_elements(B, T);
  Buffer<float> in(MemCategory::kComm, n);
  double loss = 0;
  for (int c = 0; c < v_; c++) {  // a rank's chunks run in stage order
    const int stage = stage_of(kind_, p, v_, r, c);
    const int prev = stage > 0 ? rank_of_stage(kind_, p, v_, stage - 1) : -1;
    const int next = stage + 1 < p * v_ ? rank_of_stage(kind_, p, v_, stage + 1) : -1;
    if (prev >= 0 && prev != r) pp_.recv(in.data(), n, prev, kEvalTag);  // else in `in` already
    const float l = gpt_.forward_chunk(c, kEvalSet, inputs, targets, in.data(), B, T);
    if (gpt_.is_last_stage(c)) loss = l;
    if (next >= 0 && next != r) pp_.send(gpt_.chunk_output(c, kEvalSet), n, next, kEvalTag);
    if (next == r) std::memcpy(in.data(), gpt_.chunk_output(c, kEvalSet), sizeof(float) * n);
    gpt_.pipeline().sets().release(c, kEvalSet);
  }
  pp_.all_reduce_f64(&loss, 1, comm::ReduceOp::kSum);
  return loss;
}

}  // namespace meshtrain::parallel::pp
