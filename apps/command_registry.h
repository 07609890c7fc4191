// Subcommands register themselves here so each lives in its own apps/cmd_*.cc file and main.cc
// never changes when one is added.
#pragma once
#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

namespace corelm::cli {

// A registrar adds one subcommand (with its options and callback) to the root app.
using Registrar = std::function<void(CLI::App& root)>;

std::vector<Registrar>& registrars();

struct RegisterCommand {
  explicit RegisterCommand(Registrar r) { registrars().push_back(std::move(r)); }
};

}  // namespace corelm::cli

namespace corelm::cli {
// Returns the existing subcommand `name` of `parent`, or adds it (for shared groups such as
// `bench` whose children live in several files).
inline CLI::App& subcommand_group(CLI::App& parent, const std::string& name, const std::string& description) {
  for (CLI::App* sub : parent.get_subcommands([](CLI::App*) { return true; }))
    if (sub->get_name() == name) return *sub;
  CLI::App* group = parent.add_subcommand(name, description);
  group->require_subcommand(1);
  return *group;
}
}  // namespace corelm::cli
