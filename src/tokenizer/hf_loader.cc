// Reads Hugging Face tokenizer.json files and GPT-2 vocab.json + merges.txt pairs into a BpeSpec.
// Every field that changes the ids is either implemented exactly or rejected with an error that
// names it: a tokenizer that silently differs from the reference is worse than none.
#include <algorithm>
#include <fstream>
#include <unordered_map>
#include <sstream>

#include "corelm/error.h"
#include "tokenizer/bpe_tokenizer.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/file_io.h"

namespace corelm::tok {
namespace {

using nlohmann::json;

[[noreturn]] void unsupported(const std::string& source, const std::string& field, const std::string& what) {
  throw FormatError(source + ": unsupported " + field + ": " + what);
}

std::string type_of(const json& j, const std::string& source, const std::string& field) {
  CORELM_CHECK(j.is_object() && j.contains("type") && j["type"].is_string(), FormatError, source, ": ", field,
               " must be an object with a string \"type\"");
  return j["type"].get<std::string>();
}

bool flag(const json& j, const char* key, bool fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  return j[key].get<bool>();
}

void parse_normalizer(const json& j, const std::string& source, const std::string& field, BpeSpec& spec) {
  if (j.is_null()) return;
  std::string type = type_of(j, source, field);
  if (type == "NFC") {
    spec.nfc = true;
  } else if (type == "Sequence") {
    const json& list = j.value("normalizers", json::array());
    for (size_t i = 0; i < list.size(); ++i)
      parse_normalizer(list[i], source, field + ".normalizers[" + std::to_string(i) + "]", spec);
  } else {
    unsupported(source, field + ".type", "'" + type + "' (supported: NFC, Sequence)");
  }
}

void parse_pre_tokenizer(const json& j, const std::string& source, const std::string& field, BpeSpec& spec) {
  std::string type = type_of(j, source, field);
  PreTokStage st;
  if (type == "Sequence") {
    const json& list = j.value("pretokenizers", json::array());
    for (size_t i = 0; i < list.size(); ++i)
      parse_pre_tokenizer(list[i], source, field + ".pretokenizers[" + std::to_string(i) + "]", spec);
    return;
  } else if (type == "ByteLevel") {
    st.kind = PreTokStage::kByteLevel;
    st.add_prefix_space = flag(j, "add_prefix_space", false);
    st.use_regex = flag(j, "use_regex", true);
    st.pattern = SplitPattern::kGpt2;
  } else if (type == "Split") {
    st.kind = PreTokStage::kSplit;
    const json& pattern = j.value("pattern", json());
    CORELM_CHECK(pattern.is_object() && pattern.contains("Regex") && pattern["Regex"].is_string(), FormatError,
                 source, ": unsupported ", field, ".pattern: only {\"Regex\": ...} patterns are implemented");
    std::string regex = pattern["Regex"].get<std::string>();
    if (!pattern_from_regex(regex, &st.pattern))
      unsupported(source, field + ".pattern.Regex",
                  "'" + regex + "' is not one of the GPT-2, Llama-3 or Qwen2 patterns this tokenizer implements");
    std::string behavior = j.value("behavior", std::string("Isolated"));
    if (behavior != "Isolated") unsupported(source, field + ".behavior", "'" + behavior + "' (only Isolated)");
    if (flag(j, "invert", false)) unsupported(source, field + ".invert", "true");
  } else if (type == "Digits") {
    st.kind = PreTokStage::kDigits;
    st.individual_digits = flag(j, "individual_digits", false);
  } else {
    unsupported(source, field + ".type", "'" + type + "' (supported: ByteLevel, Split, Digits, Sequence)");
  }
  spec.stages.push_back(st);
}

void parse_decoder(const json& j, const std::string& source, const std::string& field) {
  if (j.is_null()) return;
  std::string type = type_of(j, source, field);
  if (type == "ByteLevel") return;
  if (type == "Sequence") {
    const json& list = j.value("decoders", json::array());
    for (size_t i = 0; i < list.size(); ++i) parse_decoder(list[i], source, field + ".decoders[" + std::to_string(i) + "]");
    return;
  }
  unsupported(source, field + ".type", "'" + type + "' (supported: ByteLevel)");
}

void parse_post_processor(const json& j, const std::string& source, const std::string& field,
                          const std::vector<AddedToken>& added, const std::vector<std::string>& vocab_text,
                          BpeSpec& spec) {
  if (j.is_null()) return;
  std::string type = type_of(j, source, field);
  if (type == "ByteLevel") return;
  if (type == "Sequence") {
    const json& list = j.value("processors", json::array());
    for (size_t i = 0; i < list.size(); ++i)
      parse_post_processor(list[i], source, field + ".processors[" + std::to_string(i) + "]", added, vocab_text, spec);
    return;
  }
  if (type != "TemplateProcessing") unsupported(source, field + ".type", "'" + type + "'");
  // single: [SpecialToken..., Sequence A, SpecialToken...]; special_tokens maps names to ids.
  const json& single = j.value("single", json::array());
  const json& specials = j.value("special_tokens", json::object());
  bool seen_sequence = false;
  for (size_t i = 0; i < single.size(); ++i) {
    const json& piece = single[i];
    if (piece.contains("Sequence")) {
      seen_sequence = true;
      continue;
    }
    CORELM_CHECK(piece.contains("SpecialToken"), FormatError, source, ": ", field, ".single[", i,
                 "] is neither SpecialToken nor Sequence");
    std::string name = piece["SpecialToken"].value("id", std::string());
    CORELM_CHECK(specials.contains(name), FormatError, source, ": ", field, ".special_tokens lacks '", name, "'");
    for (const json& id : specials[name].value("ids", json::array()))
      (seen_sequence ? spec.suffix : spec.prefix).push_back(id.get<int32_t>());
  }
}

// Undoes the byte-level spelling of the model vocabulary into token bytes, indexed by id.
std::vector<std::string> vocab_bytes(const json& vocab, const std::string& source, const std::string& field,
                                     std::vector<std::string>* spelled) {
  CORELM_CHECK(vocab.is_object(), FormatError, source, ": ", field, " must be an object of token -> id");
  size_t size = 0;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    CORELM_CHECK(it.value().is_number_integer() && it.value().get<int64_t>() >= 0 &&
                     it.value().get<int64_t>() < (int64_t(1) << 31),
                 FormatError, source, ": ", field, "['", it.key(), "'] is not a valid id");
    size = std::max(size, static_cast<size_t>(it.value().get<int64_t>()) + 1);
  }
  std::vector<std::string> tokens(size);
  spelled->assign(size, std::string());
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    size_t id = it.value().get<size_t>();
    CORELM_CHECK((*spelled)[id].empty(), FormatError, source, ": ", field, " maps two tokens to id ", id);
    (*spelled)[id] = it.key();
    // Tokens outside the byte table (special tokens written verbatim) stand for their own text.
    auto bytes = byte_level_decode(it.key());
    tokens[id] = bytes ? *bytes : it.key();
  }
  return tokens;
}

