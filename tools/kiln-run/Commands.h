//===- Commands.h - kiln-run's train, eval, sample, check, devices -*- C++ -*-===//
//
// Flags in, output out: the work is runtime/train's.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_TOOLS_KILN_RUN_COMMANDS_H
#define KILN_TOOLS_KILN_RUN_COMMANDS_H

#include <string>
#include <vector>

namespace kiln::run {

/// Each returns the process exit code; `args` are the words after the
/// command name.
int trainCommand(const std::vector<std::string> &args);
int evalCommand(const std::vector<std::string> &args);
int sampleCommand(const std::vector<std::string> &args);
/// Runs every step of the program on two backends (--device against
/// --against, default cuda-emu against cpu) from the same state and compares
/// every output; exit 1 on a mismatch.
int checkCommand(const std::vector<std::string> &args);
/// Lists the GPUs this machine has, or says why there are none.
int devicesCommand(const std::vector<std::string> &args);
/// How kiln-run was invoked (argv[0]): the resume hint repeats it, so the
/// command it prints runs as it is pasted.
void setProgram(const std::string &argv0);

} // namespace kiln::run

#endif // KILN_TOOLS_KILN_RUN_COMMANDS_H
