// Model directories (config.json + model.safetensors + tokenizer.json), HF layout.
#include <filesystem>

#include "corelm/error.h"
#include "corelm/model_dir.h"
#include "corelm/safetensors.h"

namespace corelm::model {
namespace fs = std::filesystem;

LoadedModel load_model_dir(const std::string& dir) {
  CORELM_CHECK(fs::is_directory(dir), IOError, dir, ": not a directory (expected a model directory with ",
               "config.json, model.safetensors, tokenizer.json)");
  const std::string config_path = (fs::path(dir) / "config.json").string();
  const std::string weights_path = (fs::path(dir) / "model.safetensors").string();
  const std::string tokenizer_path = (fs::path(dir) / "tokenizer.json").string();
  for (const std::string& p : {config_path, weights_path, tokenizer_path})
    CORELM_CHECK(fs::exists(p), IOError, p, ": missing");

  ModelConfig config = ModelConfig::load(config_path);
  LoadedModel out{Decoder(config), Tokenizer::load(tokenizer_path)};
  io::SafetensorsFile file = io::SafetensorsFile::open(weights_path);
  for (const auto& [name, param] : out.decoder.named_parameters()) {
    CORELM_CHECK(file.contains(name), FormatError, weights_path, ": missing tensor '", name, "'");
    Tensor t = file.get(name);
    CORELM_CHECK(t.shape() == param.shape(), FormatError, weights_path, ": tensor '", name, "' has shape ",
                 shape_str(t.shape()), ", the config needs ", shape_str(param.shape()));
    out.decoder.load_parameter(name, t);
  }
  for (const std::string& name : file.names()) {
    if (out.decoder.has_parameter(name)) continue;
    const bool tied_head = name == "lm_head.weight" && config.tie_word_embeddings;
    const bool rotary_buffer = name.size() >= 8 && name.ends_with("inv_freq");
    CORELM_CHECK(tied_head || rotary_buffer, FormatError, weights_path, ": unexpected tensor '", name,
                 "' (not a parameter of this config)");
  }
  const size_t tok_vocab = out.tokenizer->vocab_size();
  CORELM_CHECK(static_cast<int64_t>(tok_vocab) <= config.vocab_size, FormatError, tokenizer_path, ": vocabulary of ",
               tok_vocab, " ids exceeds the model's vocab_size ", config.vocab_size);
  return out;
}

void save_model_dir(const std::string& dir, const Decoder& decoder) {
  fs::create_directories(dir);
  decoder.config().save((fs::path(dir) / "config.json").string());
  io::save_safetensors((fs::path(dir) / "model.safetensors").string(), decoder.named_parameters(),
                       {{"format", "pt"}});
}

}  // namespace corelm::model
