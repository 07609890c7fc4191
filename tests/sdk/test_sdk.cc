// The Python SDK (python/corelm: corelm.Client, corelm-client) driven from gtest:
//  - SdkClient.AgainstStandInServer: tests/sdk/test_client_fake.py, the client against a stdlib
//    http.server stand-in (request shapes, 429/503 retries with Retry-After, ordering, chunking,
//    the batch path, error mapping, the CLI's output and exit codes);
//  - SdkInstall.PipInstallIntoVenvOffline: `pip install --no-build-isolation --no-deps --no-index`
//    of a copy of python/ into a fresh venv (no network), then its corelm-client console script;
//  - SdkLive.*: tests/sdk/test_sdk_live.py against the real `corelm serve --state-dir`
//    (generate of 200 prompts in order equal to greedy /v1/completions, the Files/Batches path
//    above a threshold of 50, classify, 404s, the ```python examples of docs/SERVING.md's
//    "Python SDK" section; a server with --max-queued 30, kill -9 + restart during generate(),
//    the corelm-client commands).
// The client is stdlib-only, so any python3 on PATH runs it; the venv test needs a python3 with
// venv, pip, setuptools and wheel (Debian: python3-venv, python3-pip).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "common/cli_runner.h"
#include "serve/serve_fixture.h"

namespace fs = std::filesystem;
using corelm::testing::CliOptions;
using corelm::testing::run_program;

