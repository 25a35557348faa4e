// Intervals on the monotonic clock (std::chrono::steady_clock), in seconds.
#pragma once
#include <chrono>

namespace meshtrain {

// Seconds from t0 to now.
inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace meshtrain
