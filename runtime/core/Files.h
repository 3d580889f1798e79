//===- Files.h - Reading a whole file ---------------------------*- C++ -*-===//
//
// The small file helper the runtime's readers share (cgroup files, cached
// NVRTC images).
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_CORE_FILES_H
#define KILN_RUNTIME_CORE_FILES_H

#include <string>

namespace kiln {

/// The bytes of the file at `path` into `out`; false (out unchanged) when it
/// cannot be opened.
bool readFile(const std::string &path, std::string &out);

} // namespace kiln

#endif // KILN_RUNTIME_CORE_FILES_H
