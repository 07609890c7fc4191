// Encoding is delegated to libsentencepiece. Decoding uses our own per-token byte table (pieces
// with "▁" as a space, <0xNN> byte pieces as raw bytes) so that decode() and the streaming
// decoder agree byte for byte and partial UTF-8 from byte fallback is handled in one place.
//
// Invalid UTF-8 policy: sentencepiece would replace invalid bytes by U+FFFD and lose them, so we
// encode each valid stretch separately (only the first, at offset 0, gets the dummy-prefix space)
// and emit each invalid byte as its <0xNN> byte-fallback piece: bytes round-trip exactly.
#include "tokenizer/spm_tokenizer.h"

#include <sentencepiece_processor.h>

#include <algorithm>
#include <iterator>
#include <sstream>

#include <nlohmann/json.hpp>

#include "corelm/error.h"
#include "tokenizer/file_io.h"
#include "tokenizer/flat_map.h"
#include "tokenizer/unicode.h"

namespace corelm::tok {
namespace {

// Minimal protobuf reading for the two things libsentencepiece does not expose: a copy of the
// model with add_dummy_prefix = false, and whether its normalizer is the identity.
bool read_varint(std::string_view s, size_t& pos, uint64_t& v) {
  v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (pos >= s.size()) return false;
    uint8_t b = static_cast<uint8_t>(s[pos++]);
    v |= uint64_t(b & 0x7F) << shift;
    if (!(b & 0x80)) return true;
  }
  return false;
}
void write_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

// One field of a serialized message: number, wire type, value (varint fields), payload
// (length-delimited fields) and the bytes [start, end) it occupies, key included.
struct ProtoField {
  uint32_t number = 0, wire = 0;
  uint64_t varint = 0;
  std::string_view payload;
  size_t start = 0, end = 0;
};

// Reads the field at `pos` and moves past it. On a corrupt message returns false and sets `why`
// to the reason ("" when a varint value is malformed), in the words of the error messages.
bool next_proto_field(std::string_view msg, size_t& pos, ProtoField& f, std::string& why) {
  f = ProtoField{};
  f.start = pos;
  uint64_t key;
  if (!read_varint(msg, pos, key)) return why = " (bad field key)", false;
  f.number = static_cast<uint32_t>(key >> 3);
  f.wire = key & 7;
  if (f.wire == 0) {
    if (!read_varint(msg, pos, f.varint)) return why = "", false;
  } else if (f.wire == 1 || f.wire == 5) {
    pos += f.wire == 1 ? 8 : 4;
  } else if (f.wire == 2) {
    uint64_t len;
    if (!read_varint(msg, pos, len) || len > msg.size() - pos) return why = " (bad length)", false;
    f.payload = msg.substr(pos, len);
    pos += len;
  } else {
    return why = " (wire type " + std::to_string(f.wire) + ")", false;
  }
  if (pos > msg.size()) return why = " (truncated)", false;
  f.end = pos;
  return true;
}

// NormalizerSpec is field 3 of ModelProto. Appending the field wins over an earlier value, so the
// submessage is copied with add_dummy_prefix (field 3, varint 0: bytes 0x18 0x00) appended.
std::string without_dummy_prefix(const std::string& proto, const std::string& source) {
  std::string out;
  size_t pos = 0;
  bool patched = false;
  ProtoField f;
  std::string why;
  while (pos < proto.size()) {
    CORELM_CHECK(next_proto_field(proto, pos, f, why), FormatError, source, ": corrupt SentencePiece model", why);
    if (f.number == 3 && f.wire == 2) {
      std::string sub = std::string(f.payload) + std::string("\x18\x00", 2);
      write_varint(out, (uint64_t{3} << 3) | 2);
      write_varint(out, sub.size());
      out += sub;
      patched = true;
    } else {
      out.append(proto, f.start, f.end - f.start);
    }
  }
  if (!patched) out += std::string("\x1a\x02\x18\x00", 4);  // normalizer_spec { add_dummy_prefix: false }
  return out;
}

// Whether the model's normalizer is the identity without whitespace clean-up (Llama 2): only then
// is the text after a newline encoded the same on its own (given no piece holds a newline).
bool identity_normalizer(const std::string& proto) {
  size_t pos = 0;
  ProtoField f;
  std::string why;
  while (pos < proto.size()) {
    if (!next_proto_field(proto, pos, f, why)) return false;
    if (f.number != 3 || f.wire != 2) continue;
    std::string_view name;
    bool remove_extra_ws = true, charsmap = false;  // proto defaults
    size_t q = 0;
    ProtoField g;
    while (q < f.payload.size()) {
      if (!next_proto_field(f.payload, q, g, why)) return false;
      if (g.number == 4 && g.wire == 0) remove_extra_ws = g.varint != 0;
      if (g.number == 1 && g.wire == 2) name = g.payload;
      if (g.number == 2 && g.wire == 2 && !g.payload.empty()) charsmap = true;
    }
    return name == "identity" && !remove_extra_ws && !charsmap;
  }
  return false;
}

class SpmTokenizer final : public Tokenizer {
 public:
  SpmTokenizer(const std::string& path, const std::string& config_path) : source_(path) {
    std::fill(std::begin(byte_piece_), std::end(byte_piece_), -1);
    std::string proto = read_file(path);
    auto status = sp_.LoadFromSerializedProto(proto);
    CORELM_CHECK(status.ok(), FormatError, path, ": not a SentencePiece model: ", status.ToString());
    status = sp_tail_.LoadFromSerializedProto(without_dummy_prefix(proto, path));
    CORELM_CHECK(status.ok(), FormatError, path, ": SentencePiece model could not be re-read: ", status.ToString());
    split_lines_ = identity_normalizer(proto);
    size_t n = static_cast<size_t>(sp_.GetPieceSize());
    bytes_.resize(n);
    special_.assign(n, false);
    for (int id = 0; id < static_cast<int>(n); ++id) {
      const std::string& piece = sp_.IdToPiece(id);
      piece_ids_.insert(piece, id);
      if (piece.find('\n') != std::string::npos) split_lines_ = false;
      if (sp_.IsByte(id)) {
        // "<0xNN>"
        unsigned value = static_cast<unsigned>(std::stoul(piece.substr(3, 2), nullptr, 16));
        bytes_[id] = std::string(1, static_cast<char>(value));
        byte_piece_[value] = id;
      } else if (sp_.IsControl(id)) {
        bytes_[id] = piece;
        special_[id] = true;
      } else if (sp_.IsUnknown(id)) {
        bytes_[id] = " \xE2\x81\x87 ";  // sentencepiece renders <unk> as " ⁇ "
        special_[id] = true;
      } else {
        std::string text;
        for (size_t i = 0; i < piece.size();) {
          if (piece.compare(i, 3, "\xE2\x96\x81") == 0) { text.push_back(' '); i += 3; }
          else text.push_back(piece[i++]);
        }
        bytes_[id] = text;
      }
    }
    if (sp_.bos_id() >= 0) bos_ = sp_.bos_id();
    if (sp_.eos_id() >= 0) eos_ = sp_.eos_id();
    if (sp_.pad_id() >= 0) pad_ = sp_.pad_id();
    bool add_bos = bos_.has_value(), add_eos = false;  // Llama convention: BOS yes, EOS no
    if (file_exists(config_path)) {
      nlohmann::json cfg;
      try {
        cfg = nlohmann::json::parse(read_file(config_path));
      } catch (const nlohmann::json::exception& e) {
        throw FormatError(config_path + ": invalid JSON: " + e.what());
      }
      if (cfg.contains("add_bos_token") && cfg["add_bos_token"].is_boolean()) add_bos = cfg["add_bos_token"].get<bool>() && bos_;
      if (cfg.contains("add_eos_token") && cfg["add_eos_token"].is_boolean()) add_eos = cfg["add_eos_token"].get<bool>() && eos_;
    }
    if (add_bos) prefix_.push_back(*bos_);
    if (add_eos) suffix_.push_back(*eos_);
  }

