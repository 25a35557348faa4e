#include "train/progress.h"

#include <algorithm>
#include <cstdio>

namespace meshtrain::train {

namespace {
std::string format_duration(double s) {
  char buf[32];
  int t = (int)(s + 0.5);
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%dh%02dm", t / 3600, t % 3600 / 60);
  else std::snprintf(buf, sizeof buf, "%dm%02ds", t / 60, t % 60);
  return buf;
}
}  // namespace

Progress::Progress(const Console& console, int64_t first_step, int64_t total_steps, bool quiet)
    : console_(console), live_(!quiet && console.terminal), quiet_(quiet), first_step_(first_step),
      total_(total_steps) {}

Progress::~Progress() { end_live_line(); }

void Progress::step(int64_t k, float loss, float lr, double grad_norm, double step_s, double tok_s,
                    double mfu, const std::string& extra) {
  if (quiet_) return;
  elapsed_s_ += step_s;
  const double eta = elapsed_s_ / (double)(k + 1 - first_step_) * (double)(total_ - k - 1);
  if (live_) {
    console_.out(formatted("\r\033[Kstep %lld/%lld | loss %.4f | %.0f tok/s | MFU %.1f%% | ETA %s",
                           (long long)k + 1, (long long)total_, loss, tok_s, 100 * mfu,
                           format_duration(eta).c_str()));
    line_open_ = true;
    // Keep about twenty lines on screen so the loss trend stays readable.
    const int64_t every = std::max<int64_t>(1, total_ / 20);
    if ((k + 1) % every == 0 || k + 1 == total_) end_live_line();
  } else {
    console_.out(formatted("step %5lld/%lld | loss %.4f | lr %.2e | norm %.3f | %7.1f ms | %8.0f tok/s | "
                           "MFU %5.1f%%%s | ETA %s\n",
                           (long long)k + 1, (long long)total_, loss, lr, grad_norm, step_s * 1e3, tok_s,
                           100 * mfu, extra.c_str(), format_duration(eta).c_str()));
  }
  console_.flush();
}

void Progress::message(const std::string& line) {
  if (quiet_) return;
  end_live_line();
  console_.line(line);
  console_.flush();
}

void Progress::end_live_line() {
  if (line_open_) console_.out("\n");
  line_open_ = false;
}

}  // namespace meshtrain::train
