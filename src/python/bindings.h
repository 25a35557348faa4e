// The Python module `meshtrain._meshtrain` (python/meshtrain/ wraps it): each file binds one
// concern. Every input-driven failure reaches Python as meshtrain.MeshtrainError carrying the
// engine's message (raise_if_error); none ends the interpreter.
#pragma once
#include <pybind11/pybind11.h>

#include <stdexcept>
#include <string>

#include "core/status.h"

namespace meshtrain::python {

namespace py = pybind11;

// What a failed Status becomes (registered as meshtrain.MeshtrainError, a ValueError).
struct StatusError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
inline void raise_if_error(const Status& s) {
  if (!s.is_ok()) throw StatusError(s.message());
}

// JSON between the engine and Python: through Python's own json module, once per call.
py::object json_to_python(const std::string& text);
std::string python_to_json(const py::handle& value);

void add_commands(py::module_& m);   // commands.cc: the command line in this process, training's events
void add_tokenizer(py::module_& m);  // tokenizer.cc
void add_weights(py::module_& m);    // weights.cc: a model's weights as NumPy arrays, and back
void add_model(py::module_& m);      // model.cc: logits and sampling

}  // namespace meshtrain::python
