// meshtrain.Tokenizer: every format the command line reads (data/tokenizer.h), with exactly
// its ids.
#include <memory>
#include <string>
#include <vector>

#include <pybind11/stl.h>

#include "data/tokenizer.h"
#include "python/bindings.h"

namespace meshtrain::python {

namespace {

std::shared_ptr<data::Tokenizer> open_tokenizer(const std::string& path) {
  std::unique_ptr<data::Tokenizer> tok;
  raise_if_error(data::load_tokenizer(path, &tok));
  return std::shared_ptr<data::Tokenizer>(std::move(tok));
}

std::vector<int> encode(const data::Tokenizer& tok, const std::string& text, bool special) {
  return special ? tok.encode_with_special(text) : tok.encode(text);
}

std::string decode(const data::Tokenizer& tok, const std::vector<int>& ids) {
  std::string text;
  raise_if_error(tok.decode_checked(ids, &text));
  return text;
}

std::vector<std::vector<int>> encode_batch(const data::Tokenizer& tok, const std::vector<std::string>& texts,
                                           bool special) {
  std::vector<std::vector<int>> out(texts.size());
  py::gil_scoped_release release;
  for (size_t i = 0; i < texts.size(); i++) out[i] = encode(tok, texts[i], special);
  return out;
}

}  // namespace

void add_tokenizer(py::module_& m) {
  py::class_<data::Tokenizer, std::shared_ptr<data::Tokenizer>>(m, "Tokenizer",
      "A tokenizer: a folder or file that `meshtrain tokenize --tokenizer` reads (tokenizer.json, a "
      "SentencePiece .model, a tiktoken rank file, GPT-2's encoder.json + vocab.bpe).")
      .def(py::init(&open_tokenizer), py::arg("path"))
      .def("encode", &encode, py::arg("text"), py::arg("special") = false,
           "The text's ids. special=True applies the format's rule for a sequence's start and end (a BOS "
           "first for Llama's), as generate's prompts get.")
      .def("encode_batch", &encode_batch, py::arg("texts"), py::arg("special") = false, "encode() of each text")
      .def("decode", &decode, py::arg("ids"), "The text of the ids (an id outside the vocabulary is an error)")
      .def("token_bytes", [](const data::Tokenizer& t, int id) {
             if (id < 0 || id >= t.vocab_size()) throw StatusError("id " + std::to_string(id) + " is outside the vocabulary");
             return py::bytes(std::string(t.token_bytes(id)));
           }, py::arg("id"), "The bytes one token stands for")
      .def_property_readonly("vocab_size", &data::Tokenizer::vocab_size)
      .def_property_readonly("format", [](const data::Tokenizer& t) { return t.info().format; })
      .def_property_readonly("name", [](const data::Tokenizer& t) { return t.info().name; })
      .def_property_readonly("bos_id", [](const data::Tokenizer& t) { return t.info().bos_id; })
      .def_property_readonly("eos_id", [](const data::Tokenizer& t) { return t.info().eos_id; })
      .def("__repr__", [](const data::Tokenizer& t) {
        return "<meshtrain.Tokenizer " + t.info().name + " (" + t.info().format + ", " + std::to_string(t.vocab_size()) +
               " ids)>";
      });
}

}  // namespace meshtrain::python
