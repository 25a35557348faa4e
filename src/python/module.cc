#include "python/bindings.h"

#include "core/check.h"

namespace meshtrain::python {

py::object json_to_python(const std::string& text) { return py::module_::import("json").attr("loads")(text); }

std::string python_to_json(const py::handle& value) {
  return py::module_::import("json").attr("dumps")(value).cast<std::string>();
}

}  // namespace meshtrain::python

PYBIND11_MODULE(_meshtrain, m) {
  namespace mp = meshtrain::python;
  m.doc() = "meshtrain's engine, bound for Python: use the package `meshtrain`, which wraps this module.";
  mp::py::register_exception<mp::StatusError>(m, "MeshtrainError", PyExc_ValueError);
  // A bug (a failed CHECK) raises meshtrain.InternalError instead of ending the interpreter.
  mp::py::register_exception<meshtrain::CheckFailure>(m, "InternalError", PyExc_RuntimeError);
  meshtrain::throw_on_check_failure(true);
  mp::add_commands(m);
  mp::add_tokenizer(m);
  mp::add_weights(m);
  mp::add_model(m);
}