std::vector<BpeModel::MergeRule> resolve_merges(const std::vector<std::pair<std::string, std::string>>& pairs,
                                                const std::vector<std::string>& spelled, const std::string& source,
                                                const std::string& field) {
  std::unordered_map<std::string, int32_t> index;
  index.reserve(spelled.size());
  for (size_t id = 0; id < spelled.size(); ++id)
    if (!spelled[id].empty()) index.emplace(spelled[id], static_cast<int32_t>(id));
  std::vector<BpeModel::MergeRule> rules;
  rules.reserve(pairs.size());
  for (size_t r = 0; r < pairs.size(); ++r) {
    auto find = [&](const std::string& s) {
      auto it = index.find(s);
      CORELM_CHECK(it != index.end(), FormatError, source, ": ", field, "[", r, "] ('", pairs[r].first, " ",
                   pairs[r].second, "') uses '", s, "', which is not in the vocabulary");
      return it->second;
    };
    rules.push_back({find(pairs[r].first), find(pairs[r].second), find(pairs[r].first + pairs[r].second)});
  }
  return rules;
}

}  // namespace

BpeSpec parse_hf_tokenizer_json(const json& doc, const std::string& source) {
  BpeSpec spec;
  spec.source = source;
  CORELM_CHECK(doc.is_object(), FormatError, source, ": not a JSON object");
  CORELM_CHECK(doc.contains("model") && doc["model"].is_object(), FormatError, source, ": missing field 'model'");
  const json& model = doc["model"];
  std::string type = model.value("type", std::string("BPE"));  // GPT-2's file predates the tag
  if (type != "BPE")
    unsupported(source, "model.type", "'" + type + "' (only BPE; use the SentencePiece .model for Unigram models)");
  CORELM_CHECK(model.contains("vocab"), FormatError, source, ": missing field 'model.vocab'");
  CORELM_CHECK(model.contains("merges") && model["merges"].is_array(), FormatError, source,
               ": missing or invalid field 'model.merges'");
  if (model.contains("dropout") && !model["dropout"].is_null() && model["dropout"].get<double>() != 0.0)
    unsupported(source, "model.dropout", "BPE dropout is random; set it to null");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (model.contains(key) && !model[key].is_null() && !model[key].get<std::string>().empty())
      unsupported(source, std::string("model.") + key, "'" + model[key].get<std::string>() + "'");
  if (flag(model, "byte_fallback", false))
    unsupported(source, "model.byte_fallback", "true (SentencePiece-style BPE; load the .model file instead)");
  spec.ignore_merges = flag(model, "ignore_merges", false);

  std::vector<std::string> spelled;
  spec.tokens = vocab_bytes(model["vocab"], source, "model.vocab", &spelled);
  std::vector<std::pair<std::string, std::string>> pairs;
  const json& merges = model["merges"];
  pairs.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const json& m = merges[i];
    if (m.is_string()) {
      const std::string& s = m.get_ref<const std::string&>();
      size_t space = s.find(' ');
      CORELM_CHECK(space != std::string::npos && s.find(' ', space + 1) == std::string::npos, FormatError, source,
                   ": model.merges[", i, "] ('", s, "') is not two tokens separated by one space");
      pairs.emplace_back(s.substr(0, space), s.substr(space + 1));
    } else {
      CORELM_CHECK(m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string(), FormatError, source,
                   ": model.merges[", i, "] must be \"a b\" or [\"a\", \"b\"]");
      pairs.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    }
  }
  spec.merges = resolve_merges(pairs, spelled, source, "model.merges");
  // The unknown token only matters for bytes the vocabulary has no single-byte token for; HF
  // tokenizers fails on such a byte when unk_token names no vocabulary entry, so that is an
  // error here only when some byte lacks its token.
  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    const std::string& unk = model["unk_token"].get_ref<const std::string&>();
    for (size_t id = 0; id < spelled.size() && spec.unk_id < 0; ++id)
      if (spelled[id] == unk) spec.unk_id = static_cast<int32_t>(id);
    if (spec.unk_id < 0) {
      std::vector<bool> has(256, false);
      for (const std::string& t : spec.tokens)
        if (t.size() == 1) has[static_cast<unsigned char>(t[0])] = true;
      for (int b = 0; b < 256; ++b)
        CORELM_CHECK(has[b], FormatError, source, ": model.unk_token '", unk,
                     "' is not in model.vocab, and byte ", b, " has no token of its own to fall back from");
    }
  }
  spec.fuse_unk = flag(model, "fuse_unk", false);

  if (doc.contains("added_tokens") && doc["added_tokens"].is_array()) {
    // HF tokenizers ignores the stated id of an added token: it reuses the vocabulary id of the
    // same text, or else takes the next id after the vocabulary and earlier added tokens. A file
    // whose ids disagree would tokenize differently there, so it is rejected.
    std::unordered_map<std::string, int32_t> spelled_ids;
    for (size_t id = 0; id < spelled.size(); ++id)
      if (!spelled[id].empty()) spelled_ids.emplace(spelled[id], static_cast<int32_t>(id));
    std::unordered_map<std::string, int32_t> added_ids;
    int64_t max_added = -1;
    const json& list = doc["added_tokens"];
    for (size_t i = 0; i < list.size(); ++i) {
      const json& t = list[i];
      std::string field = "added_tokens[" + std::to_string(i) + "]";
      CORELM_CHECK(t.is_object() && t.contains("id") && t.contains("content"), FormatError, source, ": ", field,
                   " needs 'id' and 'content'");
      if (flag(t, "single_word", false)) unsupported(source, field + ".single_word", "true");
      AddedToken a;
      a.id = t["id"].get<int32_t>();
      CORELM_CHECK(a.id >= 0, FormatError, source, ": ", field, ".id is negative");
      a.content = t["content"].get<std::string>();
      int32_t hf_id;
      if (auto it = added_ids.find(a.content); it != added_ids.end()) hf_id = it->second;
      else if (auto v = spelled_ids.find(a.content); v != spelled_ids.end()) hf_id = v->second;
      else if (max_added < 0) hf_id = static_cast<int32_t>(spelled.size());
      else hf_id = max_added >= static_cast<int64_t>(spelled.size()) ? static_cast<int32_t>(max_added + 1)
                                                                     : static_cast<int32_t>(spelled.size());
      CORELM_CHECK(a.id == hf_id, FormatError, source, ": ", field, ".id is ", a.id, " but Hugging Face tokenizers would give '",
                   a.content, "' id ", hf_id, " (added-token ids must continue the vocabulary without gaps)");
      added_ids[a.content] = hf_id;
      max_added = std::max<int64_t>(max_added, hf_id);
      a.special = flag(t, "special", false);
      a.lstrip = flag(t, "lstrip", false);
      a.rstrip = flag(t, "rstrip", false);
      spec.added.push_back(a);
    }
  }

  parse_normalizer(doc.value("normalizer", json()), source, "normalizer", spec);
  const json& pre = doc.value("pre_tokenizer", json());
  CORELM_CHECK(!pre.is_null(), FormatError, source,
               ": unsupported pre_tokenizer: null (only byte-level BPE with a ByteLevel pre-tokenizer is implemented)");
  parse_pre_tokenizer(pre, source, "pre_tokenizer", spec);
  bool byte_level = false;
  for (const PreTokStage& st : spec.stages) byte_level |= st.kind == PreTokStage::kByteLevel;
  CORELM_CHECK(byte_level, FormatError, source,
               ": unsupported pre_tokenizer: no ByteLevel step (only byte-level BPE is implemented)");
  parse_decoder(doc.value("decoder", json()), source, "decoder");
  parse_post_processor(doc.value("post_processor", json()), source, "post_processor", spec.added, spelled, spec);
  return spec;
}

