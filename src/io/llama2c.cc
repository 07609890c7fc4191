// llama2.c checkpoint and tokenizer readers. Layout as in llama2.c run.c memory_map_weights():
// all weights of one kind for every layer are stored together ([layer][out][in], row-major like
// PyTorch's Linear), followed by the two legacy RoPE tables, then wcls when not shared.
#include "corelm/llama2c.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>

#include "corelm/error.h"

namespace corelm::io {

namespace {

// Size of a regular file. A FIFO or a device (/dev/zero) has no size to check a header against
// and could be read until memory runs out, so it is refused before anything is read.
uint64_t regular_file_size(const std::string& path) {
  struct stat st {};
  CORELM_CHECK(::stat(path.c_str(), &st) == 0, IOError, "llama2.c: cannot open '", path, "': ", std::strerror(errno));
  CORELM_CHECK(S_ISREG(st.st_mode), IOError, "llama2.c: '", path,
               "' is not a regular file (a FIFO, device or socket cannot be read as a checkpoint or tokenizer)");
  return static_cast<uint64_t>(st.st_size);
}

// Reads exactly `size` bytes (what stat reported and the caller checked).
std::string read_file_bytes(const std::string& path, uint64_t size) {
  std::ifstream in(path, std::ios::binary);
  CORELM_CHECK(in.good(), IOError, "llama2.c: cannot open '", path, "'");
  std::string bytes(static_cast<size_t>(size), '\0');
  in.read(bytes.data(), static_cast<std::streamsize>(size));
  CORELM_CHECK(!in.bad() && static_cast<uint64_t>(in.gcount()) == size, IOError, "llama2.c: error reading '", path,
               "' (", in.gcount(), " of ", size, " bytes; did it change while being read?)");
  return bytes;
}

// tokenizer.bin files are at most a few MB (32K pieces); the bound refuses a huge file that is
// not one before reading it whole.
constexpr uint64_t kMaxTokenizerBytes = 1ull << 30;

std::string read_whole_file(const std::string& path) {
  const uint64_t size = regular_file_size(path);
  CORELM_CHECK(size <= kMaxTokenizerBytes, FormatError, "llama2.c tokenizer '", path, "': ", size,
               " bytes is more than a tokenizer.bin holds (limit ", kMaxTokenizerBytes, ")");
  return read_file_bytes(path, size);
}

Llama2cHeader parse_header(const std::string& bytes, const std::string& path) {
  CORELM_CHECK(bytes.size() >= 28, FormatError, "llama2.c checkpoint '", path, "': ", bytes.size(),
               " bytes is shorter than the 28-byte header");
  int32_t h[7];
  std::memcpy(h, bytes.data(), sizeof(h));
  Llama2cHeader hd;
  hd.dim = h[0];
  hd.hidden_dim = h[1];
  hd.n_layers = h[2];
  hd.n_heads = h[3];
  hd.n_kv_heads = h[4];
  hd.shared_classifier = h[5] > 0;
  hd.vocab_size = h[5] < 0 ? -h[5] : h[5];
  hd.seq_len = h[6];
  // Bounds well past any llama2.c model; they catch a file that is not a checkpoint.
  auto in_range = [](int32_t v, int32_t hi) { return v > 0 && v <= hi; };
  CORELM_CHECK(in_range(hd.dim, 1 << 16) && in_range(hd.hidden_dim, 1 << 18) && in_range(hd.n_layers, 1024) &&
                   in_range(hd.n_heads, 1024) && in_range(hd.n_kv_heads, 1024) &&
                   in_range(hd.vocab_size, 1 << 22) && in_range(hd.seq_len, 1 << 22),
               FormatError, "llama2.c checkpoint '", path, "': implausible header {dim ", hd.dim, ", hidden_dim ",
               hd.hidden_dim, ", n_layers ", hd.n_layers, ", n_heads ", hd.n_heads, ", n_kv_heads ", hd.n_kv_heads,
               ", vocab_size ", h[5], ", seq_len ", hd.seq_len, "}");
  CORELM_CHECK(hd.dim % hd.n_heads == 0 && hd.n_heads % hd.n_kv_heads == 0 && (hd.dim / hd.n_heads) % 2 == 0,
               FormatError, "llama2.c checkpoint '", path, "': dim ", hd.dim, " / n_heads ", hd.n_heads,
               " / n_kv_heads ", hd.n_kv_heads, " do not give an even head size shared by whole KV groups");
  return hd;
}

}  // namespace

Llama2cHeader read_llama2c_header(const std::string& path) {
  regular_file_size(path);
  std::ifstream in(path, std::ios::binary);
  CORELM_CHECK(in.good(), IOError, "llama2.c: cannot open '", path, "'");
  std::string bytes(28, '\0');
  in.read(bytes.data(), 28);
  bytes.resize(static_cast<size_t>(in.gcount()));
  return parse_header(bytes, path);
}

Llama2cCheckpoint load_llama2c_checkpoint(const std::string& path) {
  // The header first: the size it implies is checked against the file's before the weights are read.
  const uint64_t file_size = regular_file_size(path);
  Llama2cCheckpoint ck;
  const Llama2cHeader hd = ck.header = read_llama2c_header(path);
  const int64_t dim = hd.dim, hidden = hd.hidden_dim, layers = hd.n_layers, vocab = hd.vocab_size;
  const int64_t head_dim = dim / hd.n_heads, q_dim = hd.n_heads * head_dim, kv_dim = hd.n_kv_heads * head_dim;
  const int64_t rope_tables = 2 * static_cast<int64_t>(hd.seq_len) * head_dim / 2;

  const int64_t expected_floats = vocab * dim + layers * (2 * dim + dim * q_dim + 2 * dim * kv_dim + q_dim * dim +
                                                          3 * dim * hidden) +
                                  dim + rope_tables + (hd.shared_classifier ? 0 : vocab * dim);
  const uint64_t expected_bytes = 28 + static_cast<uint64_t>(expected_floats) * 4;
  CORELM_CHECK(file_size == expected_bytes, FormatError, "llama2.c checkpoint '", path, "': ", file_size,
               " bytes but its header {dim ", dim, ", hidden_dim ", hidden, ", n_layers ", layers, ", n_heads ",
               hd.n_heads, ", n_kv_heads ", hd.n_kv_heads, ", vocab_size ", vocab, ", seq_len ", hd.seq_len,
               (hd.shared_classifier ? ", shared classifier" : ", separate classifier"), "} needs ", expected_bytes);
  const std::string bytes = read_file_bytes(path, file_size);

  size_t pos = 28;
  // One stacked block [layers, rows, cols] (layers = 0 for a single tensor).
  auto take = [&](int64_t count) {
    Tensor t = Tensor::empty({count});
    std::memcpy(t.data<float>(), bytes.data() + pos, static_cast<size_t>(count) * 4);
    pos += static_cast<size_t>(count) * 4;
    return t;
  };
  // The arrays in file order under llama2.c's own names (TransformerWeights), per-layer ones
  // stacked [layers, rows, cols]; what they mean is the model's business (corelm/architecture.h).
  auto& out = ck.tensors;
  out.emplace_back("token_embedding_table", take(vocab * dim).view({vocab, dim}));
  out.emplace_back("rms_att_weight", take(layers * dim).view({layers, dim}));
  out.emplace_back("wq", take(layers * q_dim * dim).view({layers, q_dim, dim}));
  out.emplace_back("wk", take(layers * kv_dim * dim).view({layers, kv_dim, dim}));
  out.emplace_back("wv", take(layers * kv_dim * dim).view({layers, kv_dim, dim}));
  out.emplace_back("wo", take(layers * dim * q_dim).view({layers, dim, q_dim}));
  out.emplace_back("rms_ffn_weight", take(layers * dim).view({layers, dim}));
  out.emplace_back("w1", take(layers * hidden * dim).view({layers, hidden, dim}));
  out.emplace_back("w2", take(layers * dim * hidden).view({layers, dim, hidden}));
  out.emplace_back("w3", take(layers * hidden * dim).view({layers, hidden, dim}));
  out.emplace_back("rms_final_weight", take(dim));
  pos += static_cast<size_t>(rope_tables) * 4;  // legacy freq_cis_real / freq_cis_imag
  if (!hd.shared_classifier) out.emplace_back("wcls", take(vocab * dim).view({vocab, dim}));
  return ck;
}

// ---------------------------------------------------------------------------------------------
// Tokenizer

Llama2cTokenizer Llama2cTokenizer::load(const std::string& path, int64_t vocab_size) {
  const std::string bytes = read_whole_file(path);
  Llama2cTokenizer tok;
  size_t pos = 0;
  auto need = [&](size_t n, int64_t token) {
    CORELM_CHECK(bytes.size() - pos >= n, FormatError, "llama2.c tokenizer '", path, "': truncated at byte ", pos,
                 (token >= 0 ? " (token " + std::to_string(token) + ")" : std::string(" (header)")));
  };
  need(4, -1);
  int32_t max_len;
  std::memcpy(&max_len, bytes.data(), 4);
  pos = 4;
  CORELM_CHECK(max_len > 0 && max_len < (1 << 20), FormatError, "llama2.c tokenizer '", path,
               "': implausible max_token_length ", max_len);
  tok.max_token_length_ = max_len;
  for (int64_t id = 0; vocab_size < 0 ? pos < bytes.size() : id < vocab_size; ++id) {
    need(8, id);
    float score;
    int32_t len;
    std::memcpy(&score, bytes.data() + pos, 4);
    std::memcpy(&len, bytes.data() + pos + 4, 4);
    pos += 8;
    CORELM_CHECK(len >= 0 && len <= max_len, FormatError, "llama2.c tokenizer '", path, "': token ", id,
                 " has length ", len, " (max_token_length ", max_len, ")");
    need(static_cast<size_t>(len), id);
    tok.pieces_.emplace_back(bytes.data() + pos, static_cast<size_t>(len));
    tok.scores_.push_back(score);
    pos += static_cast<size_t>(len);
  }
  CORELM_CHECK(!tok.pieces_.empty(), FormatError, "llama2.c tokenizer '", path, "': no tokens");
  for (size_t i = 0; i < tok.pieces_.size(); ++i) tok.sorted_.emplace_back(tok.pieces_[i], static_cast<int64_t>(i));
  // Stable: on duplicate pieces the lowest id wins.
  std::stable_sort(tok.sorted_.begin(), tok.sorted_.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  return tok;
}

Llama2cTokenizer Llama2cTokenizer::from_gguf_pieces(const std::vector<std::string>& pieces,
                                                   const std::vector<float>& scores, const std::string& source) {
  CORELM_CHECK(pieces.size() == scores.size(), FormatError, source, ": tokenizer.ggml.scores has ", scores.size(),
               " entries for ", pieces.size(), " tokens");
  CORELM_CHECK(pieces.size() > 258, FormatError, source, ": a SentencePiece-style vocabulary of ", pieces.size(),
               " tokens cannot hold the 256 byte pieces after <unk>, <s>, </s>");
  for (int b = 0; b < 256; ++b) {
    char want[8];
    std::snprintf(want, sizeof want, "<0x%02X>", b);
    CORELM_CHECK(pieces[b + 3] == want, FormatError, source, ": tokenizer.ggml.tokens[", b + 3, "] is '",
                 pieces[b + 3], "', expected the byte piece ", want, " (byte fallback needs id = byte + 3)");
  }
  Llama2cTokenizer tok;
  size_t longest = 1;
  for (size_t id = 0; id < pieces.size(); ++id) {
    std::string p = pieces[id];
    if (id == kBos || id == kEos) p = id == kBos ? "\n<s>\n" : "\n</s>\n";  // as llama2.c's export writes them
    std::string spaced;
    for (size_t i = 0; i < p.size(); ++i) {
      if (p.compare(i, 3, "\xe2\x96\x81") == 0) {
        spaced += ' ';
        i += 2;
      } else {
        spaced += p[i];
      }
    }
    longest = std::max(longest, spaced.size());
    tok.pieces_.push_back(std::move(spaced));
    tok.scores_.push_back(scores[id]);
  }
  tok.max_token_length_ = static_cast<int64_t>(longest);
  for (size_t i = 0; i < tok.pieces_.size(); ++i) tok.sorted_.emplace_back(tok.pieces_[i], static_cast<int64_t>(i));
  std::stable_sort(tok.sorted_.begin(), tok.sorted_.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  return tok;
}

const std::string& Llama2cTokenizer::piece(int64_t id) const {
  CORELM_CHECK(id >= 0 && id < vocab_size(), IndexError, "llama2.c tokenizer: token id ", id,
               " out of range for vocab size ", vocab_size());
  return pieces_[static_cast<size_t>(id)];
}

float Llama2cTokenizer::score(int64_t id) const {
  piece(id);
  return scores_[static_cast<size_t>(id)];
}

int64_t Llama2cTokenizer::lookup(const std::string& s) const {
  auto it = std::lower_bound(sorted_.begin(), sorted_.end(), s,
                             [](const auto& e, const std::string& key) { return e.first < key; });
  return it != sorted_.end() && it->first == s ? it->second : -1;
}

std::vector<int64_t> Llama2cTokenizer::encode(const std::string& text, bool bos, bool eos) const {
  std::vector<int64_t> ids;
  if (bos) ids.push_back(kBos);
  if (!text.empty()) {
    const int64_t space = lookup(" ");
    CORELM_CHECK(space >= 0, ValueError, "llama2.c tokenizer: vocabulary has no \" \" piece for the dummy prefix");
    ids.push_back(space);
  }
  // One UTF-8 code point at a time (at most 4 bytes); unknown ones fall back to byte tokens.
  std::string cp;
  for (size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if ((c & 0xC0) != 0x80) cp.clear();
    cp.push_back(static_cast<char>(c));
    const bool next_is_continuation =
        i + 1 < text.size() && (static_cast<unsigned char>(text[i + 1]) & 0xC0) == 0x80;
    if (next_is_continuation && cp.size() < 4) continue;
    const int64_t id = lookup(cp);
    if (id >= 0) {
      ids.push_back(id);
    } else {
      for (unsigned char b : cp) ids.push_back(static_cast<int64_t>(b) + 3);
    }
    cp.clear();
  }
  // Greedy merges: the adjacent pair whose concatenation scores best (first such pair on ties),
  // as run.c does. run.c rescans every pair per merge (quadratic in the text); here a heap of
  // candidate pairs over a linked list gives the same merges in O(n log n). Merging never reorders
  // the surviving symbols, so "first" is the smallest original index of the left symbol; an entry
  // is stale once either side has changed since it was pushed.
  const size_t n = ids.size();
  std::vector<size_t> next(n), prev(n);
  std::vector<uint32_t> version(n, 0);
  std::vector<bool> alive(n, true);
  for (size_t i = 0; i < n; ++i) {
    next[i] = i + 1;
    prev[i] = i - 1;  // wraps for i == 0; never read
  }
  struct Candidate {
    float score;
    size_t left, right;
    uint32_t left_version, right_version;
    int64_t merged;
  };
  auto worse = [](const Candidate& a, const Candidate& b) {
    return a.score != b.score ? a.score < b.score : a.left > b.left;
  };
  std::vector<Candidate> heap;
  auto push = [&](size_t left) {
    if (left >= n || next[left] >= n) return;
    const size_t right = next[left];
    const int64_t id = lookup(pieces_[ids[left]] + pieces_[ids[right]]);
    if (id < 0) return;
    heap.push_back({scores_[id], left, right, version[left], version[right], id});
    std::push_heap(heap.begin(), heap.end(), worse);
  };
  for (size_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), worse);
    const Candidate c = heap.back();
    heap.pop_back();
    if (!alive[c.left] || !alive[c.right] || next[c.left] != c.right || version[c.left] != c.left_version ||
        version[c.right] != c.right_version)
      continue;
    ids[c.left] = c.merged;
    ++version[c.left];
    alive[c.right] = false;
    next[c.left] = next[c.right];
    if (next[c.left] < n) prev[next[c.left]] = c.left;
    if (c.left != 0) push(prev[c.left]);  // symbol 0 is never a right side, so it is never removed
    push(c.left);
  }
  std::vector<int64_t> merged;
  merged.reserve(n);
  for (size_t i = 0; i < n; ++i)
    if (alive[i]) merged.push_back(ids[i]);
  ids = std::move(merged);
  if (eos) ids.push_back(kEos);
  return ids;
}

std::string Llama2cTokenizer::decode(int64_t prev, int64_t id) const {
  std::string p = piece(id);
  if (prev == kBos && !p.empty() && p[0] == ' ') p.erase(0, 1);
  // "<0xXX>" byte pieces (run.c parses them with sscanf "<0x%02hhX>").
  if (p.size() == 6 && p.compare(0, 3, "<0x") == 0 && p[5] == '>') {
    auto hex = [](char ch) -> int {
      if (ch >= '0' && ch <= '9') return ch - '0';
      if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
      if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
      return -1;
    };
    const int hi = hex(p[3]), lo = hex(p[4]);
    if (hi >= 0 && lo >= 0) return std::string(1, static_cast<char>(hi * 16 + lo));
  }
  return p;
}

std::string Llama2cTokenizer::printable(const std::string& piece) {
  const std::string s = piece.substr(0, std::min(piece.size(), piece.find('\0')));
  if (s.size() == 1) {
    const auto b = static_cast<unsigned char>(s[0]);
    const bool print = b >= 0x20 && b < 0x7F;
    const bool space = b == ' ' || (b >= '\t' && b <= '\r');
    if (!print && !space) return {};
  }
  return s;
}

std::vector<std::pair<std::string, GGUFValue>> Llama2cTokenizer::gguf_metadata() const {
  std::vector<GGUFValue> tokens, scores, types;
  for (int64_t id = 0; id < vocab_size(); ++id) {
    std::string p = pieces_[id];
    int32_t type = 1;
    if (id == 0) type = 2;
    if (id == kBos || id == kEos) {
      type = 3;
      p = id == kBos ? "<s>" : "</s>";  // llama2.c's export wraps them in newlines
    }
    const bool byte = p.size() == 6 && p.compare(0, 3, "<0x") == 0 && p[5] == '>';
    if (byte) type = 6;
    if (type == 1) {
      std::string spm;
      for (char ch : p) spm += ch == ' ' ? std::string("\xe2\x96\x81") : std::string(1, ch);
      p = spm;
    }
    tokens.push_back(GGUFValue::of_string(p));
    scores.push_back(GGUFValue::of_float(GGUFType::Float32, scores_[id]));
    types.push_back(GGUFValue::of(GGUFType::Int32, type));
  }
  return {{"tokenizer.ggml.model", GGUFValue::of_string("llama")},
          {"tokenizer.ggml.tokens", GGUFValue::of_array(GGUFType::String, std::move(tokens))},
          {"tokenizer.ggml.scores", GGUFValue::of_array(GGUFType::Float32, std::move(scores))},
          {"tokenizer.ggml.token_type", GGUFValue::of_array(GGUFType::Int32, std::move(types))},
          {"tokenizer.ggml.bos_token_id", GGUFValue::of(GGUFType::Uint32, kBos)},
          {"tokenizer.ggml.eos_token_id", GGUFValue::of(GGUFType::Uint32, kEos)},
          {"tokenizer.ggml.unknown_token_id", GGUFValue::of(GGUFType::Uint32, 0)},
          {"tokenizer.ggml.add_bos_token", GGUFValue::of(GGUFType::Bool, 1)},
          {"tokenizer.ggml.add_eos_token", GGUFValue::of(GGUFType::Bool, 0)}};
}

}  // namespace corelm::io
