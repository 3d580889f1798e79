//===- Session.h - train / eval / sample on the CPU backend -------*- C++ -*-===//
#ifndef KILN_TOOLS_KILN_RUN_SESSION_H
#define KILN_TOOLS_KILN_RUN_SESSION_H

#include <string>
#include <vector>

namespace kiln::run {

/// Each returns the process exit code; `args` are the words after the
/// command name.
int trainCommand(const std::vector<std::string> &args);
int evalCommand(const std::vector<std::string> &args);
int sampleCommand(const std::vector<std::string> &args);

} // namespace kiln::run

#endif // KILN_TOOLS_KILN_RUN_SESSION_H
