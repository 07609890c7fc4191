// Writes a byte-level BPE spec as a Hugging Face tokenizer.json (format version 1.0, the layout
// tokenizers 0.19 writes), so trained tokenizers load in both corelm and HF.
#include "corelm/error.h"
#include "tokenizer/bpe_tokenizer.h"
#include "tokenizer/byte_level.h"

namespace corelm::tok {

std::string to_hf_tokenizer_json(const BpeSpec& spec) {
  using ojson = nlohmann::ordered_json;
  ojson doc;
  doc["version"] = "1.0";
  doc["truncation"] = nullptr;
  doc["padding"] = nullptr;
  ojson added = ojson::array();
  for (const AddedToken& t : spec.added)
    added.push_back({{"id", t.id}, {"content", t.content}, {"single_word", false}, {"lstrip", t.lstrip},
                     {"rstrip", t.rstrip}, {"normalized", false}, {"special", t.special}});
  doc["added_tokens"] = added;
  doc["normalizer"] = spec.nfc ? ojson{{"type", "NFC"}} : ojson(nullptr);
  ojson stages = ojson::array();
  for (const PreTokStage& st : spec.stages) {
    if (st.kind == PreTokStage::kSplit) {
      stages.push_back({{"type", "Split"}, {"pattern", {{"Regex", regex_of(st.pattern)}}}, {"behavior", "Isolated"},
                        {"invert", false}});
    } else if (st.kind == PreTokStage::kDigits) {
      stages.push_back({{"type", "Digits"}, {"individual_digits", st.individual_digits}});
    } else {
      stages.push_back({{"type", "ByteLevel"}, {"add_prefix_space", st.add_prefix_space}, {"trim_offsets", true},
                        {"use_regex", st.use_regex}});
    }
  }
  doc["pre_tokenizer"] = stages.size() == 1 ? stages[0] : ojson{{"type", "Sequence"}, {"pretokenizers", stages}};
  doc["post_processor"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", true}};
  doc["decoder"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  ojson vocab = ojson::object();
  std::vector<std::string> spelled(spec.tokens.size());
  for (size_t id = 0; id < spec.tokens.size(); ++id) {
    spelled[id] = byte_level_encode(spec.tokens[id]);
    vocab[spelled[id]] = id;
  }
  ojson merges = ojson::array();
  for (const auto& m : spec.merges) merges.push_back(spelled[m.left] + " " + spelled[m.right]);
  doc["model"] = {{"type", "BPE"},
                  {"dropout", nullptr},
                  {"unk_token", nullptr},
                  {"continuing_subword_prefix", nullptr},
                  {"end_of_word_suffix", nullptr},
                  {"fuse_unk", false},
                  {"byte_fallback", false},
                  {"ignore_merges", spec.ignore_merges},
                  {"vocab", vocab},
                  {"merges", merges}};
  return doc.dump(1);
}

}  // namespace corelm::tok
