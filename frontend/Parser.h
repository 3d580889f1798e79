//===- Parser.h - Recursive-descent parser for .kiln ------------*- C++ -*-===//
#ifndef KILN_FRONTEND_PARSER_H
#define KILN_FRONTEND_PARSER_H

#include "frontend/AST.h"
#include "frontend/Lexer.h"

namespace kiln::frontend {

/// Deepest nesting of expressions and blocks the parser accepts.
constexpr int kMaxNesting = 128;
/// Tallest expression tree the parser accepts (long operator chains such as
/// `a + b + c + ...` grow the tree without nesting).
constexpr int kMaxExprDepth = 256;

/// Parses a whole file. Returns std::nullopt after reporting the first
/// syntax error through `diags`.
std::optional<FileAST> parse(const SourceFile &file, DiagEngine &diags);

} // namespace kiln::frontend

#endif // KILN_FRONTEND_PARSER_H
