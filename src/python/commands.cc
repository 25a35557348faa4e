// The command line run in this process (cli/in_process.h), and a training run's events handed
// to Python callables.
#include <optional>
#include <vector>

#include <pybind11/stl.h>

#include "cli/in_process.h"
#include "planner/cluster.h"
#include "python/bindings.h"

namespace meshtrain::python {

namespace {

// Each step's record (a metrics.jsonl line, as a dict) to `on_step`, each validation's to
// `on_eval`. A step answered with False stops the run at that step's end, as a signal would;
// so does an exception (raised again once the run has ended) and Ctrl-C (KeyboardInterrupt).
class PythonSubscriber : public train::RunSubscriber {
 public:
  PythonSubscriber(py::object on_step, py::object on_eval) : on_step_(std::move(on_step)), on_eval_(std::move(on_eval)) {}

  train::Reply on_step(const train::StepReport& r) override {
    py::gil_scoped_acquire gil;
    if (error_) return train::Reply::kStop;
    try {
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
      if (on_step_.is_none()) return train::Reply::kContinue;
      const py::object answer = on_step_(json_to_python(r.record.dump()));
      return answer.is(py::bool_(false)) ? train::Reply::kStop : train::Reply::kContinue;
    } catch (py::error_already_set& e) {
      error_.emplace(std::move(e));
      return train::Reply::kStop;
    }
  }

  void on_eval(const train::EvalReport& r) override {
    py::gil_scoped_acquire gil;
    if (error_ || on_eval_.is_none()) return;
    try {
      on_eval_(json_to_python(r.record.dump()));
    } catch (py::error_already_set& e) {
      error_.emplace(std::move(e));
    }
  }

  // With the GIL held, after the run: the callback's exception, if it raised one.
  void raise_callback_error() {
    if (error_) throw *error_;
  }

 private:
  py::object on_step_, on_eval_;
  std::optional<py::error_already_set> error_;
};

// (its --json result or None, the ranks the launcher must start or 0)
py::tuple run_command(const std::vector<std::string>& args, const py::object& on_step, const py::object& on_eval) {
  cli::InProcess io;
  PythonSubscriber subscriber(on_step, on_eval);
  io.subscriber = &subscriber;
  Status s;
  {
    py::gil_scoped_release release;
    s = cli::run_in_process(args, &io);
  }
  subscriber.raise_callback_error();
  raise_if_error(s);
  py::object result = io.result.is_null() ? py::none() : json_to_python(io.result.dump());
  return py::make_tuple(result, io.launcher_ranks);
}

}  // namespace

void add_commands(py::module_& m) {
  m.def("run_command", &run_command, py::arg("args"), py::arg("on_step") = py::none(), py::arg("on_eval") = py::none(),
        "Runs `meshtrain ARGS...` in this process. Returns (its --json result or None, the ranks the launcher "
        "must start for a training run on several ranks, else 0). Raises MeshtrainError with the command's "
        "message.");
  m.def("cluster_preset_text", [](const std::string& name) {
          std::string text;
          raise_if_error(planner::builtin_cluster_text(name, &text));
          return text;
        }, py::arg("name"), "The TOML of a built-in cluster preset (a100-80g, h100-80g, h200)");
  m.def("cluster_preset_names", &planner::cluster_preset_names);
  m.attr("binary") = MESHTRAIN_BINARY;
}

}  // namespace meshtrain::python
