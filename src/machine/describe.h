// This machine in words and JSON: the CPU, its vector extensions, oneDNN's effective ISA,
// the build's -march and the kernel each precision's GEMMs run on. `bench peak`, the run
// header and config.json print it, so a figure always says where it came from.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "kernels/ops.h"

namespace meshtrain::machine {

nlohmann::json machine_json();
// Two lines: "cpu: <model> | <flags> | oneDNN ISA <isa> | built -march=<march>" and the
// kernels per precision.
std::string machine_summary();
// "bf16 GEMMs: ..., MFU against the fp32 peak" or similar, for the precision a run uses.
std::string mfu_basis(kernels::Precision p);

}  // namespace meshtrain::machine
