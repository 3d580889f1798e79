//===- Source.cpp - Model files and their diagnostics ---------------------===//
#include "frontend/Source.h"

#include <algorithm>

namespace kiln::frontend {

SourceFile::SourceFile(std::string name, std::string text)
    : name_(std::move(name)), text_(std::move(text)) {
  lineStarts_.push_back(0);
  for (size_t i = 0; i < text_.size(); ++i)
    if (text_[i] == '\n')
      lineStarts_.push_back(i + 1);
}

std::string_view SourceFile::lineText(uint32_t line) const {
  if (line == 0 || line > lineStarts_.size())
    return {};
  size_t begin = lineStarts_[line - 1];
  size_t end = line < lineStarts_.size() ? lineStarts_[line] - 1 : text_.size();
  std::string_view s(text_.data() + begin, end - begin);
  if (!s.empty() && s.back() == '\r')
    s.remove_suffix(1);
  return s;
}

void DiagEngine::error(SourceLoc loc, std::string message) {
  diags_.push_back({Diagnostic::Severity::Error, loc, std::move(message)});
  ++errors_;
}

void DiagEngine::warning(SourceLoc loc, std::string message) {
  diags_.push_back({Diagnostic::Severity::Warning, loc, std::move(message)});
}

void DiagEngine::note(SourceLoc loc, std::string message) {
  diags_.push_back({Diagnostic::Severity::Note, loc, std::move(message)});
}

namespace {
/// Makes a source line printable: tabs become spaces, other control bytes '?'.
std::string printable(std::string_view line, size_t limit) {
  std::string out;
  for (char c : line.substr(0, limit)) {
    if (c == '\t')
      out += ' ';
    else if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f)
      out += '?';
    else
      out += c;
  }
  if (line.size() > limit)
    out += " ...";
  return out;
}
} // namespace

std::string DiagEngine::render() const {
  constexpr size_t kMaxLine = 160;
  std::string out;
  for (const Diagnostic &d : diags_) {
    out += file_.name();
    if (d.loc.line > 0)
      out += ":" + std::to_string(d.loc.line) + ":" + std::to_string(d.loc.col);
    out += d.severity == Diagnostic::Severity::Error     ? ": error: "
           : d.severity == Diagnostic::Severity::Warning ? ": warning: "
                                                         : ": note: ";
    out += d.message;
    out += "\n";
    if (d.loc.line == 0)
      continue;
    std::string lineNo = std::to_string(d.loc.line);
    std::string gutter(lineNo.size() + 1, ' ');
    std::string_view line = file_.lineText(d.loc.line);
    out += " " + lineNo + " | " + printable(line, kMaxLine) + "\n";
    size_t col = d.loc.col > 0 ? d.loc.col - 1 : 0;
    if (col > kMaxLine)
      continue;
    size_t len = std::max<size_t>(1, std::min<size_t>(d.loc.length, 80));
    if (col + len > line.size() && line.size() > col)
      len = line.size() - col;
    out += gutter + " | " + std::string(col, ' ') + "^" +
           std::string(len > 1 ? len - 1 : 0, '~') + "\n";
  }
  return out;
}

} // namespace kiln::frontend
