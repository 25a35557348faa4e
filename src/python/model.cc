// meshtrain.Model: a trained model in memory, for its logits and for sampling from it.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include "checkpoint/model_file.h"
#include "cli/commands.h"
#include "cli/completion.h"
#include "infer/decoder.h"
#include "model/config_json.h"
#include "python/bindings.h"

namespace meshtrain::python {

namespace {

struct Model {
  std::unique_ptr<model::Gpt> gpt;
  std::shared_ptr<data::Tokenizer> tokenizer;  // null: none found (logits only)
};

// The model at `path` (anything the command line reads as one) and its tokenizer: `tokenizer`
// when given, else the one generate would find (none found is not an error until generate).
std::unique_ptr<Model> open_model(const std::string& path, const std::string& tokenizer) {
  auto out = std::make_unique<Model>();
  Status s;
  {
    py::gil_scoped_release release;
    s = checkpoint::open_model_file(path, 0, &out->gpt, model::Gpt::LocalState::kParamsOnly);
  }
  raise_if_error(s);
  std::unique_ptr<data::Tokenizer> tok;
  const Status found = cli::load_model_tokenizer(path, tokenizer, &tok);
  if (!found.is_ok() && !tokenizer.empty()) raise_if_error(found);
  if (tok) {
    raise_if_error(cli::check_tokenizer_fits_model(*tok, out->gpt->config().vocab));
    out->tokenizer = std::shared_ptr<data::Tokenizer>(std::move(tok));
  }
  return out;
}

// Rows of token ids, checked against the model: a 1-D array is one row.
std::vector<std::vector<int>> token_rows(const Model& m, const py::array_t<int64_t, py::array::c_style | py::array::forcecast>& ids) {
  if (ids.ndim() != 1 && ids.ndim() != 2) throw StatusError("ids must be one row [T] or rows [B, T] of token ids");
  const int64_t B = ids.ndim() == 1 ? 1 : ids.shape(0), T = ids.shape(ids.ndim() - 1);
  const model::GptConfig& c = m.gpt->config();
  if (B < 1 || T < 1) throw StatusError("ids is empty");
  if (T > c.max_seq_len)
    throw StatusError("ids has " + std::to_string(T) + " tokens a row; the model's context is " + std::to_string(c.max_seq_len));
  std::vector<std::vector<int>> rows(B, std::vector<int>(T));
  for (int64_t b = 0; b < B; b++)
    for (int64_t t = 0; t < T; t++) {
      const int64_t id = ids.data()[b * T + t];
      if (id < 0 || id >= c.vocab)
        throw StatusError("id " + std::to_string(id) + " at [" + std::to_string(b) + ", " + std::to_string(t) +
                          "] is outside the model's vocabulary of " + std::to_string(c.vocab));
      rows[b][t] = (int)id;
    }
  return rows;
}

// [B, T, V] (or [T, V] for one row): the logits at every position, each row decoded on its own
// (infer::BatchDecoder: a row's logits do not depend on the rows beside it).
py::array_t<float> logits(const Model& m, const py::array_t<int64_t, py::array::c_style | py::array::forcecast>& ids) {
  const std::vector<std::vector<int>> rows = token_rows(m, ids);
  const int64_t B = rows.size(), T = rows[0].size(), V = m.gpt->config().vocab;
  py::array_t<float> out(std::vector<py::ssize_t>{B, T, V});
  float* dst = out.mutable_data();
  {
    py::gil_scoped_release release;
    infer::BatchDecoder decoder(*m.gpt);
    std::vector<int> seq(B);
    for (int64_t b = 0; b < B; b++) seq[b] = decoder.add();
    std::vector<infer::BatchDecoder::Rows> batch(B);
    for (int64_t t = 0; t < T; t++) {
      for (int64_t b = 0; b < B; b++) batch[b] = {seq[b], std::span<const int>(&rows[b][t], 1)};
      decoder.step(batch);
      for (int64_t b = 0; b < B; b++) std::memcpy(dst + (b * T + t) * V, decoder.logits(seq[b]), sizeof(float) * V);
    }
  }
  if (ids.ndim() == 1) out = out.reshape(std::vector<py::ssize_t>{T, V});
  return out;
}

// The prompt's continuation, sampled as `meshtrain generate` samples it (the same seed, the
// same text).
std::string generate(const Model& m, const std::string& prompt, int max_tokens, double temperature, int top_k,
                     double top_p, uint64_t seed, const std::vector<std::string>& stop) {
  if (!m.tokenizer) throw StatusError("this model has no tokenizer (give Model(path, tokenizer=...))");
  if (prompt.empty()) throw StatusError("prompt is empty");
  if (max_tokens < 0) throw StatusError("max_tokens must be >= 0");
  if (temperature < 0) throw StatusError("temperature must be >= 0 (0 = greedy)");
  if (top_k < 0) throw StatusError("top_k must be >= 0 (0 = no limit)");
  if (!(top_p > 0 && top_p <= 1)) throw StatusError("top_p must be in (0, 1] (1 = no cut)");
  const cli::CompletionRequest r{prompt, false, max_tokens, {(float)temperature, top_k, (float)top_p}, seed, stop, -1};
  cli::Completion c;
  raise_if_error(cli::prepare_completion(*m.gpt, *m.tokenizer, r, &c));
  py::gil_scoped_release release;
  cli::run_completion(*m.gpt, *m.tokenizer, r, nullptr, &c);
  return c.text;
}

// A float default as help() should show it: 0.8, not 0.800000011920929 (six digits, which
// convert back to the same float).
double as_written(float v) { return std::stod(std::to_string(v)); }

}  // namespace

void add_model(py::module_& m) {
  const cli::CompletionRequest defaults;
  py::class_<Model>(m, "Model", "A trained model in memory: a run or checkpoint folder of any layout, an HF folder "
                                "or .safetensors file, or an llm.c .bin.")
      .def(py::init(&open_model), py::arg("path"), py::arg("tokenizer") = "",
           "The model at `path`; its tokenizer is `tokenizer` (a folder or file) when given, else the one "
           "`meshtrain generate` would find (the run's copy, the data's, GPT-2's); none found leaves logits only")
      .def("logits", &logits, py::arg("ids"),
           "float32 logits at every position: [T, V] for one row of ids, [B, T, V] for rows")
      .def("generate", &generate, py::arg("prompt"), py::arg("max_tokens") = 100,
           py::arg("temperature") = as_written(defaults.sampling.temperature),
           py::arg("top_k") = defaults.sampling.top_k, py::arg("top_p") = as_written(defaults.sampling.top_p),
           py::arg("seed") = defaults.seed,
           py::arg("stop") = std::vector<std::string>{},
           "The prompt's continuation (text), sampled as `meshtrain generate` does: the same seed, the same text")
      .def_property_readonly(
          "config", [](const Model& self) { return json_to_python(model::config_json(self.gpt->config()).dump()); },
          "The model's record: layers, heads, dim, max_seq_len, vocab and the architecture's parts")
      .def_property_readonly(
          "tokenizer", [](const Model& self) { return self.tokenizer; }, "Its Tokenizer, or None");
}

}  // namespace meshtrain::python
