// Errors: every failure a user can cause is an exception derived from corelm::Error whose
// message names the thing at fault (file, tensor, field, shapes). The CLI prints what() and
// exits non-zero; nothing on user input aborts.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace corelm {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

class ShapeError : public Error { using Error::Error; };      // incompatible shapes / ranks
class DTypeError : public Error { using Error::Error; };      // unsupported or mismatched dtype
class IndexError : public Error { using Error::Error; };      // out-of-range index, slice, dim
class DeviceError : public Error { using Error::Error; };     // device not built / mismatch
class ValueError : public Error { using Error::Error; };      // bad argument value
class IOError : public Error { using Error::Error; };         // file missing, unreadable, unwritable
class FormatError : public Error { using Error::Error; };     // file present but malformed
class AutogradError : public Error { using Error::Error; };   // misuse of backward()

namespace detail {
template <typename... Args>
std::string concat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}
}  // namespace detail

// CORELM_CHECK(cond, ErrorType, message parts...) throws ErrorType(concat(parts...)) when cond fails.
#define CORELM_CHECK(cond, ErrorType, ...)                                   \
  do {                                                                       \
    if (!(cond)) throw ::corelm::ErrorType(::corelm::detail::concat(__VA_ARGS__)); \
  } while (0)

}  // namespace corelm
