#include "train/curriculum.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>


namespace meshtrain::train {

namespace {

Status bad(const std::string& what) { return Status::error(what); }

}  // namespace

Status parse_discrete_curriculum(const std::string& text, std::vector<std::pair<int, int64_t>>* out) {
  out->clear();
  const std::string hint = "--curriculum-discrete must be LENGTH:STEPS pairs, e.g. 64:100,128:200 "
                           "(length 64 for the first 100 steps, 128 until step 200, then --seq-len)";
  if (text.empty()) return bad(hint + "; it is empty");
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t comma = std::min(text.find(',', pos), text.size());
    const std::string item = text.substr(pos, comma - pos);
    const size_t colon = item.find(':');
    long long length = 0, until = 0;
    char tail = 0;
    if (colon == std::string::npos ||
        std::sscanf(item.substr(0, colon).c_str(), "%lld%c", &length, &tail) != 1 ||
        std::sscanf(item.substr(colon + 1).c_str(), "%lld%c", &until, &tail) != 1 || length < 1 || until < 1 ||
        length > (1 << 30))
      return bad(hint + "; '" + item + "' is not");
    if (!out->empty() && (length <= out->back().first || until <= out->back().second))
      return bad(hint + "; lengths and steps must both increase, '" + item + "' does not");
    out->push_back({(int)length, (int64_t)until});
    pos = comma + 1;
  }
  return Status::ok();
}

Status Curriculum::make(const CurriculumOptions& o, int T, Curriculum* out) {
  *out = Curriculum();
  out->T_ = T;
  if (o.kind == "none") {
    // A schedule flag without the curriculum would be ignored: say so instead.
    const CurriculumOptions d;
    const char* set = o.start != d.start ? "--curriculum-start"
                      : o.steps != d.steps ? "--curriculum-steps"
                      : o.schedule != d.schedule ? "--curriculum-schedule"
                      : o.step != d.step ? "--curriculum-step"
                      : o.root != d.root ? "--curriculum-root"
                      : !o.discrete.empty() ? "--curriculum-discrete"
                                            : nullptr;
    if (set) return bad(std::string(set) + " needs --curriculum seqlen (without it there is no curriculum to shape)");
    return Status::ok();
  }
  if (o.kind != "seqlen") return bad("--curriculum must be none or seqlen, got '" + o.kind + "'");
  Curriculum c;
  c.on_ = true;
  c.T_ = T;
  if (o.schedule == "discrete") {
    RETURN_IF_ERROR(parse_discrete_curriculum(o.discrete, &c.discrete_));
    if (c.discrete_.back().first > T)
      return bad("--curriculum-discrete: length " + std::to_string(c.discrete_.back().first) +
                 " is longer than --seq-len " + std::to_string(T));
    *out = c;
    return Status::ok();
  }
  if (o.schedule != "linear" && o.schedule != "root")
    return bad("--curriculum-schedule must be linear, root or discrete, got '" + o.schedule + "'");
  if (!o.discrete.empty()) return bad("--curriculum-discrete needs --curriculum-schedule discrete");
  if (o.step < 1) return bad("--curriculum-step must be >= 1");
  if (o.start < o.step || o.start % o.step != 0)
    return bad("--curriculum-start (" + std::to_string(o.start) + ") must be a positive multiple of --curriculum-step (" +
               std::to_string(o.step) + ")");
  if (o.start > T)
    return bad("--curriculum-start " + std::to_string(o.start) + " is longer than --seq-len " + std::to_string(T));
  if (o.steps < 1) return bad("--curriculum seqlen needs --curriculum-steps N >= 1 (steps until rows are --seq-len long)");
  if (o.schedule == "root" && !(o.root >= 1)) return bad("--curriculum-root must be >= 1");
  c.start_ = o.start, c.step_ = o.step, c.steps_ = o.steps;
  c.root_ = o.schedule == "root" ? o.root : 1.0;
  *out = c;
  return Status::ok();
}

int Curriculum::length(int64_t k) const {
  if (!on_) return T_;
  if (!discrete_.empty()) {
    for (const auto& [length, until] : discrete_)
      if (k < until) return length;
    return T_;
  }
  if (k >= steps_) return T_;
  const double progress = std::pow((double)k / (double)steps_, 1.0 / root_);
  int64_t L = (int64_t)std::floor(progress * (T_ - start_) + start_);
  L -= L % step_;
  return (int)std::min<int64_t>(std::max<int64_t>(L, step_), T_);
}

std::vector<int> Curriculum::lengths() const {
  std::set<int> all = {T_};
  if (on_ && !discrete_.empty())
    for (const auto& d : discrete_) all.insert(d.first);
  else if (on_)
    for (int64_t k = 0; k < steps_; k++) all.insert(length(k));
  return {all.begin(), all.end()};
}

int64_t Curriculum::tokens_before(int64_t k, int64_t rows) const {
  if (!on_) return k * rows * T_;
  // Past the schedule every step is T long: only the curriculum's steps are summed.
  const int64_t last = discrete_.empty() ? steps_ : discrete_.back().second;
  int64_t tokens = 0;
  for (int64_t i = 0; i < std::min(k, last); i++) tokens += rows * length(i);
  return tokens + std::max<int64_t>(0, k - last) * rows * T_;
}

std::string Curriculum::describe() const {
  if (!on_) return "none";
  std::string text = "seqlen ";
  if (!discrete_.empty()) {
    char item[64];
    for (const auto& [length, until] : discrete_) {
      std::snprintf(item, sizeof item, "%d until step %lld, ", length, (long long)until);
      text += item;
    }
    std::snprintf(item, sizeof item, "%d after", T_);
    return text + item;
  }
  char schedule[32] = "linear", line[160];
  if (root_ != 1) std::snprintf(schedule, sizeof schedule, "root %g", root_);
  std::snprintf(line, sizeof line, "%d -> %d over %lld steps (%s, multiples of %d)", start_, T_, (long long)steps_,
                schedule, step_);
  return text + line;
}

}  // namespace meshtrain::train
