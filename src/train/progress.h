// Console progress: on a terminal one live line rewritten in place (step, loss, tokens/s,
// MFU, ETA); otherwise one plain line per step, which logs and pipes want. It writes through
// a Console (console.h), whose `terminal` picks between the two.
#pragma once
#include <cstdint>
#include <string>

#include "train/console.h"

namespace meshtrain::train {

class Progress {
 public:
  Progress(const Console& console, int64_t first_step, int64_t total_steps, bool quiet);
  ~Progress();
  // extra: appended after MFU (an MoE run's routing), "" for none.
  void step(int64_t k, float loss, float lr, double grad_norm, double step_s, double tok_s, double mfu,
            const std::string& extra = "");
  // A line that must stay on screen (evaluation results, notes).
  void message(const std::string& line);

 private:
  void end_live_line();
  const Console& console_;
  bool live_ = false, quiet_ = false, line_open_ = false;
  int64_t first_step_ = 0, total_ = 0;
  double elapsed_s_ = 0;
};

}  // namespace meshtrain::train
