#include "tokenizer/bpe_tokenizer.h"

#include <cstring>
#include <deque>
#include <sstream>

#include "corelm/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/unicode.h"

namespace corelm::tok {
namespace {

class BpeTokenizer final : public Tokenizer {
 public:
  explicit BpeTokenizer(BpeSpec spec)
      : source_(spec.source),
        model_(std::move(spec.tokens), spec.merges, spec.ignore_merges, spec.source, spec.unk_id, spec.fuse_unk),
        nfc_(spec.nfc),
        stages_(std::move(spec.stages)),
        added_(spec.added) {
    prefix_ = spec.prefix;
    suffix_ = spec.suffix;
    size_t n = model_.size();
    for (const AddedToken& t : spec.added) n = std::max(n, static_cast<size_t>(t.id) + 1);
    token_bytes_.resize(n);
    special_.assign(n, false);
    for (size_t id = 0; id < model_.size(); ++id) token_bytes_[id] = std::string(model_.token(id));
    for (const AddedToken& t : spec.added) {
      token_bytes_[t.id] = t.content;
      special_[t.id] = t.special;
      by_content_.insert(t.content, t.id);
    }
    offsets_.push_back(0);
    for (const std::string& b : token_bytes_) {
      arena_ += b;
      offsets_.push_back(static_cast<uint32_t>(arena_.size()));
    }
    arena_.append(16, '\0');  // slack for the 16-byte copies in decode()
    token_bytes_.clear();
    token_bytes_.shrink_to_fit();
    auto resolve = [&](const std::optional<std::string>& text, const char* what) -> std::optional<TokenId> {
      if (!text) return std::nullopt;
      auto id = token_to_id(*text);
      CORELM_CHECK(id.has_value(), FormatError, source_, ": ", what, " '", *text, "' is not in the vocabulary");
      return id;
    };
    bos_ = resolve(spec.bos_token, "bos_token");
    eos_ = resolve(spec.eos_token, "eos_token");
    pad_ = resolve(spec.pad_token, "pad_token");
    // GPT-2 style files name no special tokens: <|endoftext|> is then both BOS and EOS.
    if (!bos_ && !eos_) {
      if (auto eot = token_to_id("<|endoftext|>")) bos_ = eos_ = eot;
    }
    // The post-processor template says what add_special adds; tokenizer_config.json overrides.
    if (spec.add_bos.has_value() || spec.add_eos.has_value()) {
      prefix_.clear();
      suffix_.clear();
      if (spec.add_bos.value_or(false) && bos_) prefix_.push_back(*bos_);
      if (spec.add_eos.value_or(false) && eos_) suffix_.push_back(*eos_);
    }
    simple_split_ = stages_.size() == 1 && !stages_[0].add_prefix_space &&
                    (stages_[0].kind == PreTokStage::kSplit ||
                     (stages_[0].kind == PreTokStage::kByteLevel && stages_[0].use_regex));
    // Splitting the input at "\n" + non-space is exact only if some stage splits there and no
    // stage adds a prefix space to each piece.
    splits_at_newlines_ = false;
    for (const PreTokStage& s : stages_)
      if (s.kind == PreTokStage::kSplit || (s.kind == PreTokStage::kByteLevel && s.use_regex)) splits_at_newlines_ = true;
    for (const PreTokStage& s : stages_)
      if (s.add_prefix_space) splits_at_newlines_ = false;
    // An added token that holds a newline or swallows neighbouring whitespace could straddle the cut.
    for (const AddedToken& t : spec.added)
      if (t.lstrip || t.rstrip || t.content.find('\n') != std::string::npos) splits_at_newlines_ = false;
  }

  std::vector<TokenId> encode(std::string_view text, const EncodeOptions& options) const override {
    std::vector<TokenId> out;
    out.reserve(text.size() / 3 + 4);
    encode_append(text, options, out);
    return out;
  }

  void encode_append(std::string_view text, const EncodeOptions& options, std::vector<TokenId>& out) const override {
    if (options.add_special) out.insert(out.end(), prefix_.begin(), prefix_.end());
    size_t pos = 0;
    while (pos < text.size()) {
      AddedTokenMatcher::Match m = added_.next(text, pos, options.parse_special);
      size_t plain_end = m.id >= 0 ? m.begin : text.size();
      if (plain_end > pos) encode_plain(text.substr(pos, plain_end - pos), out);
      if (m.id < 0) break;
      out.push_back(m.id);
      pos = m.end;
    }
    if (options.add_special) out.insert(out.end(), suffix_.begin(), suffix_.end());
  }

