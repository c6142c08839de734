// core/error.cpp — builds the text of ffn::Error (message, then where it was raised).
#include "core/error.h"

namespace ffn::detail {

void throw_error(const char* file, int line, const char* func, const char* expr,
                 const std::string& msg, ErrorKind kind) {
  std::ostringstream os;
  os << msg << "\n  (";
  if (expr) os << "check `" << expr << "` failed ";
  os << "at " << file << ":" << line << " in " << func << ")";
  throw Error(os.str(), kind);
}

}  // namespace ffn::detail
