// Checkpoints committed as a whole. Each save writes a complete step folder under a temp name
// (StagedDir: every file fsynced, then one rename), and only then moves one pointer,
// OUT/checkpoints/latest, by an atomic file replace. A kill -9 or a full disk before that rename
// leaves the pointer on the previous, complete checkpoint; after it, on the new one. Replacing
// the files of one folder one by one (the older layout) could not give that: a crash between two
// files left weights of step k+1 beside the state of step k, and the step-k weights were gone.
// The model files at the top of OUT are hard links to the latest checkpoint's, so OUT stays a
// model directory for every loader without the loader knowing about checkpoints.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>

#include "corelm/durable.h"
#include "corelm/error.h"
#include "corelm/finite.h"
#include "corelm/safetensors.h"
#include "corelm/train.h"
#include "train/checkpoint_internal.h"

namespace corelm::train {
namespace fs = std::filesystem;
namespace {

constexpr const char* kStepKey = "corelm_step";
constexpr const char* kCheckpoints = "checkpoints";
constexpr const char* kLatest = "latest";
constexpr const char* kStepPrefix = "step-";
// The files at the top of OUT that make it a model directory (hard links into the latest step).
constexpr const char* kViewFiles[] = {"config.json", "model.safetensors", "tokenizer.json"};

std::string path_in(const std::string& dir, const char* name) { return (fs::path(dir) / name).string(); }

using detail::read_file;

std::string step_name(int64_t step) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%s%08lld", kStepPrefix, static_cast<long long>(step));
  return buf;
}

// The step of a folder name "step-<digits>"; -1 for anything else (temp folders start with '.').
int64_t step_of(const std::string& name) {
  if (!name.starts_with(kStepPrefix) || name.size() == std::strlen(kStepPrefix) || name.size() > 24) return -1;
  int64_t v = 0;
  for (size_t i = std::strlen(kStepPrefix); i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    v = v * 10 + (name[i] - '0');
  }
  return v;
}

void check_step(const io::SafetensorsFile& f, int64_t step) {
  auto it = f.metadata().find(kStepKey);
  CORELM_CHECK(it != f.metadata().end(), FormatError, f.path(), ": no ", kStepKey, " in the metadata");
  CORELM_CHECK(it->second == std::to_string(step), FormatError, f.path(), ": holds step ", it->second,
               " but trainer_state.json says ", step, " (checkpoint interrupted while saving?)");
}

// Index of the first non-finite element of `t` (f32), or -1 (the load-time weight check's scan).
int64_t first_non_finite_in(const Tensor& t) {
  const Tensor c = t.contiguous();
  const size_t n = static_cast<size_t>(c.numel());
  const size_t at = first_non_finite(c.data<float>(), n);
  return at == n ? -1 : static_cast<int64_t>(at);
}

// `name` at the top of out_dir becomes a hard link to the step folder's file: link under a temp
// name, then rename over the old one, so a reader always finds a whole file. Falls back to a copy
// on file systems without hard links.
void link_into_view(const std::string& out_dir, const std::string& step_dir, const char* name) {
  const std::string src = path_in(step_dir, name), dst = path_in(out_dir, name);
  const std::string tmp = unique_sibling(dst, "link");
  if (::link(src.c_str(), tmp.c_str()) != 0) {
    const int err = errno;
    if (err != EPERM && err != EXDEV && err != ENOTSUP && err != EOPNOTSUPP && err != EMLINK)
      throw IOError("cannot link '" + src + "' to '" + tmp + "': " + std::strerror(err));
    write_file_atomic(dst, read_file(src));
    return;
  }
  if (::rename(tmp.c_str(), dst.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw IOError("cannot rename '" + tmp + "' to '" + dst + "': " + std::strerror(err));
  }
}

}  // namespace

std::string detail::read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  CORELM_CHECK(in.good(), IOError, path, ": cannot open");
  std::ostringstream ss;
  ss << in.rdbuf();
  CORELM_CHECK(!in.bad(), IOError, path, ": read error");
  return ss.str();
}

bool decays(const std::string& name) {
  return name.find("norm") == std::string::npos && name.find("bias") == std::string::npos;
}

std::string save_checkpoint(const std::string& out_dir, const model::Decoder& model,
                            const std::vector<Tensor>& exp_avg, const std::vector<Tensor>& exp_avg_sq,
                            const TrainerState& state, const std::string& tokenizer_json) {
  if (tokenizer_json.empty()) return detail::save_checkpoint_bytes(out_dir, model, exp_avg, exp_avg_sq, state, nullptr);
  const std::string bytes = read_file(tokenizer_json);
  return detail::save_checkpoint_bytes(out_dir, model, exp_avg, exp_avg_sq, state, &bytes);
}

