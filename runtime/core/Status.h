//===- Status.h - Errors as values for the runtime and tools ----*- C++ -*-===//
//
// Kiln's runtime and tools report failures as values: a Status carries a
// user-facing message that names the file, tensor or op and what to do. The
// runtime is built without MLIR/LLVM, so this stands in for llvm::Error there.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_CORE_STATUS_H
#define KILN_RUNTIME_CORE_STATUS_H

#include <cstring>
#include <optional>
#include <string>
#include <utility>

namespace kiln {

/// `file` (a __FILE__) relative to the repository root, so that messages say
/// "runtime/cuda/Driver.cpp:88" wherever and however the tree was built: an
/// absolute path loses the prefix this header's own __FILE__ has, a relative
/// one (ccache's CCACHE_BASEDIR makes "../runtime/...") its leading "../".
inline const char *sourcePath(const char *file) {
  static constexpr char self[] = __FILE__;
  constexpr size_t prefix = sizeof(self) - sizeof("runtime/core/Status.h");
  if (std::strncmp(file, self, prefix) == 0)
    file += prefix;
  for (;;) {
    if (std::strncmp(file, "./", 2) == 0)
      file += 2;
    else if (std::strncmp(file, "../", 3) == 0)
      file += 3;
    else
      return file;
  }
}

/// Why an operation failed; tools map these to exit codes (0/1/2).
enum class ErrorKind {
  User,     ///< Bad input: model file, artifact, data, flags. Exit code 1.
  Internal, ///< A bug in Kiln. Exit code 2.
};

/// The result of an operation that returns nothing on success.
class [[nodiscard]] Status {
public:
  static Status ok() { return Status(); }
  static Status error(std::string message, ErrorKind kind = ErrorKind::User) {
    Status s;
    s.failed_ = true;
    s.kind_ = kind;
    s.message_ = std::move(message);
    return s;
  }
  static Status internal(std::string message) {
    return error(std::move(message), ErrorKind::Internal);
  }

  bool isOk() const { return !failed_; }
  explicit operator bool() const { return !failed_; }
  const std::string &message() const { return message_; }
  ErrorKind kind() const { return kind_; }
  /// Process exit code for a tool that stops on this status.
  int exitCode() const {
    return !failed_ ? 0 : (kind_ == ErrorKind::User ? 1 : 2);
  }

private:
  bool failed_ = false;
  ErrorKind kind_ = ErrorKind::User;
  std::string message_;
};

/// A value or the Status explaining why there is none.
template <typename T> class [[nodiscard]] Expected {
public:
  Expected(T value) : value_(std::move(value)) {}
  Expected(Status status) : status_(std::move(status)) {}

  bool isOk() const { return value_.has_value(); }
  explicit operator bool() const { return isOk(); }
  const Status &status() const { return status_; }
  T &operator*() { return *value_; }
  const T &operator*() const { return *value_; }
  T *operator->() { return &*value_; }
  const T *operator->() const { return &*value_; }

private:
  std::optional<T> value_;
  Status status_;
};

} // namespace kiln

#endif // KILN_RUNTIME_CORE_STATUS_H
