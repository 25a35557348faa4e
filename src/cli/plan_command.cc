#include <cstdio>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "planner/memory.h"

namespace meshtrain::cli {

Command add_plan_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("plan", "Predict per-rank memory of layouts");
  auto memory = std::make_shared<bool>(false);
  auto params = std::make_shared<double>(0);
  auto dp = std::make_shared<std::vector<int>>(std::vector<int>{1, 4, 16, 64, 256, 1024});
  auto state = std::make_shared<std::string>("mixed");
  cmd->add_flag("--memory", *memory, "Model-state bytes per rank for every ZeRO stage");
  cmd->add_option("--params", *params, "Parameters (e.g. 7.5e9)")->required();
  cmd->add_option("--dp", *dp, "Data-parallel sizes N_d (comma-separated)")->delimiter(',')->capture_default_str();
  cmd->add_option("--state", *state,
                  "Bytes per parameter: mixed (2 weights + 2 gradients + 12 fp32 master, momentum, "
                  "variance; the ZeRO paper's accounting) or fp32 (4 + 4 + 8, the engine's fp32 runs)")
      ->capture_default_str();
  return {cmd, [=] {
            if (!*memory)
              return fail(Status::error("meshtrain plan predicts model-state memory (--memory) for now; "
                                        "layout search and step-time prediction are not built yet"));
            if (!(*params > 0)) return fail(Status::error("--params must be > 0"));
            if (*state != "mixed" && *state != "fp32")
              return fail(Status::error("--state must be mixed or fp32, got '" + *state + "'"));
            for (int n : *dp)
              if (n < 1) return fail(Status::error("--dp sizes must be >= 1, got " + std::to_string(n)));
            const planner::StateDtypes d = *state == "mixed" ? planner::kMixedState : planner::kFp32State;
            std::printf("model state per rank, %.4g parameters, %s (%g + %g + %g bytes per parameter), "
                        "decimal GB\n",
                        *params, state->c_str(), d.param, d.grad, d.optim);
            std::printf("%8s | %12s | %12s | %12s | %12s\n", "N_d", "zero 0", "zero 1 (os)",
                        "zero 2 (os+g)", "zero 3 (os+g+p)");
            for (int n : *dp) {
              std::printf("%8d", n);
              for (int z = 0; z <= 3; z++)
                std::printf(" | %12.4g", planner::model_state_bytes(*params, d, z, n).total() / 1e9);
              std::printf("\n");
            }
            return 0;
          }};
}

}  // namespace meshtrain::cli
