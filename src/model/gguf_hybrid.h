// Internal to src/model: the pieces of the GGUF model writer/reader (gguf_model.cc) that the
// corelm_hybrid form (gguf_hybrid.cc) shares, and the hybrid's own entry points.
#pragma once
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "corelm/architecture.h"
#include "corelm/gguf.h"
#include "corelm/model.h"

namespace corelm::model::detail {

// llama.cpp's general.file_type number for a file whose weights are mostly `t`.
uint32_t llama_file_type(io::GGMLType t);
// The ggml type a tensor is written in: F32 for 1-D tensors and keep_f32 ones, else weight_type,
// falling back when the block does not divide the rows.
io::GGMLType gguf_tensor_type(const Tensor& v, io::GGMLType weight_type, bool keep_f32);
// general.* and the llama-style `<arch>.*` hyperparameter keys of config.json object c.
std::vector<std::pair<std::string, io::GGUFValue>> arch_keys(const std::string& arch, const nlohmann::json& c,
                                                            io::GGMLType weight_type);

// True when config.json object c may describe layers other than full attention (model_type
// corelm_hybrid or mistral, or a layer_types entry other than full_attention); the caller parses
// it to be sure.
bool has_hybrid_layers(const nlohmann::json& c);
void save_hybrid_gguf(const std::string& path, const ModelConfig& mc, const nlohmann::json& c,
                      const std::vector<std::pair<std::string, Tensor>>& hf_tensors, io::GGMLType weight_type,
                      const std::vector<std::pair<std::string, io::GGUFValue>>& extra);
// `w` is the "GGUF 'path': " error prefix; `base` the llama-style config load_gguf_model read
// from the shared keys; `by_name` every tensor under its HF name, f32, as stored.
GGUFModel load_hybrid_gguf(const io::GGUFFile& f, const std::string& w, nlohmann::json base,
                           std::map<std::string, Tensor> by_name);

}  // namespace corelm::model::detail
