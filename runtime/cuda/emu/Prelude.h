//===- Prelude.h - The text of runtime/cuda/kiln_cuda.h ---------*- C++ -*-===//
//
// The prelude every generated CUDA C++ translation unit starts with, embedded
// at build time (library KilnCudaPrelude, no dependencies), so that the
// emitter, NVRTC compiles and the emulator paste the same text without
// finding the header on disk at run time.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_CUDA_EMU_PRELUDE_H
#define KILN_RUNTIME_CUDA_EMU_PRELUDE_H

#include <string_view>

namespace kiln::cuda {

/// The full text of kiln_cuda.h.
std::string_view preludeText();

} // namespace kiln::cuda

#endif // KILN_RUNTIME_CUDA_EMU_PRELUDE_H
