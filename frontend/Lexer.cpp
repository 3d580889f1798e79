//===- Lexer.cpp - Tokens of the .kiln language ---------------------------===//
#include "frontend/Lexer.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string_view>

namespace kiln::frontend {

const char *describe(Tok kind) {
  switch (kind) {
  case Tok::Eof: return "end of file";
  case Tok::Error: return "invalid token";
  case Tok::Ident: return "a name";
  case Tok::Int: return "an integer";
  case Tok::Float: return "a number";
  case Tok::String: return "a string";
  case Tok::LParen: return "'('";
  case Tok::RParen: return "')'";
  case Tok::LBracket: return "'['";
  case Tok::RBracket: return "']'";
  case Tok::LBrace: return "'{'";
  case Tok::RBrace: return "'}'";
  case Tok::Comma: return "','";
  case Tok::Colon: return "':'";
  case Tok::Semi: return "';'";
  case Tok::Assign: return "'='";
  case Tok::Plus: return "'+'";
  case Tok::Minus: return "'-'";
  case Tok::Star: return "'*'";
  case Tok::Slash: return "'/'";
  case Tok::SlashSlash: return "'//'";
  case Tok::StarStar: return "'**'";
  case Tok::At: return "'@'";
  case Tok::Ellipsis: return "'...'";
  case Tok::KwModel: return "'model'";
  case Tok::KwInput: return "'input'";
  case Tok::KwDef: return "'def'";
  case Tok::KwRepeat: return "'repeat'";
  case Tok::KwAs: return "'as'";
  case Tok::KwReturn: return "'return'";
  case Tok::KwTrain: return "'train'";
  case Tok::KwTrue: return "'true'";
  case Tok::KwFalse: return "'false'";
  }
  return "token";
}

namespace {

class Lexer {
public:
  Lexer(const SourceFile &file, DiagEngine &diags)
      : src_(file.text()), diags_(diags) {}

  std::vector<Token> run() {
    std::vector<Token> out;
    if (src_.size() > kMaxSourceBytes) {
      diags_.error({1, 1, 1}, "file is " + std::to_string(src_.size()) +
                                  " bytes; model files are limited to " +
                                  std::to_string(kMaxSourceBytes) + " bytes");
      out.push_back(errorToken());
      return out;
    }
    while (true) {
      Token t = next();
      out.push_back(t);
      if (t.kind == Tok::Eof || t.kind == Tok::Error)
        break;
    }
    return out;
  }

private:
  std::string_view src_;
  DiagEngine &diags_;
  size_t pos_ = 0;
  uint32_t line_ = 1, col_ = 1;

  char peek(size_t ahead = 0) const {
    return pos_ + ahead < src_.size() ? src_[pos_ + ahead] : '\0';
  }
  bool atEnd() const { return pos_ >= src_.size(); }
  void advance() {
    if (src_[pos_] == '\n') {
      ++line_;
      col_ = 1;
    } else {
      ++col_;
    }
    ++pos_;
  }
  Token errorToken() {
    Token t;
    t.kind = Tok::Error;
    t.loc = {line_, col_, 1};
    return t;
  }
  Token fail(SourceLoc loc, std::string message) {
    diags_.error(loc, std::move(message));
    Token t;
    t.kind = Tok::Error;
    t.loc = loc;
    return t;
  }

  /// Skips whitespace and comments ('#' to the end of the line).
  void skipTrivia() {
    while (!atEnd()) {
      char c = peek();
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        advance();
      } else if (c == '#') {
        while (!atEnd() && peek() != '\n')
          advance();
      } else {
        break;
      }
    }
  }

  static bool isIdentStart(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  }
  static bool isDigit(char c) { return c >= '0' && c <= '9'; }