BpeSpec parse_vocab_merges(const std::string& vocab_path, const std::string& merges_path) {
  BpeSpec spec;
  spec.source = vocab_path;
  json vocab;
  try {
    vocab = json::parse(read_file(vocab_path));
  } catch (const json::exception& e) {
    throw FormatError(vocab_path + ": invalid JSON: " + e.what());
  }
  std::vector<std::string> spelled;
  spec.tokens = vocab_bytes(vocab, vocab_path, "vocab", &spelled);
  std::string text = read_file(merges_path);
  std::istringstream in(text);
  std::string line;
  std::vector<std::pair<std::string, std::string>> pairs;
  size_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (line_no == 1 && line.rfind("#version", 0) == 0)) continue;
    size_t space = line.find(' ');
    CORELM_CHECK(space != std::string::npos && space > 0 && space + 1 < line.size() &&
                     line.find(' ', space + 1) == std::string::npos,
                 FormatError, merges_path, ": line ", line_no, " ('", line, "') is not two tokens separated by one space");
    pairs.emplace_back(line.substr(0, space), line.substr(space + 1));
  }
  spec.merges = resolve_merges(pairs, spelled, merges_path, "merges");
  PreTokStage st;
  st.kind = PreTokStage::kByteLevel;
  st.pattern = SplitPattern::kGpt2;
  spec.stages.push_back(st);
  // The pair carries no added-token list; GPT-2's one special token is in the vocabulary.
  for (const char* special : {"<|endoftext|>"}) {
    for (size_t id = 0; id < spelled.size(); ++id)
      if (spelled[id] == special) spec.added.push_back({static_cast<int32_t>(id), special, true, false, false});
  }
  return spec;
}

void apply_tokenizer_config(BpeSpec& spec, const std::string& config_path) {
  if (!file_exists(config_path)) return;
  json cfg;
  try {
    cfg = json::parse(read_file(config_path));
  } catch (const json::exception& e) {
    throw FormatError(config_path + ": invalid JSON: " + e.what());
  }
  auto token_text = [&](const char* key) -> std::optional<std::string> {
    if (!cfg.contains(key) || cfg[key].is_null()) return std::nullopt;
    const json& v = cfg[key];
    if (v.is_string()) return v.get<std::string>();
    if (v.is_object() && v.contains("content")) return v["content"].get<std::string>();
    throw FormatError(config_path + ": field '" + key + "' must be a string or {\"content\": ...}");
  };
  spec.bos_token = token_text("bos_token");
  spec.eos_token = token_text("eos_token");
  spec.pad_token = token_text("pad_token");
  if (cfg.contains("add_bos_token") && cfg["add_bos_token"].is_boolean()) spec.add_bos = cfg["add_bos_token"].get<bool>();
  if (cfg.contains("add_eos_token") && cfg["add_eos_token"].is_boolean()) spec.add_eos = cfg["add_eos_token"].get<bool>();
}

}  // namespace corelm::tok
