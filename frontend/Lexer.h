//===- Lexer.h - Tokens of the .kiln language -------------------*- C++ -*-===//
#ifndef KILN_FRONTEND_LEXER_H
#define KILN_FRONTEND_LEXER_H

#include "frontend/Source.h"

#include <string>
#include <vector>

namespace kiln::frontend {

enum class Tok {
  Eof, Error, Ident, Int, Float, String,
  LParen, RParen, LBracket, RBracket, LBrace, RBrace,
  Comma, Colon, Semi, Assign, Plus, Minus, Star, Slash, SlashSlash,
  StarStar, At, Ellipsis,
  KwModel, KwInput, KwDef, KwRepeat, KwAs, KwReturn, KwTrain, KwTrue, KwFalse,
};

/// A printable description of a token kind for "expected ..." messages.
const char *describe(Tok kind);

struct Token {
  Tok kind = Tok::Eof;
  SourceLoc loc;
  std::string text;   ///< Spelling (identifier name, string contents).
  int64_t intValue = 0;
  double floatValue = 0;
};

/// Largest model file the frontend reads, in bytes.
constexpr size_t kMaxSourceBytes = 16u << 20;

/// Splits a file into tokens. On a lexical error it reports through `diags`
/// and the returned stream ends with a Tok::Error token.
std::vector<Token> lex(const SourceFile &file, DiagEngine &diags);

} // namespace kiln::frontend

#endif // KILN_FRONTEND_LEXER_H