  std::string decode(std::span<const TokenId> ids, bool skip_special) const override {
    // Two passes over a flat byte arena: size the output once, then copy.
    size_t total = 0;
    for (TokenId id : ids) {
      check_id(id);
      if (!(skip_special && special_[id])) total += offsets_[id + 1] - offsets_[id];
    }
    // Short tokens are copied as one fixed 16-byte block (the arena and the output carry 16 bytes
    // of slack), which avoids a libc call per token.
    std::string out(total + 16, '\0');
    char* dst = out.data();
    const char* src = arena_.data();
    for (TokenId id : ids) {
      if (skip_special && special_[id]) continue;
      size_t len = offsets_[id + 1] - offsets_[id];
      if (len <= 16) std::memcpy(dst, src + offsets_[id], 16);
      else std::memcpy(dst, src + offsets_[id], len);
      dst += len;
    }
    out.resize(total);
    return out;
  }

  std::string_view token_bytes(TokenId id) const override {
    check_id(id);
    return std::string_view(arena_).substr(offsets_[id], offsets_[id + 1] - offsets_[id]);
  }
  bool is_special(TokenId id) const override {
    check_id(id);
    return special_[id];
  }
  size_t vocab_size() const override { return offsets_.size() - 1; }
  std::string normalize(std::string_view text) const override { return nfc_ ? nfc(text) : std::string(text); }

  std::optional<TokenId> token_to_id(std::string_view text) const override {
    // Added-token content first, then the vocabulary spelling of the file (byte-level, as HF's
    // token_to_id takes it), then raw bytes.
    int32_t id = by_content_.find(text);
    if (id < 0) {
      if (auto bytes = byte_level_decode(text)) id = model_.find(*bytes);
    }
    if (id < 0) id = model_.find(text);
    if (id < 0) return std::nullopt;
    return id;
  }

  bool splits_at_newlines() const override { return splits_at_newlines_; }

  std::string describe() const override {
    std::ostringstream os;
    os << "byte-level BPE from " << source_ << ": " << vocab_size() << " tokens, " << model_.merge_count()
       << " merges, pre-tokenizer";
    for (const PreTokStage& s : stages_) {
      if (s.kind == PreTokStage::kDigits) os << " digits";
      else if (s.kind == PreTokStage::kSplit || s.use_regex) os << " " << name_of(s.pattern);
      else os << " bytelevel";
    }
    if (nfc_) os << ", NFC";
    if (model_.ignore_merges()) os << ", ignore_merges";
    return os.str();
  }

 private:
  void check_id(TokenId id) const {
    CORELM_CHECK(id >= 0 && static_cast<size_t>(id) < vocab_size(), ValueError, "token id ", id,
                 " is outside the vocabulary (size ", vocab_size(), ") of ", source_);
  }

  void encode_plain(std::string_view text, std::vector<TokenId>& out) const {
    std::string normalized;
    if (nfc_) {
      normalized = nfc(text);
      text = normalized;
    }
    thread_local PretokScratch scratch;
    thread_local std::vector<Span> spans;
    if (simple_split_) {
      spans.clear();
      split_pattern(stages_[0].pattern, text, scratch, spans);
      for (const Span& s : spans) model_.encode_piece(text.substr(s.begin, s.end - s.begin), out);
      return;
    }
    // General pipeline: each stage splits every piece the previous one produced. Pieces that a
    // stage rewrites (ByteLevel's prefix space) are kept alive in `owned`.
    std::deque<std::string> owned;
    std::vector<std::string_view> pieces{text}, next;
    std::vector<Span> local;
    for (const PreTokStage& st : stages_) {
      next.clear();
      for (std::string_view piece : pieces) {
        if (st.kind == PreTokStage::kByteLevel && st.add_prefix_space && (piece.empty() || piece[0] != ' ')) {
          owned.push_back(" " + std::string(piece));
          piece = owned.back();
        }
        local.clear();
        if (st.kind == PreTokStage::kDigits) split_digits(st.individual_digits, piece, local);
        else if (st.kind == PreTokStage::kSplit || st.use_regex) split_pattern(st.pattern, piece, scratch, local);
        else local.push_back({0, piece.size()});
        for (const Span& s : local) next.push_back(piece.substr(s.begin, s.end - s.begin));
      }
      pieces.swap(next);
    }
    for (std::string_view piece : pieces) model_.encode_piece(piece, out);
  }

  std::string source_;
  BpeModel model_;
  bool nfc_;
  std::vector<PreTokStage> stages_;
  AddedTokenMatcher added_;
  std::vector<std::string> token_bytes_;  // only while constructing
  std::string arena_;                     // bytes of all tokens, id after id
  std::vector<uint32_t> offsets_;         // token id's bytes: arena_[offsets_[id], offsets_[id + 1])
  std::vector<uint8_t> special_;
  StringIdMap by_content_;
  bool simple_split_ = false;
  bool splits_at_newlines_ = true;
};

}  // namespace

std::unique_ptr<Tokenizer> make_bpe_tokenizer(BpeSpec spec) { return std::make_unique<BpeTokenizer>(std::move(spec)); }

}  // namespace corelm::tok