  Token next() {
    skipTrivia();
    Token t;
    t.loc = {line_, col_, 1};
    if (atEnd()) {
      t.kind = Tok::Eof;
      return t;
    }
    char c = peek();
    size_t start = pos_;
    if (isIdentStart(c)) {
      while (!atEnd() && (isIdentStart(peek()) || isDigit(peek())))
        advance();
      t.text = std::string(src_.substr(start, pos_ - start));
      t.loc.length = static_cast<uint32_t>(pos_ - start);
      t.kind = keyword(t.text);
      return t;
    }
    if (isDigit(c))
      return number(t.loc);
    if (c == '"')
      return string(t.loc);
    advance();
    auto single = [&](Tok k) {
      t.kind = k;
      return t;
    };
    switch (c) {
    case '(': return single(Tok::LParen);
    case ')': return single(Tok::RParen);
    case '[': return single(Tok::LBracket);
    case ']': return single(Tok::RBracket);
    case '{': return single(Tok::LBrace);
    case '}': return single(Tok::RBrace);
    case ',': return single(Tok::Comma);
    case ':': return single(Tok::Colon);
    case ';': return single(Tok::Semi);
    case '=': return single(Tok::Assign);
    case '+': return single(Tok::Plus);
    case '-': return single(Tok::Minus);
    case '@': return single(Tok::At);
    case '.':
      if (peek() == '.' && peek(1) == '.') { // '...' in an index: x[..., 0]
        advance();
        advance();
        t.loc.length = 3;
        return single(Tok::Ellipsis);
      }
      break;
    case '*':
      if (peek() == '*') {
        advance();
        t.loc.length = 2;
        return single(Tok::StarStar);
      }
      return single(Tok::Star);
    case '/':
      if (peek() == '/') {
        advance();
        t.loc.length = 2;
        return single(Tok::SlashSlash);
      }
      return single(Tok::Slash);
    default:
      break;
    }
    unsigned char u = static_cast<unsigned char>(c);
    char buf[8];
    std::snprintf(buf, sizeof buf, "0x%02X", u);
    if (u >= 0x80 || u < 0x20 || u == 0x7f)
      return fail(t.loc, std::string("unexpected byte ") + buf +
                             " outside a string or comment; model files are "
                             "plain text (is this a binary file?)");
    return fail(t.loc, std::string("unexpected character '") + c +
                           "'; expected a name, a number, a string or one of "
                           "( ) [ ] { } , : ; = + - * / ** @");
  }

  static Tok keyword(const std::string &s) {
    if (s == "model") return Tok::KwModel;
    if (s == "input") return Tok::KwInput;
    if (s == "def") return Tok::KwDef;
    if (s == "repeat") return Tok::KwRepeat;
    if (s == "as") return Tok::KwAs;
    if (s == "return") return Tok::KwReturn;
    if (s == "train") return Tok::KwTrain;
    if (s == "true") return Tok::KwTrue;
    if (s == "false") return Tok::KwFalse;
    return Tok::Ident;
  }

  Token number(SourceLoc loc) {
    size_t start = pos_;
    bool isFloat = false;
    while (isDigit(peek()))
      advance();
    if (peek() == '.' && isDigit(peek(1))) {
      isFloat = true;
      advance();
      while (isDigit(peek()))
        advance();
    }
    if ((peek() == 'e' || peek() == 'E') &&
        (isDigit(peek(1)) ||
         ((peek(1) == '+' || peek(1) == '-') && isDigit(peek(2))))) {
      isFloat = true;
      advance();
      if (peek() == '+' || peek() == '-')
        advance();
      while (isDigit(peek()))
        advance();
    }
    std::string text(src_.substr(start, pos_ - start));
    loc.length = static_cast<uint32_t>(text.size());
    if (isIdentStart(peek()))
      return fail({line_, col_, 1},
                  "unexpected '" + std::string(1, peek()) + "' after number '" +
                      text + "'; separate names from numbers");
    Token t;
    t.loc = loc;
    t.text = text;
    if (isFloat) {
      errno = 0;
      double v = std::strtod(text.c_str(), nullptr);
      if (errno == ERANGE && std::isinf(v))
        return fail(loc, "number '" + text + "' is out of range");
      t.kind = Tok::Float;
      t.floatValue = v;
      return t;
    }
    errno = 0;
    long long v = std::strtoll(text.c_str(), nullptr, 10);
    if (errno == ERANGE)
      return fail(loc, "integer '" + text +
                           "' is too large (the limit is 9223372036854775807)");
    t.kind = Tok::Int;
    t.intValue = v;
    t.floatValue = static_cast<double>(v);
    return t;
  }

  Token string(SourceLoc loc) {
    advance(); // opening quote
    std::string value;
    while (true) {
      if (atEnd() || peek() == '\n')
        return fail(loc, "unterminated string; add the closing '\"' on the "
                         "same line");
      char c = peek();
      advance();
      if (c == '"')
        break;
      if (c == '\\') {
        char e = atEnd() ? '\0' : peek();
        if (e == '"' || e == '\\') {
          value += e;
          advance();
        } else if (e == 'n') {
          value += '\n';
          advance();
        } else {
          return fail({line_, col_ - 1, 2},
                      "unknown escape in string; use \\\" \\\\ or \\n");
        }
        continue;
      }
      value += c;
    }
    Token t;
    t.kind = Tok::String;
    t.loc = loc;
    t.loc.length = static_cast<uint32_t>(col_ > loc.col ? col_ - loc.col : 1);
    t.text = std::move(value);
    return t;
  }
};

} // namespace

std::vector<Token> lex(const SourceFile &file, DiagEngine &diags) {
  return Lexer(file, diags).run();
}

} // namespace kiln::frontend
