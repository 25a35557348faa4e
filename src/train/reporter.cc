#include "train/reporter.h"

namespace meshtrain::train {

void Reporter::own(std::unique_ptr<RunSubscriber> subscriber) {
  subscribe(subscriber.get());
  owned_.push_back(std::move(subscriber));
}

void Reporter::start(const StartReport& r) {
  for (RunSubscriber* s : subscribers_) s->on_start(r);
}

void Reporter::step_begin(int64_t step) {
  for (RunSubscriber* s : subscribers_) s->on_step_begin(step);
}

void Reporter::step_end(int64_t step) {
  for (RunSubscriber* s : subscribers_) s->on_step_end(step);
}

void Reporter::note(const std::string& line) {
  for (RunSubscriber* s : subscribers_) s->on_note(line);
}

void Reporter::step(const StepReport& r) {
  // Every subscriber hears the step, also after one of them asked to stop.
  for (RunSubscriber* s : subscribers_)
    if (s->on_step(r) == Reply::kStop) stop_requested_ = true;
}

void Reporter::eval(const EvalReport& r) {
  for (RunSubscriber* s : subscribers_) s->on_eval(r);
}

Status Reporter::finish() {
  for (RunSubscriber* s : subscribers_) RETURN_IF_ERROR(s->on_finish());
  return Status::ok();
}

void Reporter::end(const EndReport& r) {
  for (RunSubscriber* s : subscribers_) s->on_end(r);
}

}  // namespace meshtrain::train
