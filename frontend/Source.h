//===- Source.h - Model files and their diagnostics -------------*- C++ -*-===//
//
// A SourceFile owns the text of one .kiln file and maps offsets to lines.
// DiagEngine collects errors (and warnings) and renders them as
//
//   model.kiln:3:7: error: unknown name 'fo'; did you mean 'foo'?
//       3 |   x = fo(y)
//         |       ^~
//
// This part of the frontend has no MLIR or LLVM dependency.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_FRONTEND_SOURCE_H
#define KILN_FRONTEND_SOURCE_H

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::frontend {

/// A position in a source file; line and col are 1-based, 0 means unknown.
struct SourceLoc {
  uint32_t line = 0;
  uint32_t col = 0;
  uint32_t length = 1; ///< Width of the caret range in columns.
};

class SourceFile {
public:
  SourceFile(std::string name, std::string text);
  const std::string &name() const { return name_; }
  const std::string &text() const { return text_; }
  /// Text of the 1-based line, without its newline ("" if out of range).
  std::string_view lineText(uint32_t line) const;

private:
  std::string name_;
  std::string text_;
  std::vector<size_t> lineStarts_;
};

struct Diagnostic {
  enum class Severity { Error, Warning, Note };
  Severity severity = Severity::Error;
  SourceLoc loc;
  std::string message;
};

class DiagEngine {
public:
  explicit DiagEngine(const SourceFile &file) : file_(file) {}
  void error(SourceLoc loc, std::string message);
  void note(SourceLoc loc, std::string message);
  /// A problem that does not stop compilation (kilnc prints it and goes on).
  void warning(SourceLoc loc, std::string message);
  bool hasErrors() const { return errors_ > 0; }
  const std::vector<Diagnostic> &diagnostics() const { return diags_; }
  /// All diagnostics rendered with file:line:col, source line and caret.
  std::string render() const;
  const SourceFile &file() const { return file_; }

private:
  const SourceFile &file_;
  std::vector<Diagnostic> diags_;
  int errors_ = 0;
};

} // namespace kiln::frontend

#endif // KILN_FRONTEND_SOURCE_H
