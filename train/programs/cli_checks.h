// train/programs/cli_checks.h — what the command-line programs share: range checks whose
// failures read like the config errors ("--tokens: expected an integer >= 1, got -1"),
// instead of CLI11's PositiveNumber / NonNegativeNumber, which print the range as 0 to the
// largest double; and run_program, their parse and exit codes.
#pragma once

#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdio>
#include <string>

#include "core/error.h"

namespace ffn::train {

inline CLI::Validator integer_at_least(long long lo) {
  return CLI::Validator(
      [lo](std::string& s) -> std::string {
        size_t pos = 0;
        long long v = 0;
        try {
          v = std::stoll(s, &pos);
        } catch (const std::exception&) {
          pos = std::string::npos;
        }
        if (pos != s.size() || v < lo)
          return "expected an integer >= " + std::to_string(lo) + ", got " + s;
        return {};
      },
      "INT>=" + std::to_string(lo));
}

// A finite number >= lo; `strict` makes it > lo.
inline CLI::Validator number_at_least(double lo, bool strict = false) {
  const std::string bound = (strict ? "> " : ">= ") + CLI::detail::to_string(lo);
  return CLI::Validator(
      [lo, strict, bound](std::string& s) -> std::string {
        size_t pos = 0;
        double v = 0;
        try {
          v = std::stod(s, &pos);
        } catch (const std::exception&) {
          pos = std::string::npos;
        }
        if (pos != s.size() || !std::isfinite(v) || v < lo || (strict && v == lo))
          return "expected a number " + bound + ", got " + s;
        return {};
      },
      "NUM" + bound);
}

// Parses the command line, then runs `body` (which returns the exit code): 0 after --help,
// 2 for bad options or a config error, 1 for any other error, printed as "<name>: error:
// …" (after a line break when `newline` is set: the progress line may be unfinished).
template <class Body>
int run_program(CLI::App& app, int argc, char** argv, const char* name, bool newline,
                Body&& body) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  const char* pre = newline ? "\n" : "";
  try {
    return body();
  } catch (const Error& e) {
    std::fprintf(stderr, "%s%s: error: %s\n", pre, name, e.what());
    return e.kind() == ErrorKind::config ? 2 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s%s: error: %s\n", pre, name, e.what());
    return 1;
  }
}

}  // namespace ffn::train
