// One loader for every checkpoint a user may hold, and one writer for the formats corelm emits:
//   - a model directory (corelm's, which is Hugging Face's layout): config.json + model.safetensors
//     or model-0000i-of-0000N.safetensors shards listed in model.safetensors.index.json,
//     tokenizer.json (or vocab.json / tokenizer.model / llama2.c tokenizer.bin), generation_config.json;
//   - a GGUF file (llama / qwen2 architecture; tokenizer from its tokenizer.ggml.* metadata);
//   - a llama2.c .bin checkpoint (tokenizer given separately);
//   - a single .safetensors file with config.json beside it.
// Config features corelm does not compute (MoE, MLA, rope_scaling, sliding-window attention,
// quantized HF weights) are FormatErrors naming the field, never silently different results.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "corelm/gguf.h"
#include "corelm/model_dir.h"

namespace corelm::model {

struct LoadOptions {
  // Missing or unexpected tensors are a FormatError listing them. Non-strict: a warning; missing
  // parameters keep their initialisation (init_weights(0)), unexpected tensors are ignored.
  bool strict = true;
  // A tokenizer file or directory (tokenizer.json, vocab.json, tokenizer.model, llama2.c
  // tokenizer.bin); overrides the one the checkpoint carries. Needed for llama2.c checkpoints.
  std::string tokenizer_path;
  // f32 (default) keeps the stored values; bf16 / f16 round every weight to that precision on
  // load (the decoder always computes in f32).
  std::string dtype = "f32";
  // When false a checkpoint without a tokenizer loads with tokenizer == nullptr.
  bool require_tokenizer = true;
};

// Where the tokenizer came from, so a converter can write it into another format.
struct TokenizerSource {
  std::string kind;   // "file" (tokenizer.json / vocab.json / tokenizer.model), "llama2c", "gguf", or "" (none)
  std::string path;   // the file for "file" / "llama2c"; the GGUF file for "gguf"
  // tokenizer.ggml.* (and corelm.tokenizer.*) keys describing it, for "llama2c", "gguf" and
  // byte-level BPE files; empty when the vocabulary has no GGUF form (SentencePiece .model).
  std::vector<std::pair<std::string, io::GGUFValue>> gguf_metadata;
};

struct Checkpoint {
  LoadedModel model;             // decoder (f32 parameters) + tokenizer (may be null, see above)
  std::string format{};            // "model-dir", "gguf", "llama2c", "safetensors"
  std::vector<int64_t> eos_ids{};  // every end-of-sequence id (generation_config.json may list several)
  int64_t bos_id = -1;
  TokenizerSource tokenizer_source{};
  // The model's chat template (Jinja source) when it carries one: tokenizer_config.json
  // `chat_template` (a string, or the "default" entry of a list of {name, template}), a
  // chat_template.jinja file beside it, or GGUF `tokenizer.chat_template`; empty otherwise.
  std::string chat_template{};
  // The BOS / EOS token texts the template sees as bos_token / eos_token (empty when none).
  std::string bos_token{}, eos_token{};
  std::vector<std::string> warnings{};  // non-strict mismatches, tokenizer notes
};

// "model-dir", "gguf", "llama2c" or "safetensors" from the path (directory or magic bytes).
std::string detect_checkpoint_format(const std::string& path);

// IOError for unreadable/missing files, FormatError naming the file and field/tensor otherwise.
Checkpoint load_model(const std::string& path, const LoadOptions& options = {});

struct SaveOptions {
  std::string to;                  // "corelm", "hf" (same layout, HF-ready) or "gguf"; "" = from the path
  std::string dtype = "f32";       // 2-D weights: f32, bf16, f16 (all targets) or, gguf only, a
                                   // ggml block type (gguf_save_dtypes)
  uint64_t shard_size = 0;         // hf/corelm: above this many bytes, shards + index.json (0: 2 GB)
  std::function<void(const std::string&)> progress;  // one line per step (may be empty)
};

struct SaveSummary {
  std::string to, dtype;
  std::vector<std::string> files;  // what was written
  int64_t tensors = 0, bytes = 0;
  bool tokenizer_written = false;
  std::vector<std::string> warnings;
};

// Writes `ckpt` as `options.to` under `path`: a .gguf file replaced atomically, or a folder written
// as a whole (staged beside `path`, swapped in by one rename; files that are not part of a model,
// such as README.md, are kept; a non-empty folder holding no model file is refused with IOError).
// ValueError for an unknown target or a dtype the target cannot hold.
SaveSummary save_model(const Checkpoint& ckpt, const std::string& path, const SaveOptions& options = {});
// SaveOptions::dtype values for --to gguf: f32, bf16, f16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k,
// q6_k. A k-quant's rows must be multiples of 256: other 2-D tensors fall back (save_gguf_model).
const std::vector<std::string>& gguf_save_dtypes();

}  // namespace corelm::model
