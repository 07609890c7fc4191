// corelm: one CLI, one subcommand per job. Library errors become one line on stderr and exit 1.
#include <CLI/CLI.hpp>
#include <iostream>
#include <new>
#include <stdexcept>

#include "command_registry.h"
#include "corelm/error.h"

namespace corelm::cli {
std::vector<Registrar>& registrars() {
  static std::vector<Registrar> list;
  return list;
}
}  // namespace corelm::cli

int main(int argc, char** argv) {
  CLI::App app{"corelm: train, run and serve small decoder-only language models on one CPU core"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "corelm 0.1.0");
  for (auto& reg : corelm::cli::registrars()) reg(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const corelm::Error& e) {
    std::cerr << "corelm: error: " << e.what() << "\n";
    return 1;
  } catch (const std::bad_alloc&) {
    // An allocation outside the tensor allocator (a std::vector, a string) failed: the request
    // needs more memory than this process may have; say so rather than "internal error".
    std::cerr << "corelm: error: out of memory (an allocation failed; the input or options ask for more memory than "
                 "this process may use: lower the sizes involved, or raise the memory limit)\n";
    return 1;
  } catch (const std::length_error& e) {
    std::cerr << "corelm: error: a size too large to allocate (" << e.what() << ")\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "corelm: internal error: " << e.what() << "\n";
    return 2;
  }
  return 0;
}
