// meshtrain.load / meshtrain.save: a model's weights as NumPy arrays under Hugging Face's
// names, from anything the command line reads as a model (a run or checkpoint folder of any
// layout, an HF folder or .safetensors, an llm.c .bin), and back into an HF folder.
#include <cstring>
#include <map>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>
#include <pybind11/numpy.h>

#include "checkpoint/checkpoint_index.h"
#include "checkpoint/hf_gpt2.h"
#include "checkpoint/model_file.h"
#include "model/config_json.h"
#include "python/bindings.h"

namespace meshtrain::python {

namespace {

using FloatArray = py::array_t<float, py::array::c_style | py::array::forcecast>;

// (the model's record as a dict, {HF name: float32 array} in the model's order)
py::tuple load_weights(const std::string& path) {
  std::unique_ptr<model::Gpt> gpt;
  Status s;
  {
    py::gil_scoped_release release;
    s = checkpoint::open_model_file(path, 0, &gpt, model::Gpt::LocalState::kParamsOnly);
  }
  raise_if_error(s);
  checkpoint::HfTensors hf;
  checkpoint::hf_tensors(*gpt, &hf);
  py::dict arrays;
  for (const checkpoint::TensorToWrite& t : hf.tensors) {
    FloatArray a(std::vector<py::ssize_t>(t.shape.begin(), t.shape.end()));
    std::memcpy(a.mutable_data(), t.data, sizeof(float) * a.size());
    arrays[py::str(t.name)] = a;
  }
  return py::make_tuple(json_to_python(model::config_json(gpt->config()).dump()), arrays);
}

// The model `config` (a record as load() returns it) with the weights `arrays`, written as an
// HF folder (config.json and model.safetensors, or shards past max_shard_gb) or, for a path
// ending in .safetensors, that one file.
void save_weights(const py::dict& arrays, const py::object& config, const std::string& out, double max_shard_gb) {
  nlohmann::json record = nlohmann::json::parse(python_to_json(config), nullptr, /*allow_exceptions=*/false);
  if (record.is_discarded()) throw StatusError("config is not a model record");
  model::GptConfig c;
  raise_if_error(checkpoint::index_model_config({{"model", record}}, "config", &c));
  if (!(max_shard_gb > 0)) throw StatusError("max_shard_gb must be > 0");
  std::map<std::string, checkpoint::HfArray> views;
  std::vector<FloatArray> held;  // float32 copies of arrays of other dtypes
  for (const auto& [key, value] : arrays) {
    held.push_back(FloatArray::ensure(value));
    if (!held.back()) throw StatusError("tensor " + py::str(key).cast<std::string>() + " is not a numeric array");
    const FloatArray& a = held.back();
    views[py::str(key).cast<std::string>()] = {std::vector<int64_t>(a.shape(), a.shape() + a.ndim()), a.data()};
  }
  Status s;
  {
    py::gil_scoped_release release;
    model::Gpt gpt(c, model::Gpt::LocalState::kParamsOnly);
    s = checkpoint::set_hf_tensors(views, &gpt);
    if (s.is_ok())
      s = out.ends_with(".safetensors") ? checkpoint::export_hf_safetensors(gpt, out)
                                        : checkpoint::export_hf_folder(gpt, out, max_shard_gb * 1e9);
  }
  raise_if_error(s);
}

}  // namespace

void add_weights(py::module_& m) {
  m.def("load_weights", &load_weights, py::arg("path"),
        "(the model's record, {Hugging Face name: float32 array}) from a run or checkpoint folder of any layout, "
        "an HF folder or .safetensors file, or an llm.c .bin");
  m.def("save_weights", &save_weights, py::arg("arrays"), py::arg("config"), py::arg("out"),
        py::arg("max_shard_gb") = checkpoint::kHfMaxShardBytes / 1e9,
        "Writes the arrays (HF names and shapes, every tensor of the model `config` describes) as an HF folder, or a "
        "single file for a path ending in .safetensors");
}

}  // namespace meshtrain::python
