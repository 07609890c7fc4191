// Checkpoints: weights (HF names), config, tokenizer, AdamW moments and the trainer state, each
// file written atomically. trainer_state.json goes last and every file records the step, so a
// crash between two files is detected on resume instead of silently mixing steps.
#include <bit>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "corelm/error.h"
#include "corelm/safetensors.h"
#include "corelm/train.h"

namespace corelm::train {
namespace fs = std::filesystem;
namespace {

constexpr const char* kStepKey = "corelm_step";

std::string path_in(const std::string& dir, const char* name) { return (fs::path(dir) / name).string(); }

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  CORELM_CHECK(in.good(), IOError, path, ": cannot open");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void check_step(const io::SafetensorsFile& f, int64_t step) {
  auto it = f.metadata().find(kStepKey);
  CORELM_CHECK(it != f.metadata().end(), FormatError, f.path(), ": no ", kStepKey, " in the metadata");
  CORELM_CHECK(it->second == std::to_string(step), FormatError, f.path(), ": holds step ", it->second,
               " but trainer_state.json says ", step, " (checkpoint interrupted while saving?)");
}

}  // namespace

bool decays(const std::string& name) {
  return name.find("norm") == std::string::npos && name.find("bias") == std::string::npos;
}

void save_checkpoint(const std::string& dir, const model::Decoder& model, const std::vector<Tensor>& exp_avg,
                     const std::vector<Tensor>& exp_avg_sq, const TrainerState& state,
                     const std::string& tokenizer_json) {
  fs::create_directories(dir);
  const auto& params = model.named_parameters();
  CORELM_CHECK(exp_avg.size() == params.size() && exp_avg_sq.size() == params.size(), ValueError,
               "save_checkpoint: ", params.size(), " parameters but ", exp_avg.size(), "/", exp_avg_sq.size(),
               " optimizer moments");
  const std::map<std::string, std::string> meta{{"format", "pt"}, {kStepKey, std::to_string(state.step)}};
  io::save_safetensors(path_in(dir, "model.safetensors"), params, meta);
  model.config().save(path_in(dir, "config.json"));
  const std::string tok_dst = path_in(dir, "tokenizer.json");
  if (!tokenizer_json.empty()) {
    std::error_code ec;
    const bool same = fs::exists(tok_dst) && fs::equivalent(tokenizer_json, tok_dst, ec);
    if (!same) io::write_file_atomic(tok_dst, read_file(tokenizer_json));
  }
  std::vector<std::pair<std::string, Tensor>> moments;
  for (size_t i = 0; i < params.size(); ++i) moments.emplace_back("exp_avg." + params[i].first, exp_avg[i]);
  for (size_t i = 0; i < params.size(); ++i) moments.emplace_back("exp_avg_sq." + params[i].first, exp_avg_sq[i]);
  io::save_safetensors(path_in(dir, "optimizer.safetensors"), moments, meta);

  nlohmann::ordered_json j;
  j["step"] = state.step;
  j["tokens_seen"] = state.tokens_seen;
  j["rows_drawn"] = state.rows_drawn;
  j["seed"] = state.seed;
  j["schedule"] = state.schedule;
  j["lr"] = state.lr;
  j["sampler_rng"] = {{"s", {state.sampler.s[0], state.sampler.s[1], state.sampler.s[2], state.sampler.s[3]}},
                      {"has_spare", state.sampler.has_spare},
                      {"spare_bits", std::bit_cast<uint32_t>(state.sampler.spare)}};
  io::write_file_atomic(path_in(dir, "trainer_state.json"), j.dump(1) + "\n");
}

bool has_checkpoint(const std::string& dir) { return fs::exists(path_in(dir, "trainer_state.json")); }

TrainerState load_checkpoint(const std::string& dir, model::Decoder& model, std::vector<Tensor>& exp_avg,
                             std::vector<Tensor>& exp_avg_sq) {
  const std::string state_path = path_in(dir, "trainer_state.json");
  TrainerState st;
  try {
    nlohmann::json j = nlohmann::json::parse(read_file(state_path));
    st.step = j.at("step").get<int64_t>();
    st.tokens_seen = j.at("tokens_seen").get<int64_t>();
    st.rows_drawn = j.at("rows_drawn").get<int64_t>();
    st.seed = j.at("seed").get<uint64_t>();
    st.schedule = j.at("schedule").get<std::string>();
    st.lr = j.at("lr").get<double>();
    const auto& rng = j.at("sampler_rng");
    for (int i = 0; i < 4; ++i) st.sampler.s[i] = rng.at("s").at(i).get<uint64_t>();
    st.sampler.has_spare = rng.at("has_spare").get<bool>();
    st.sampler.spare = std::bit_cast<float>(rng.at("spare_bits").get<uint32_t>());
  } catch (const nlohmann::json::exception& e) {
    throw FormatError(state_path + ": " + e.what());
  }

  const auto params = model.named_parameters();
  io::SafetensorsFile weights = io::SafetensorsFile::open(path_in(dir, "model.safetensors"));
  check_step(weights, st.step);
  for (const auto& [name, p] : params) {
    CORELM_CHECK(weights.contains(name), FormatError, weights.path(), ": missing tensor '", name, "'");
    Tensor t = weights.get(name);
    CORELM_CHECK(t.shape() == p.shape(), FormatError, weights.path(), ": '", name, "' has shape ",
                 shape_str(t.shape()), ", the model needs ", shape_str(p.shape()));
    model.load_parameter(name, t);
  }
  io::SafetensorsFile opt = io::SafetensorsFile::open(path_in(dir, "optimizer.safetensors"));
  check_step(opt, st.step);
  CORELM_CHECK(exp_avg.size() == params.size() && exp_avg_sq.size() == params.size(), ValueError,
               "load_checkpoint: optimizer moments do not match the parameters");
  for (size_t i = 0; i < params.size(); ++i) {
    for (auto [prefix, dst] : {std::pair<const char*, Tensor*>{"exp_avg.", &exp_avg[i]}, {"exp_avg_sq.", &exp_avg_sq[i]}}) {
      const std::string name = prefix + params[i].first;
      CORELM_CHECK(opt.contains(name), FormatError, opt.path(), ": missing tensor '", name, "'");
      Tensor t = opt.get(name);
      CORELM_CHECK(t.shape() == dst->shape(), FormatError, opt.path(), ": '", name, "' has shape ",
                   shape_str(t.shape()), ", expected ", shape_str(dst->shape()));
      dst->copy_(t);
    }
  }
  return st;
}

}  // namespace corelm::train