  std::vector<TokenId> encode(std::string_view text, const EncodeOptions& options) const override {
    std::vector<TokenId> out;
    encode_append(text, options, out);
    return out;
  }

  void encode_append(std::string_view text, const EncodeOptions& options, std::vector<TokenId>& out) const override {
    if (options.add_special) out.insert(out.end(), prefix_.begin(), prefix_.end());
    const auto* p = reinterpret_cast<const unsigned char*>(text.data());
    size_t n = text.size(), i = 0, run = 0;
    std::vector<int> ids;
    auto encode_piece = [&](size_t begin, size_t end) {
      const sentencepiece::SentencePieceProcessor& sp = begin == 0 ? sp_ : sp_tail_;
      auto status = sp.Encode(text.substr(begin, end - begin), &ids);
      CORELM_CHECK(status.ok(), Error, source_, ": SentencePiece encode failed: ", status.ToString());
      out.insert(out.end(), ids.begin(), ids.end());
    };
    // sentencepiece slows down badly on one huge input; when no piece can span a newline and the
    // normalizer is the identity, long text is encoded in stretches that end just after one.
    auto flush_run = [&](size_t end) {
      size_t begin = run;
      while (split_lines_ && end - begin > kSplitBytes) {
        size_t nl = text.find('\n', begin + kSplitBytes);
        if (nl == std::string_view::npos || nl + 1 >= end) break;
        encode_piece(begin, nl + 1);
        begin = nl + 1;
      }
      if (end > begin) encode_piece(begin, end);
    };
    while (i < n) {
      int len;
      uint32_t cp = decode_utf8(p + i, n - i, &len);
      if (cp < kInvalidBase) { i += len; continue; }
      flush_run(i);
      CORELM_CHECK(byte_piece_[p[i]] >= 0, ValueError, "invalid UTF-8 at byte ", i, " and ", source_,
                   " has no byte-fallback piece for it");
      out.push_back(byte_piece_[p[i]]);
      run = ++i;
    }
    flush_run(n);
    if (options.add_special) out.insert(out.end(), suffix_.begin(), suffix_.end());
  }

