//===- AST.h - Syntax tree of .kiln files -----------------------*- C++ -*-===//
//
// The parser's output: a plain tree, no types or shapes yet. The elaborator
// (Elaborate.cpp) gives it meaning. Grammar: docs/language.md.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_FRONTEND_AST_H
#define KILN_FRONTEND_AST_H

#include "frontend/Source.h"

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace kiln::frontend {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

/// One expression node. Which fields are used depends on `kind`.
struct Expr {
  enum class Kind {
    Int,    ///< intValue
    Float,  ///< floatValue
    Bool,   ///< boolValue
    String, ///< text
    Name,   ///< text
    Call,   ///< text = callee; args (argNames[i] non-empty for keywords)
    Unary,  ///< text = "-"; args[0]
    Binary, ///< text = operator; args[0], args[1]
    List,   ///< [a, b, ...]: args
    Tuple,  ///< (a, b, ...): args
    Index,  ///< x[i, a:b, ...]: args[0] = x, args[1..] = the index items
    Slice,  ///< a:b:c inside an index: args = {start, end, step}, each
            ///< null when omitted (the only kind with null args)
    Ellipsis, ///< '...' inside an index
  };
  Kind kind;
  SourceLoc loc;
  std::string text;
  int64_t intValue = 0;
  double floatValue = 0;
  bool boolValue = false;
  std::vector<ExprPtr> args;
  std::vector<std::string> argNames;
  std::vector<SourceLoc> argNameLocs;
  int depth = 1; ///< Height of this subtree; bounded by kMaxExprDepth.

  Expr(Kind k, SourceLoc l) : kind(k), loc(l) {}
};

struct Stmt;
using Block = std::vector<Stmt>;

struct Stmt {
  enum class Kind { Input, Assign, Unpack, Repeat, Stage, Return };
  Kind kind;
  SourceLoc loc;
  std::string name;      ///< Input name, assignment target, or repeat's 'as'.
  std::string index;     ///< Repeat's iteration variable: `repeat n as h, i`.
  SourceLoc indexLoc;
  SourceLoc nameLoc;
  std::vector<std::string> names; ///< Unpack targets: `p, q = f(x)`.
  std::vector<SourceLoc> nameLocs;
  std::string dtype;     ///< Input element type.
  SourceLoc dtypeLoc;
  std::vector<ExprPtr> dims; ///< Input dimensions.
  ExprPtr value;         ///< Assigned/returned value, repeat count or stage;
                         ///< `return a, b` returns a Tuple.
  Block body;            ///< Repeat or stage body.

  Stmt(Kind k, SourceLoc l) : kind(k), loc(l) {}
};

struct Param {
  std::string name;
  SourceLoc loc;
  ExprPtr defaultValue; ///< May be null for def parameters.
};

struct DefDecl {
  std::string name;
  SourceLoc loc;
  std::vector<Param> params;
  Block body;
};

struct ModelDecl {
  std::string name;
  SourceLoc loc;
  std::vector<Param> params;
  Block body;
};

struct TrainEntry {
  std::string key;
  SourceLoc loc;
  ExprPtr value;
};

struct FileAST {
  std::vector<DefDecl> defs;
  std::optional<ModelDecl> model;
  bool hasTrain = false;
  SourceLoc trainLoc;
  std::vector<TrainEntry> train;
};

} // namespace kiln::frontend

#endif // KILN_FRONTEND_AST_H