namespace {

const std::string kSrc = CORELM_SOURCE_DIR;

std::string sh_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

class ScratchTmp {
 public:
  explicit ScratchTmp(const std::string& tag)
      : path_(fs::temp_directory_path() / ("corelm_sdk_" + tag + "_" + std::to_string(::getpid()))) {
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~ScratchTmp() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

void print(const corelm::testing::CliResult& r) {
  std::cout << r.out << (r.err.empty() ? "" : "\nstderr:\n" + r.err.substr(r.err.size() > 6000 ? r.err.size() - 6000 : 0))
            << std::endl;
}

TEST(SdkClient, AgainstStandInServer) {
  if (!corelm::testing::have_program("python3")) GTEST_SKIP() << "python3 is not installed";
  CliOptions o{60};
  o.env = {"PYTHONPATH=" + kSrc + "/python", "PYTHONDONTWRITEBYTECODE=1"};
  const auto r = run_program("python3", {kSrc + "/tests/sdk/test_client_fake.py"}, o);
  print(r);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.rc, 0) << "a client unit test failed (see the unittest output above)";
}

// A python3 that can build the package offline, or "" (Debian's /usr/bin/python3 first: a pyenv
// or other python on PATH often lacks the `wheel` package setuptools needs for a wheel).
std::string python_with_build_tools() {
  for (const std::string py : {"/usr/bin/python3", "python3"}) {
    if (py[0] == '/' ? !fs::exists(py) : !corelm::testing::have_program(py)) continue;
    const auto r = run_program(py, {"-c", "import setuptools, wheel, venv, pip"}, CliOptions{30});
    if (r.rc == 0) return py;
  }
  return "";
}

TEST(SdkInstall, PipInstallIntoVenvOffline) {
  const std::string py = python_with_build_tools();
  if (py.empty())
    GTEST_SKIP() << "no python3 with venv, pip, setuptools and wheel (Debian: python3-venv python3-pip, which "
                    "scripts/setup --test installs; python3-pip depends on python3-setuptools and python3-wheel)";
  ScratchTmp tmp("venv");
  // A copy, so that the build's python/build and *.egg-info never land in the source tree.
  const fs::path pkg = tmp.path() / "python";
  fs::create_directories(pkg / "corelm");
  fs::copy_file(kSrc + "/python/pyproject.toml", pkg / "pyproject.toml");
  for (const auto& e : fs::directory_iterator(kSrc + "/python/corelm"))
    if (e.path().extension() == ".py") fs::copy_file(e.path(), pkg / "corelm" / e.path().filename());
  const fs::path venv = tmp.path() / "venv";
  // --without-pip: the venv's python runs the system pip through --system-site-packages (seconds
  // faster than ensurepip copying one in) and installs into the venv all the same.
  const std::string script =
      py + " -m venv --without-pip --system-site-packages " + sh_quote(venv.string()) + " && " +
      sh_quote((venv / "bin/python").string()) + " -m pip install --no-build-isolation --no-deps --no-index --disable-pip-version-check --no-cache-dir -q " +
      sh_quote(pkg.string()) + " && cd / && " + sh_quote((venv / "bin/corelm-client").string()) + " --help && " +
      sh_quote((venv / "bin/corelm-client").string()) + " batch submit --help && " +
      sh_quote((venv / "bin/python").string()) +
      " -c 'import corelm, sys; print(\"module:\", corelm.__file__); print(\"version:\", corelm.__version__)'";
  CliOptions o{90};
  o.env = {"PIP_NO_INDEX=1", "PYTHONDONTWRITEBYTECODE=1"};
  const auto r = run_program("/bin/sh", {"-c", script}, o);
  print(r);
  ASSERT_FALSE(r.timed_out);
  ASSERT_EQ(r.rc, 0) << "venv creation, offline pip install or the installed corelm-client failed";
  EXPECT_NE(r.out.find("usage: corelm-client"), std::string::npos);
  EXPECT_NE(r.out.find("batch submit"), std::string::npos);
  // The installed copy is imported, not the source tree's.
  EXPECT_NE(r.out.find("module: " + venv.string()), std::string::npos);
  EXPECT_NE(r.out.find("version: 0."), std::string::npos);
  // The console script reports an unreachable server by its URL, exit 1.
  const auto down =
      run_program((venv / "bin/corelm-client").string(), {"--base-url", "http://127.0.0.1:9", "health"}, CliOptions{30});
  EXPECT_EQ(down.rc, 1) << down.out << down.err;
  EXPECT_NE(down.err.find("http://127.0.0.1:9"), std::string::npos) << down.err;
}

// Runs test_sdk_live.py's checks `only` against a server on a fresh random model named "tiny".
void run_live_checks(const std::string& only) {
  if (!corelm::testing::have_program("python3")) GTEST_SKIP() << "python3 is not installed";
  const auto help = corelm::testing::run_corelm({"serve", "--help"}, CliOptions{30});
  ASSERT_EQ(help.rc, 0) << help.err;
  if (help.out.find("--state-dir") == std::string::npos)
    GTEST_SKIP() << "this corelm serve has no --state-dir (the queue-backed server: /v1/generate, Files, Batches)";
  ScratchTmp tmp("live");
  const fs::path model = tmp.path() / "tiny";
  corelm::testing::make_model_dir(model);
  CliOptions o{110};
  o.env = {"PYTHONPATH=" + kSrc + "/python", "PYTHONDONTWRITEBYTECODE=1"};
  const auto r = run_program("python3",
                             {kSrc + "/tests/sdk/test_sdk_live.py", "--corelm", corelm::testing::corelm_path(), "--model",
                              model.string(), "--docs", kSrc + "/docs/SERVING.md", "--timeout", "90", "--only", only},
                             o);
  print(r);
  EXPECT_FALSE(r.timed_out) << "the live SDK checks ran past 110 s";
  EXPECT_EQ(r.rc, 0) << "some live SDK checks failed (FAIL lines above)";
  EXPECT_NE(r.out.find("SUMMARY OK"), std::string::npos);
}

// 200 prompts in order equal to greedy /v1/completions, the batch path, classify, errors, the
// docs' examples.
TEST(SdkLive, GenerateBatchesClassifyErrorsDocs) {
  run_live_checks("health_models,generate_order,batch_path,classify,errors,docs_examples");
}

// A server whose queue holds 30 requests, kill -9 and restart while generate() runs, and the
// corelm-client commands.
TEST(SdkLive, SmallQueueRestartAndCli) { run_live_checks("small_queue,restart,cli"); }

}  // namespace
