#include "oracle/oracle_support.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

namespace corelm::oracle {
namespace fs = std::filesystem;

namespace {

// Must match NO_TORCH_EXIT in tests/oracle/oracle_fixture.py.
constexpr int kNoTorchExit = 77;

fs::path oracle_dir() { return fs::path(CORELM_BINARY_DIR) / "oracle"; }
fs::path script_dir() { return fs::path(CORELM_SOURCE_DIR) / "tests" / "oracle"; }

std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The fixture is reused while it is newer than every script that shapes it.
bool fixture_is_fresh(const fs::path& out, const fs::path& script) {
  std::error_code ec;
  if (!fs::exists(out, ec)) return false;
  const auto built = fs::last_write_time(out, ec);
  if (fs::last_write_time(script, ec) > built) return false;
  // Scripts share helper modules (oracle_fixture.py, hf_oracle.py, ...): any newer Python file
  // beside them may change the fixture, so it is rebuilt.
  for (const auto& entry : fs::directory_iterator(script_dir(), ec))
    if (entry.path().extension() == ".py" && fs::last_write_time(entry.path(), ec) > built) return false;
  return true;
}

std::string shell_quoted(const fs::path& p) { return "'" + p.string() + "'"; }

Fixture produce(const std::string& script_name, const std::string& output_name) {
  Fixture result;
  const fs::path script = script_dir() / script_name;
  const fs::path out = oracle_dir() / output_name;
  fs::create_directories(oracle_dir());

  if (!fixture_is_fresh(out, script)) {
    const fs::path log = oracle_dir() / (output_name + ".log");
    std::vector<std::string> pythons = {CORELM_TEST_PYTHON, "/usr/bin/python3"};
    if (const char* env = std::getenv("CORELM_TEST_PYTHON")) pythons.insert(pythons.begin(), env);
    bool ran = false;
    for (const std::string& python : pythons) {
      if (python.empty() || access(python.c_str(), X_OK) != 0) continue;
      const std::string cmd = shell_quoted(python) + " -B " + shell_quoted(script) + " " + shell_quoted(out) + " > " +
                              shell_quoted(log) + " 2>&1";
      const int status = std::system(cmd.c_str());
      const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      if (code == kNoTorchExit) continue;  // this python has no torch: try the next one
      if (code != 0) {
        result.message = "oracle script failed (" + cmd + ", exit " + std::to_string(code) +
                         "):\n" + read_text(log);
        return result;
      }
      ran = true;
      break;
    }
    if (!ran) {
      result.skip = true;
      result.message = "torch not found: run scripts/setup --test (tried " + pythons.front() +
                       " and /usr/bin/python3)";
      return result;
    }
  }
  try {
    result.data = json::parse(read_text(out));
  } catch (const std::exception& e) {
    result.message = "cannot parse oracle fixture " + out.string() + ": " + e.what();
  }
  return result;
}

}  // namespace

const Fixture& load_fixture(const std::string& script, const std::string& output_name) {
  static std::mutex mu;
  static std::map<std::string, Fixture> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(output_name);
  if (it == cache.end()) it = cache.emplace(output_name, produce(script, output_name)).first;
  return it->second;
}

Shape shape_from_json(const json& j) { return j.get<Shape>(); }

Tensor tensor_from_json(const json& j) {
  const Shape shape = shape_from_json(j.at("shape"));
  const std::string dtype = j.at("dtype").get<std::string>();
  const json& data = j.at("data");
  if (dtype == "f32") return Tensor::from_vector(data.get<std::vector<float>>(), shape);
  if (dtype == "i64") return Tensor::from_vector(data.get<std::vector<int64_t>>(), shape);
  if (dtype == "i32") return Tensor::from_vector(data.get<std::vector<int32_t>>(), shape);
  throw std::runtime_error("oracle fixture: unknown dtype " + dtype);
}

ErrorStats ErrorStats::between(const std::vector<float>& ours, const std::vector<float>& ref) {
  double max_abs = 0.0, ref_max = 0.0;
  for (size_t i = 0; i < ref.size() && i < ours.size(); ++i) {
    const double diff = std::fabs(static_cast<double>(ours[i]) - static_cast<double>(ref[i]));
    // NaN in ours must count as an infinite error, not vanish in std::max.
    max_abs = std::isnan(diff) ? INFINITY : std::max(max_abs, diff);
    ref_max = std::max(ref_max, std::fabs(static_cast<double>(ref[i])));
  }
  if (ours.size() != ref.size()) max_abs = INFINITY;
  return {max_abs, ref_max > 0.0 ? max_abs / ref_max : max_abs};
}

void ErrorStats::merge(const ErrorStats& other) {
  max_abs = std::max(max_abs, other.max_abs);
  max_rel = std::max(max_rel, other.max_rel);
}

std::string format_error(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3e", v);
  return buf;
}

void write_table_row(const std::string& table_file, const std::string& header,
                     const std::vector<std::string>& names, const std::string& name,
                     const std::string& row) {
  const fs::path rows = oracle_dir() / (table_file + ".rows");
  fs::create_directories(rows);
  {
    std::ofstream(rows / (name + ".row")) << row << "\n";
  }
  std::string table = header;
  for (const std::string& n : names) {
    const fs::path p = rows / (n + ".row");
    if (fs::exists(p)) table += read_text(p);
  }
  // Write then rename: tests running in parallel each leave a complete table.
  const fs::path tmp = oracle_dir() / (table_file + "." + std::to_string(getpid()) + ".tmp");
  std::ofstream(tmp) << table;
  fs::rename(tmp, oracle_dir() / table_file);
}

}  // namespace corelm::oracle
