//===- Files.cpp - Reading a whole file -----------------------------------===//

#include "runtime/core/Files.h"

#include <fstream>
#include <sstream>

namespace kiln {

bool readFile(const std::string &path, std::string &out) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return false;
  std::ostringstream s;
  s << in.rdbuf();
  out = s.str();
  return true;
}

} // namespace kiln
