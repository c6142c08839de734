// train/programs/cli_checks.h — command-line range checks whose failures read like the
// config errors ("--tokens: expected an integer >= 1, got -1"), instead of CLI11's
// PositiveNumber / NonNegativeNumber, which print the range as 0 to the largest double.
#pragma once

#include <CLI/CLI.hpp>

#include <cmath>
#include <string>

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

}  // namespace ffn::train
