// Option values such as --template and --stop may spell newlines and tabs as \n and \t (and a
// backslash as \\): shells make literal newlines awkward. Shared by the subcommands that take them.
#pragma once
#include <string>

namespace corelm::cli {

inline std::string unescape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 1 < s.size() && (s[i + 1] == 'n' || s[i + 1] == 't' || s[i + 1] == '\\')) {
      out += s[i + 1] == 'n' ? '\n' : s[i + 1] == 't' ? '\t' : '\\';
      ++i;
    } else {
      out += s[i];
    }
  }
  return out;
}

}  // namespace corelm::cli
