// core/error.h — the one error family of fused-ffn.
//
// Library code never exits: it throws ffn::Error. Every check goes through
// detail::throw_error, which records the failed expression, file:line and
// function after the user-facing message. Messages start with the op or config
// key in brackets and name the offending values, e.g.
//   [linear] x.shape[-1]=512 != in_features=768
// Only a program's main() turns an Error into an exit code (see ErrorKind).
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace ffn {

// What kind of failure an Error is; main() maps it to an exit code.
// runtime: a failure while running (exit 1); config: something the user fixes in a config
// or flag (exit 2, reported before GPU memory is touched); out_of_memory: an allocation the
// host or device could not satisfy (exit 1; the trainer adds which stage and which keys to
// lower).
enum class ErrorKind { runtime = 0, config = 1, out_of_memory = 2 };

class Error : public std::runtime_error {
 public:
  Error(std::string msg, ErrorKind kind = ErrorKind::runtime)
      : std::runtime_error(std::move(msg)), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

namespace detail {

template <class... Args>
std::string cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

// Throws ffn::Error with `msg` first and the location second. `expr` may be null.
[[noreturn]] void throw_error(const char* file, int line, const char* func, const char* expr,
                              const std::string& msg, ErrorKind kind = ErrorKind::runtime);

}  // namespace detail
}  // namespace ffn

// The generic macro: if `status != ok`, throw with `describe(status)` as the message.
#define FFN_CHECK_STATUS(expr, ok, describe)                                                  \
  do {                                                                                        \
    auto ffn_status_ = (expr);                                                                \
    if (!(ffn_status_ == (ok))) [[unlikely]]                                                  \
      ::ffn::detail::throw_error(__FILE__, __LINE__, __func__, #expr, describe(ffn_status_)); \
  } while (0)

// FFN_CHECK(cond, "[op] ", values...): a precondition on user input or an invariant.
#define FFN_CHECK(cond, ...)                                          \
  do {                                                                \
    if (!(cond)) [[unlikely]]                                         \
      ::ffn::detail::throw_error(__FILE__, __LINE__, __func__, #cond, \
                                 ::ffn::detail::cat(__VA_ARGS__));    \
  } while (0)

// FFN_THROW("[op] ", values...): unconditional failure.
#define FFN_THROW(...) \
  ::ffn::detail::throw_error(__FILE__, __LINE__, __func__, nullptr, ::ffn::detail::cat(__VA_ARGS__))