std::string detail::save_checkpoint_bytes(const std::string& out_dir, const model::Decoder& model,
                                          const std::vector<Tensor>& exp_avg, const std::vector<Tensor>& exp_avg_sq,
                                          const TrainerState& state, const std::string* tokenizer_bytes) {
  const auto& params = model.named_parameters();
  CORELM_CHECK(exp_avg.size() == params.size() && exp_avg_sq.size() == params.size(), ValueError,
               "save_checkpoint: ", params.size(), " parameters but ", exp_avg.size(), "/", exp_avg_sq.size(),
               " optimizer moments");
  // A diverged model is never written: the checkpoint --resume would load must stay a good one.
  for (size_t i = 0; i < params.size(); ++i) {
    for (const auto& [what, t] : {std::pair<const char*, const Tensor*>{"weight", &params[i].second},
                                  {"AdamW exp_avg", &exp_avg[i]}, {"AdamW exp_avg_sq", &exp_avg_sq[i]}}) {
      const int64_t bad = first_non_finite_in(*t);
      if (bad >= 0)
        throw TrainingDiverged("train: " + std::string(what) + " '" + params[i].first + "' holds a non-finite value " +
                               "(element " + std::to_string(bad) + ") at step " + std::to_string(state.step) +
                               "; the checkpoint is not saved");
    }
  }

  const std::string ck_dir = path_in(out_dir, kCheckpoints);
  fs::create_directories(ck_dir);
  const std::string name = step_name(state.step);
  const std::string target = path_in(ck_dir, name.c_str());
  {
    StagedDir staged(target);
    const std::string& dir = staged.path();
    const std::map<std::string, std::string> meta{{"format", "pt"}, {kStepKey, std::to_string(state.step)}};
    io::save_safetensors(path_in(dir, "model.safetensors"), params, meta);
    model.config().save(path_in(dir, "config.json"));
    if (tokenizer_bytes) write_file_atomic(path_in(dir, "tokenizer.json"), *tokenizer_bytes);
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
    if (!state.bf16_gemm.empty()) j["bf16_gemm"] = state.bf16_gemm;
    j["sampler_rng"] = {{"s", {state.sampler.s[0], state.sampler.s[1], state.sampler.s[2], state.sampler.s[3]}},
                        {"has_spare", state.sampler.has_spare},
                        {"spare_bits", std::bit_cast<uint32_t>(state.sampler.spare)}};
    write_file_atomic(path_in(dir, "trainer_state.json"), j.dump(1) + "\n");
    staged.commit();
  }
  // The commit point: from here on --resume loads the new checkpoint.
  write_file_atomic(path_in(ck_dir, kLatest), name + "\n");

  sync_model_view(out_dir);
  return target;
}

void detail::sync_model_view(const std::string& out_dir) {
  if (!fs::exists(path_in(path_in(out_dir, kCheckpoints), kLatest))) return;
  const std::string target = latest_checkpoint(out_dir);
  // The model directory view at the top of OUT, then the older layout's own state files (their
  // presence would otherwise suggest a checkpoint that is not the one resumed).
  for (const char* f : kViewFiles) {
    std::error_code ec;
    const std::string src = path_in(target, f), dst = path_in(out_dir, f);
    if (!fs::exists(src)) continue;
    if (fs::exists(dst) && fs::equivalent(src, dst, ec)) continue;  // already the latest's
    link_into_view(out_dir, target, f);
  }
  std::error_code ec;
  for (const char* f : {"trainer_state.json", "optimizer.safetensors"}) fs::remove(path_in(out_dir, f), ec);
  fsync_dir(out_dir);
}

std::string latest_checkpoint(const std::string& dir) {
  const std::string pointer = path_in(path_in(dir, kCheckpoints), kLatest);
  if (fs::exists(pointer)) {
    std::string name = read_file(pointer);
    while (!name.empty() && (name.back() == '\n' || name.back() == '\r' || name.back() == ' ')) name.pop_back();
    CORELM_CHECK(step_of(name) >= 0, FormatError, pointer, ": expected a step folder name like ", step_name(0),
                 ", found '", name.substr(0, 64), "'");
    const std::string ck = path_in(path_in(dir, kCheckpoints), name.c_str());
    CORELM_CHECK(fs::exists(path_in(ck, "trainer_state.json")), FormatError, pointer, " names ", name, " but ", ck,
                 " is missing or incomplete (was it removed by hand?)");
    return ck;
  }
  if (fs::exists(path_in(dir, "trainer_state.json"))) return dir;
  return "";
}

bool has_checkpoint(const std::string& dir) { return !latest_checkpoint(dir).empty(); }