  std::string decode(std::span<const TokenId> ids, bool skip_special) const override {
    std::string out;
    bool first = true;
    for (TokenId id : ids) {
      check_id(id);
      if (skip_special && special_[id] && !sp_.IsUnknown(id)) continue;
      std::string_view b = bytes_[id];
      if (first && !b.empty() && !special_[id]) {
        if (b[0] == ' ') b.remove_prefix(1);
        first = false;
      }
      out += b;
    }
    return out;
  }

  std::string_view token_bytes(TokenId id) const override {
    check_id(id);
    return bytes_[id];
  }
  bool strips_leading_space() const override { return true; }
  bool is_special(TokenId id) const override {
    check_id(id);
    return special_[id];
  }
  size_t vocab_size() const override { return bytes_.size(); }
  std::optional<TokenId> token_to_id(std::string_view piece) const override {
    int32_t id = piece_ids_.find(piece);
    if (id < 0) return std::nullopt;
    return id;
  }
  std::string describe() const override {
    std::ostringstream os;
    os << "SentencePiece model " << source_ << ": " << bytes_.size() << " pieces";
    return os.str();
  }

 private:
  void check_id(TokenId id) const {
    CORELM_CHECK(id >= 0 && static_cast<size_t>(id) < bytes_.size(), ValueError, "token id ", id,
                 " is outside the vocabulary (size ", bytes_.size(), ") of ", source_);
  }
  std::string source_;
  static constexpr size_t kSplitBytes = 2048;
  sentencepiece::SentencePieceProcessor sp_, sp_tail_;
  bool split_lines_ = false;
  std::vector<std::string> bytes_;
  std::vector<bool> special_;
  StringIdMap piece_ids_;
  int32_t byte_piece_[256];
};

}  // namespace

std::unique_ptr<Tokenizer> load_sentencepiece(const std::string& model_path, const std::string& config_path) {
  return std::make_unique<SpmTokenizer>(model_path, config_path);
}

}  // namespace corelm::tok
