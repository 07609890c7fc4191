// Tokenizers the model loader needs beyond Tokenizer::load: llama2.c tokenizer.bin files and
// GGUF SentencePiece-style vocabularies, both served by run.c's rules (io::Llama2cTokenizer).
#include <filesystem>
#include <sstream>

#include "corelm/error.h"
#include "model/model_loader_internal.h"

namespace corelm::model::detail {
namespace {

class Llama2cAdapter final : public Tokenizer {
 public:
  Llama2cAdapter(io::Llama2cTokenizer vocab, std::string source) : vocab_(std::move(vocab)), source_(std::move(source)) {
    const int64_t n = vocab_.vocab_size();
    bytes_.reserve(static_cast<size_t>(n));
    for (int64_t id = 0; id < n; ++id) {
      const std::string& p = vocab_.piece(id);
      unsigned byte = 0;
      if (p.size() == 6 && p.compare(0, 3, "<0x") == 0 && p[5] == '>' && std::sscanf(p.c_str(), "<0x%02X>", &byte) == 1)
        bytes_.push_back(std::string(1, static_cast<char>(byte)));
      else
        bytes_.push_back(p);
    }
    if (n > io::Llama2cTokenizer::kEos) {
      bos_ = static_cast<TokenId>(io::Llama2cTokenizer::kBos);
      eos_ = static_cast<TokenId>(io::Llama2cTokenizer::kEos);
      prefix_ = {*bos_};
    }
  }

  std::vector<TokenId> encode(std::string_view text, const EncodeOptions& options) const override {
    std::vector<TokenId> out;
    encode_append(text, options, out);
    return out;
  }
  void encode_append(std::string_view text, const EncodeOptions& options, std::vector<TokenId>& out) const override {
    for (int64_t id : vocab_.encode(std::string(text), options.add_special && bos_.has_value(), false))
      out.push_back(static_cast<TokenId>(id));
  }
  std::string decode(std::span<const TokenId> ids, bool skip_special) const override {
    std::string out;
    bool first = true;
    for (TokenId id : ids) {
      CORELM_CHECK(id >= 0 && static_cast<size_t>(id) < bytes_.size(), ValueError, source_, ": token id ", id,
                   " outside the vocabulary of ", bytes_.size());
      if (is_special(id)) {
        if (!skip_special) out += bytes_[id];
        continue;
      }
      std::string_view piece = bytes_[id];
      if (first && !piece.empty()) {
        if (piece.front() == ' ') piece.remove_prefix(1);  // SentencePiece's dummy prefix
        first = false;
      }
      out += piece;
    }
    return out;
  }
  std::string_view token_bytes(TokenId id) const override {
    CORELM_CHECK(id >= 0 && static_cast<size_t>(id) < bytes_.size(), ValueError, source_, ": token id ", id,
                 " outside the vocabulary of ", bytes_.size());
    return bytes_[id];
  }
  bool strips_leading_space() const override { return true; }
  bool is_special(TokenId id) const override { return id == 0 || (bos_ && id == *bos_) || (eos_ && id == *eos_); }
  size_t vocab_size() const override { return bytes_.size(); }
  std::optional<TokenId> token_to_id(std::string_view text) const override {
    for (size_t id = 0; id < bytes_.size(); ++id)
      if (vocab_.piece(static_cast<int64_t>(id)) == text) return static_cast<TokenId>(id);
    return std::nullopt;
  }
  std::string describe() const override {
    std::ostringstream os;
    os << "llama2.c/SentencePiece BPE (" << bytes_.size() << " tokens, byte fallback) from " << source_;
    return os.str();
  }

 private:
  io::Llama2cTokenizer vocab_;
  std::string source_;
  std::vector<std::string> bytes_;
};

}  // namespace

std::unique_ptr<Tokenizer> make_llama2c_tokenizer(io::Llama2cTokenizer vocab, const std::string& source) {
  return std::make_unique<Llama2cAdapter>(std::move(vocab), source);
}

std::unique_ptr<Tokenizer> load_tokenizer_file(const std::string& path, int64_t vocab_size) {
  if (!std::filesystem::is_directory(path) && path.ends_with(".bin"))
    return make_llama2c_tokenizer(io::Llama2cTokenizer::load(path, vocab_size), path);
  return Tokenizer::load(path);
}

}  // namespace corelm::model::detail