std::vector<int64_t> checkpoint_steps(const std::string& out_dir) {
  std::vector<int64_t> steps;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(path_in(out_dir, kCheckpoints), ec)) {
    const int64_t s = step_of(e.path().filename().string());
    if (s >= 0 && e.is_directory()) steps.push_back(s);
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

void prune_checkpoints(const std::string& out_dir, const std::vector<int64_t>& keep) {
  const std::string ck_dir = path_in(out_dir, kCheckpoints);
  std::string latest;
  try {
    const std::string ck = latest_checkpoint(out_dir);
    if (!ck.empty()) latest = fs::path(ck).filename().string();
  } catch (const FormatError&) {
    return;  // a damaged pointer: remove nothing a person may need to repair it
  }
  std::error_code ec;
  std::vector<fs::path> doomed;
  for (const auto& e : fs::directory_iterator(ck_dir, ec)) {
    const std::string name = e.path().filename().string();
    const int64_t s = step_of(name);
    // Temp names of StagedDir (".step-....staging.<pid>.<n>", ".old.") and AtomicWriter
    // ("latest.tmp.<pid>.<n>"): the output folder is locked, so no live writer owns them.
    const bool leftover = (name.starts_with(".") && name.find(kStepPrefix) == 1) ||
                          name.starts_with(std::string(kLatest) + ".tmp.");
    const bool dropped = s >= 0 && name != latest && std::find(keep.begin(), keep.end(), s) == keep.end();
    if (leftover || dropped) doomed.push_back(e.path());
  }
  for (const auto& p : doomed) fs::remove_all(p, ec);
  // Temp links of an interrupted view update.
  for (const auto& e : fs::directory_iterator(out_dir, ec)) {
    const std::string name = e.path().filename().string();
    for (const char* f : kViewFiles)
      if (name.starts_with("." + std::string(f) + ".link.")) fs::remove(e.path(), ec);
  }
}

TrainerState load_checkpoint(const std::string& dir, model::Decoder& model, std::vector<Tensor>& exp_avg,
                             std::vector<Tensor>& exp_avg_sq) {
  const std::string ck = latest_checkpoint(dir);
  CORELM_CHECK(!ck.empty(), IOError, dir, ": no checkpoint (neither ", kCheckpoints, "/", kLatest,
               " nor trainer_state.json)");
  const std::string state_path = path_in(ck, "trainer_state.json");
  TrainerState st;
  try {
    nlohmann::json j = nlohmann::json::parse(read_file(state_path));
    st.step = j.at("step").get<int64_t>();
    st.tokens_seen = j.at("tokens_seen").get<int64_t>();
    st.rows_drawn = j.at("rows_drawn").get<int64_t>();
    st.seed = j.at("seed").get<uint64_t>();
    st.schedule = j.at("schedule").get<std::string>();
    st.lr = j.at("lr").get<double>();
    if (j.contains("bf16_gemm")) st.bf16_gemm = j.at("bf16_gemm").get<std::string>();
    const auto& rng = j.at("sampler_rng");
    for (int i = 0; i < 4; ++i) st.sampler.s[i] = rng.at("s").at(i).get<uint64_t>();
    st.sampler.has_spare = rng.at("has_spare").get<bool>();
    st.sampler.spare = std::bit_cast<float>(rng.at("spare_bits").get<uint32_t>());
  } catch (const nlohmann::json::exception& e) {
    throw FormatError(state_path + ": " + e.what());
  }

  const auto params = model.named_parameters();
  io::SafetensorsFile weights = io::SafetensorsFile::open(path_in(ck, "model.safetensors"));
  check_step(weights, st.step);
  for (const auto& [name, p] : params) {
    CORELM_CHECK(weights.contains(name), FormatError, weights.path(), ": missing tensor '", name, "'");
    Tensor t = weights.get(name);
    CORELM_CHECK(t.shape() == p.shape(), FormatError, weights.path(), ": '", name, "' has shape ",
                 shape_str(t.shape()), ", the model needs ", shape_str(p.shape()));
    model.load_parameter(name, t);
  }
  io::SafetensorsFile opt = io::SafetensorsFile::open(path_in(ck, "optimizer.safetensors"));
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

std::shared_ptr<void> lock_output_dir(const std::string& out_dir) {
  CORELM_CHECK(!out_dir.empty(), ValueError, "train: no output directory (--out)");
  fs::create_directories(out_dir);
  const std::string key = fs::weakly_canonical(out_dir).string();
  static std::mutex mu;
  static std::map<std::string, std::weak_ptr<FileLock>> held;  // this process's locks
  std::lock_guard<std::mutex> guard(mu);
  if (auto live = held[key].lock()) return live;
  std::shared_ptr<FileLock> lock = FileLock::acquire_or_throw(
      path_in(out_dir, "train.lock"), "train: another training run is using --out " + out_dir);
  held[key] = lock;
  return lock;
}

}  // namespace corelm::train
