// The architecture name table (corelm/architecture.h) and the llama2.c conversion built on it.
#include <charconv>
#include <cstring>
#include <regex>

#include "corelm/architecture.h"
#include "corelm/error.h"

namespace corelm::model {

const std::vector<ParameterName>& layer_parameter_names() {
  // llama2.c's TransformerWeights order; its w1/w2/w3 are gate/down/up.
  static const std::vector<ParameterName> names = {
      {"input_layernorm", "attn_norm", "rms_att_weight", false},
      {"self_attn.q_proj", "attn_q", "wq", true},
      {"self_attn.k_proj", "attn_k", "wk", true},
      {"self_attn.v_proj", "attn_v", "wv", false},
      {"self_attn.o_proj", "attn_output", "wo", false},
      {"post_attention_layernorm", "ffn_norm", "rms_ffn_weight", false},
      {"mlp.gate_proj", "ffn_gate", "w1", false},
      {"mlp.down_proj", "ffn_down", "w2", false},
      {"mlp.up_proj", "ffn_up", "w3", false},
  };
  return names;
}

const std::vector<ParameterName>& global_parameter_names() {
  static const std::vector<ParameterName> names = {
      {"model.embed_tokens.weight", "token_embd.weight", "token_embedding_table", false},
      {"model.norm.weight", "output_norm.weight", "rms_final_weight", false},
      {"lm_head.weight", "output.weight", "wcls", false},
  };
  return names;
}

const std::vector<ParameterName>& hybrid_layer_parameter_names() {
  static const std::vector<ParameterName> names = {
      {"self_attn.decay", "attn_decay", nullptr, false, /*raw=*/true},
      {"self_attn.out_norm", "attn_out_norm", nullptr, false},
  };
  return names;
}

namespace {
// A per-layer name split as "<prefix><N>.<role><suffix>"; suffix is "" (raw roles), ".weight" or
// ".bias". Looks the role up in both layer tables, by the HF (hf = true) or the GGUF spelling.
struct LayerName {
  std::string layer, suffix;
  const ParameterName* entry = nullptr;
};
LayerName split_layer_name(const std::string& name, bool hf) {
  static const std::regex hf_re(R"(model\.layers\.(\d+)\.(.+))"), gguf_re(R"(blk\.(\d+)\.(.+))");
  std::smatch m;
  if (!std::regex_match(name, m, hf ? hf_re : gguf_re)) return {};
  const std::string rest = m[2];
  for (const auto* table : {&layer_parameter_names(), &hybrid_layer_parameter_names()})
    for (const auto& n : *table) {
      const std::string role = hf ? n.hf : n.gguf;
      if (n.raw) {
        if (rest == role) return {m[1], "", &n};
        continue;
      }
      for (const char* suffix : {".weight", ".bias"})
        if (rest == role + suffix) return {m[1], suffix, &n};
    }
  return {};
}
}  // namespace

const ParameterName* find_layer_parameter(const std::string& hf, int64_t* layer) {
  const LayerName n = split_layer_name(hf, /*hf=*/true);
  if (n.entry && layer) {
    // The digits may come from a file: one beyond int64 gives -1, not an exception.
    int64_t v = -1;
    const auto r = std::from_chars(n.layer.data(), n.layer.data() + n.layer.size(), v);
    *layer = r.ec == std::errc() ? v : -1;
  }
  return n.entry;
}

std::string gguf_name_from_hf(const std::string& hf) {
  for (const auto& g : global_parameter_names())
    if (hf == g.hf) return g.gguf;
  const LayerName n = split_layer_name(hf, /*hf=*/true);
  if (n.entry) return "blk." + n.layer + "." + n.entry->gguf + n.suffix;
  throw ValueError("gguf: no llama.cpp name for tensor '" + hf + "'");
}

std::string hf_name_from_gguf(const std::string& g) {
  for (const auto& n : global_parameter_names())
    if (g == n.gguf) return n.hf;
  const LayerName n = split_layer_name(g, /*hf=*/false);
  if (n.entry) return "model.layers." + n.layer + "." + n.entry->hf + n.suffix;
  throw ValueError("gguf: no Hugging Face name for tensor '" + g + "'");
}

Tensor permute_rope_rows(const Tensor& w, int64_t n_heads, bool to_interleaved) {
  Tensor src = w.to(DType::F32).contiguous();
  const int64_t rows = src.size(0), width = src.numel() / rows, hd = rows / n_heads;
  CORELM_CHECK(n_heads > 0 && rows % n_heads == 0 && hd % 2 == 0, ShapeError, "permute_rope_rows: ", rows,
               " rows do not form ", n_heads, " heads of an even size");
  Tensor out = Tensor::empty(src.shape());
  for (int64_t h = 0; h < n_heads; ++h)
    for (int64_t r = 0; r < hd; ++r) {
      const int64_t inter = r < hd / 2 ? 2 * r : 2 * (r - hd / 2) + 1;  // rotate-half row r -> interleaved row
      const int64_t s = to_interleaved ? r : inter, d = to_interleaved ? inter : r;
      std::memcpy(out.data<float>() + (h * hd + d) * width, src.data<float>() + (h * hd + s) * width,
                  static_cast<size_t>(width) * sizeof(float));
    }
  return out;
}

Llama2cModel llama2c_model(const io::Llama2cCheckpoint& ck) {
  const io::Llama2cHeader& hd = ck.header;
  const int64_t dim = hd.dim, layers = hd.n_layers, head_dim = dim / hd.n_heads;
  auto find = [&](const char* name) -> const Tensor& {
    for (const auto& [n, t] : ck.tensors)
      if (n == name) return t;
    throw FormatError(std::string("llama2.c checkpoint: no tensor '") + name + "'");
  };
  Llama2cModel m;
  m.tensors.emplace_back("model.embed_tokens.weight", find("token_embedding_table"));
  for (int64_t l = 0; l < layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    for (const auto& n : layer_parameter_names()) {
      Tensor t = find(n.llama2c).select(0, l).contiguous();  // stacked [layers, ...] -> layer l
      if (n.rope_rows) {
        const bool q = std::strcmp(n.llama2c, "wq") == 0;
        t = permute_rope_rows(t, q ? hd.n_heads : hd.n_kv_heads, /*to_interleaved=*/false);
      }
      m.tensors.emplace_back(p + n.hf + ".weight", t);
    }
  }
  m.tensors.emplace_back("model.norm.weight", find("rms_final_weight"));
  if (!hd.shared_classifier) m.tensors.emplace_back("lm_head.weight", find("wcls"));
  m.config = {{"architectures", {"LlamaForCausalLM"}},
              {"model_type", "llama"},
              {"vocab_size", hd.vocab_size},
              {"hidden_size", dim},
              {"intermediate_size", hd.hidden_dim},
              {"num_hidden_layers", layers},
              {"num_attention_heads", hd.n_heads},
              {"num_key_value_heads", hd.n_kv_heads},
              {"head_dim", head_dim},
              {"max_position_embeddings", hd.seq_len},
              {"rms_norm_eps", 1e-5},
              {"rope_theta", 10000.0},
              {"tie_word_embeddings", hd.shared_classifier},
              {"attention_bias", false},
              {"bos_token_id", 1},
              {"eos_token_id", 2},
              {"torch_dtype", "float32"}};
  return m;
}

Llama2cModel load_llama2c_model(const std::string& path) { return llama2c_model(io::load_llama2c_checkpoint(path)); }

}  // namespace corelm::model
