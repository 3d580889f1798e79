//===- Parser.cpp - Recursive-descent parser for .kiln --------------------===//
//
// Stops at the first error: a message naming what was expected is worth more
// than a cascade. Recursion is bounded by kMaxNesting so no input can
// overflow the stack.
//
//===----------------------------------------------------------------------===//
#include "frontend/Parser.h"

#include <algorithm>

namespace kiln::frontend {
namespace {

class Parser {
public:
  Parser(std::vector<Token> tokens, DiagEngine &diags)
      : toks_(std::move(tokens)), diags_(diags) {}

  std::optional<FileAST> parseFile() {
    FileAST file;
    while (!failed_ && cur().kind != Tok::Eof) {
      switch (cur().kind) {
      case Tok::KwDef: {
        DefDecl d;
        parseDef(d);
        if (!failed_) {
          for (const DefDecl &other : file.defs)
            if (other.name == d.name) {
              error(d.loc, "def '" + d.name + "' is defined twice");
              note(other.loc, "first definition of '" + d.name + "'");
              return std::nullopt;
            }
          file.defs.push_back(std::move(d));
        }
        break;
      }
      case Tok::KwModel:
        if (file.model) {
          error(cur().loc, "a file holds one model, and '" + file.model->name +
                               "' is already defined");
          note(file.model->loc, "'" + file.model->name + "' is defined here");
          return std::nullopt;
        }
        file.model.emplace();
        parseModel(*file.model);
        break;
      case Tok::KwTrain:
        if (file.hasTrain) {
          error(cur().loc, "a file holds one train section");
          note(file.trainLoc, "the first train section is here");
          return std::nullopt;
        }
        parseTrain(file);
        break;
      case Tok::Error:
        failed_ = true;
        break;
      default:
        expected("'model', 'def' or 'train' at the top level");
        break;
      }
    }
    if (failed_)
      return std::nullopt;
    if (!file.model) {
      error(cur().loc, "no model in this file; expected 'model NAME(...) { ... }'");
      return std::nullopt;
    }
    return file;
  }

private:
  std::vector<Token> toks_;
  DiagEngine &diags_;
  size_t pos_ = 0;
  bool failed_ = false;
  int depth_ = 0;

  const Token &cur() const { return toks_[pos_]; }
  const Token &peekTok(size_t n = 1) const {
    return toks_[std::min(pos_ + n, toks_.size() - 1)];
  }
  void advance() {
    if (pos_ + 1 < toks_.size())
      ++pos_;
  }

  void error(SourceLoc loc, std::string message) {
    if (!failed_)
      diags_.error(loc, std::move(message));
    failed_ = true;
  }
  void note(SourceLoc loc, std::string message) {
    diags_.note(loc, std::move(message));
  }
  /// Reports "expected X, found Y" at the current token.
  bool expected(const std::string &what) {
    if (cur().kind == Tok::Error) { // the lexer already reported it
      failed_ = true;
      return false;
    }
    std::string found = describe(cur().kind);
    if (cur().kind == Tok::Ident || cur().kind == Tok::Int ||
        cur().kind == Tok::Float)
      found = "'" + cur().text + "'";
    error(cur().loc, "expected " + what + ", found " + found);
    return false;
  }
  bool expect(Tok kind, const char *context = nullptr) {
    if (failed_)
      return false;
    if (cur().kind != kind)
      return expected(std::string(describe(kind)) +
                      (context ? std::string(" ") + context : ""));
    advance();
    return true;
  }
  bool accept(Tok kind) {
    if (cur().kind != kind)
      return false;
    advance();
    return true;
  }
  bool expectIdent(std::string &name, SourceLoc &loc, const char *what) {
    if (failed_)
      return false;
    if (cur().kind != Tok::Ident)
      return expected(what);
    name = cur().text;
    loc = cur().loc;
    advance();
    return true;
  }

  /// RAII guard on nesting depth.
  struct Nest {
    Parser &p;
    bool ok;
    explicit Nest(Parser &parser) : p(parser), ok(++p.depth_ <= kMaxNesting) {
      if (!ok)
        p.error(p.cur().loc, "nesting is deeper than " +
                                 std::to_string(kMaxNesting) +
                                 " levels; split this into smaller pieces");
    }
    ~Nest() { --p.depth_; }
  };

  // params := '(' [ IDENT ['=' expr] {',' ...} [','] ] ')'
  bool parseParams(std::vector<Param> &params, bool requireDefault) {
    if (!expect(Tok::LParen, "after the name"))
      return false;
    while (!failed_ && cur().kind != Tok::RParen) {
      Param p;
      if (!expectIdent(p.name, p.loc, "a parameter name"))
        return false;
      for (const Param &q : params)
        if (q.name == p.name) {
          error(p.loc, "parameter '" + p.name + "' is declared twice");
          return false;
        }
      if (accept(Tok::Assign)) {
        p.defaultValue = parseExpr();
      } else if (requireDefault) {
        return expected("'=' and a value for model parameter '" + p.name + "'");
      }
      params.push_back(std::move(p));
      if (!accept(Tok::Comma))
        break;
    }
    return expect(Tok::RParen, "to close the parameter list");
  }

  void parseDef(DefDecl &d) {
    advance(); // 'def'
    if (!expectIdent(d.name, d.loc, "a name after 'def'"))
      return;
    if (!parseParams(d.params, /*requireDefault=*/false))
      return;
    parseBlock(d.body);
  }

  void parseModel(ModelDecl &m) {
    advance(); // 'model'
    if (!expectIdent(m.name, m.loc, "a model name after 'model'"))
      return;
    if (cur().kind == Tok::LParen && !parseParams(m.params, true))
      return;
    parseBlock(m.body);
  }

  // train := 'train' '{' { IDENT '=' expr [','|';'] } '}'
  void parseTrain(FileAST &file) {
    file.hasTrain = true;
    file.trainLoc = cur().loc;
    advance();
    if (!expect(Tok::LBrace, "to open the train section"))
      return;
    while (!failed_ && cur().kind != Tok::RBrace) {
      if (accept(Tok::Semi) || accept(Tok::Comma))
        continue;
      TrainEntry e;
      if (!expectIdent(e.key, e.loc, "a setting name (e.g. batch, steps, "
                                     "optimizer) or '}'"))
        return;
      for (const TrainEntry &o : file.train)
        if (o.key == e.key) {
          error(e.loc, "train setting '" + e.key + "' is given twice");
          note(o.loc, "first given here");
          return;
        }
      if (!expect(Tok::Assign, "after the setting name"))
        return;
      e.value = parseExpr();
      file.train.push_back(std::move(e));
    }
    expect(Tok::RBrace, "to close the train section");
  }

  // block := '{' { stmt } '}'
  void parseBlock(Block &body) {
    Nest nest(*this);
    if (!nest.ok)
      return;
    if (!expect(Tok::LBrace))
      return;
    while (!failed_ && cur().kind != Tok::RBrace) {
      if (cur().kind == Tok::Eof) {
        expected("'}' to close the block");
        return;
      }
      parseStmt(body);
    }
    expect(Tok::RBrace);
  }

  void parseStmt(Block &body) {
    switch (cur().kind) {
    case Tok::Semi:
      advance();
      return;
    case Tok::KwInput: {
      Stmt s(Stmt::Kind::Input, cur().loc);
      advance();
      if (!expectIdent(s.name, s.nameLoc, "an input name after 'input'") ||
          !expect(Tok::Colon, "and a type after the input name, as in "
                              "'input x: f32[B, 64]'"))
        return;
      if (!expectIdent(s.dtype, s.dtypeLoc,
                       "an element type (f64, f32, f16, bf16, i64, i32, i1)") ||
          !expect(Tok::LBracket, "to start the input's shape"))
        return;
      while (!failed_ && cur().kind != Tok::RBracket) {
        s.dims.push_back(parseExpr());
        if (!accept(Tok::Comma))
          break;
      }
      if (!expect(Tok::RBracket, "to close the input's shape"))
        return;
      body.push_back(std::move(s));
      return;
    }
    case Tok::KwRepeat: {
      Stmt s(Stmt::Kind::Repeat, cur().loc);
      advance();
      s.value = parseExpr();
      if (accept(Tok::KwAs)) {
        if (!expectIdent(s.name, s.nameLoc, "a scope name after 'as'"))
          return;
        // `repeat n as h, i`: i is the iteration's index in the body.
        if (accept(Tok::Comma) &&
            !expectIdent(s.index, s.indexLoc,
                         "an index name after 'as NAME,' (as in 'repeat 4 as h, i')"))
          return;
      }
      parseBlock(s.body);
      body.push_back(std::move(s));
      return;
    }
    case Tok::KwReturn: {
      // return expr { ',' expr }: several values return a tuple.
      Stmt s(Stmt::Kind::Return, cur().loc);
      advance();
      s.value = parseExpr();
      if (!failed_ && cur().kind == Tok::Comma) {
        ExprPtr tuple = make(Expr::Kind::Tuple, s.value->loc);
        tuple->args.push_back(std::move(s.value));
        while (!failed_ && accept(Tok::Comma))
          tuple->args.push_back(parseExpr());
        for (const ExprPtr &x : tuple->args)
          tuple->depth = std::max(tuple->depth, 1 + x->depth);
        s.value = std::move(tuple);
      }
      body.push_back(std::move(s));
      return;
    }
    case Tok::Ident: {
      if (cur().text == "stage" && peekTok().kind != Tok::Comma &&
          peekTok().kind != Tok::Assign) {
        // stage EXPR { ... }: the block's ops run on pipeline stage EXPR
        // ("stage" stays an ordinary name elsewhere).
        Stmt s(Stmt::Kind::Stage, cur().loc);
        advance();
        s.value = parseExpr();
        parseBlock(s.body);
        body.push_back(std::move(s));
        return;
      }
      if (peekTok().kind == Tok::Comma) {
        // NAME ',' NAME { ',' NAME } '=' expr: unpacks a tuple.
        Stmt s(Stmt::Kind::Unpack, cur().loc);
        do {
          std::string name;
          SourceLoc loc;
          if (!expectIdent(name, loc, "a name to assign to (as in "
                                      "'p, q = f(x)')"))
            return;
          for (const std::string &n : s.names)
            if (n == name) {
              error(loc, "'" + name + "' is assigned twice in one statement");
              return;
            }
          s.names.push_back(name);
          s.nameLocs.push_back(loc);
        } while (accept(Tok::Comma));
        if (!expect(Tok::Assign, "after the names; unpacking is 'p, q = "
                                 "expression'"))
          return;
        s.value = parseExpr();
        body.push_back(std::move(s));
        return;
      }
      Stmt s(Stmt::Kind::Assign, cur().loc);
      s.name = cur().text;
      s.nameLoc = cur().loc;
      advance();
      if (!expect(Tok::Assign, "after the name; statements are 'NAME = "
                               "expression', 'input', 'repeat' or 'return'"))
        return;
      s.value = parseExpr();
      body.push_back(std::move(s));
      return;
    }
    default:
      expected("a statement ('NAME = expression', 'input', 'repeat', 'stage' or "
               "'return') or '}'");
      return;
    }
  }

  ExprPtr make(Expr::Kind k, SourceLoc loc) {
    return std::make_unique<Expr>(k, loc);
  }
  ExprPtr binary(std::string op, SourceLoc loc, ExprPtr l, ExprPtr r) {
    ExprPtr e = make(Expr::Kind::Binary, loc);
    e->text = std::move(op);
    e->depth = 1 + std::max(l->depth, r->depth);
    e->args.push_back(std::move(l));
    e->args.push_back(std::move(r));
    if (e->depth > kMaxExprDepth) {
      error(loc, "expression is deeper than " + std::to_string(kMaxExprDepth) +
                     " operators; split it into several statements");
      return bad();
    }
    return e;
  }
  /// A placeholder returned after an error, so callers never see null.
  ExprPtr bad() { return make(Expr::Kind::Int, cur().loc); }

  // expr := term { ('+'|'-') term }
  ExprPtr parseExpr() {
    Nest nest(*this);
    if (!nest.ok || failed_)
      return bad();
    ExprPtr lhs = parseTerm();
    while (!failed_ && (cur().kind == Tok::Plus || cur().kind == Tok::Minus)) {
      std::string op = cur().kind == Tok::Plus ? "+" : "-";
      SourceLoc loc = cur().loc;
      advance();
      lhs = binary(op, loc, std::move(lhs), parseTerm());
    }
    return lhs;
  }

  // term := unary { ('*'|'/'|'//'|'@') unary }
  ExprPtr parseTerm() {
    ExprPtr lhs = parseUnary();
    while (!failed_) {
      const char *op = nullptr;
      switch (cur().kind) {
      case Tok::Star: op = "*"; break;
      case Tok::Slash: op = "/"; break;
      case Tok::SlashSlash: op = "//"; break;
      case Tok::At: op = "@"; break;
      default: break;
      }
      if (!op)
        break;
      SourceLoc loc = cur().loc;
      advance();
      lhs = binary(op, loc, std::move(lhs), parseUnary());
    }
    return lhs;
  }

  // unary := '-' unary | power
  ExprPtr parseUnary() {
    Nest nest(*this);
    if (!nest.ok || failed_)
      return bad();
    if (cur().kind == Tok::Minus) {
      ExprPtr e = make(Expr::Kind::Unary, cur().loc);
      e->text = "-";
      advance();
      e->args.push_back(parseUnary());
      e->depth = 1 + e->args[0]->depth;
      return e;
    }
    return parsePower();
  }

  // power := postfix ['**' unary]   (right-associative, binds tighter than '-')
  ExprPtr parsePower() {
    ExprPtr base = parsePostfix();
    if (!failed_ && cur().kind == Tok::StarStar) {
      SourceLoc loc = cur().loc;
      advance();
      return binary("**", loc, std::move(base), parseUnary());
    }
    return base;
  }

  // args := [ arg {',' arg} [','] ] ; arg := [IDENT '='] expr
  void parseArgs(Expr &call, Tok close) {
    bool sawKeyword = false;
    while (!failed_ && cur().kind != close) {
      std::string name;
      SourceLoc nameLoc;
      if (cur().kind == Tok::Ident && peekTok().kind == Tok::Assign) {
        name = cur().text;
        nameLoc = cur().loc;
        for (const std::string &other : call.argNames)
          if (other == name) {
            error(nameLoc, "argument '" + name + "' is given twice");
            return;
          }
        advance();
        advance();
        sawKeyword = true;
      } else if (sawKeyword) {
        error(cur().loc, "positional argument after a keyword argument; "
                         "write positional arguments first");
        return;
      }
      call.args.push_back(parseExpr());
      call.depth = std::max(call.depth, 1 + call.args.back()->depth);
      call.argNames.push_back(name);
      call.argNameLocs.push_back(nameLoc);
      if (!accept(Tok::Comma))
        break;
    }
  }

  // postfix := primary { '[' item { ',' item } [','] ']' }
  // item    := '...' | [expr] ':' [expr] [':' [expr]] | expr
  ExprPtr parsePostfix() {
    ExprPtr base = parsePrimary();
    while (!failed_ && cur().kind == Tok::LBracket) {
      ExprPtr index = make(Expr::Kind::Index, cur().loc);
      advance();
      index->depth = 1 + base->depth;
      index->args.push_back(std::move(base));
      if (cur().kind == Tok::RBracket) {
        expected("an index, a slice 'start:end' or '...' inside '[]'");
        return bad();
      }
      while (!failed_ && cur().kind != Tok::RBracket) {
        index->args.push_back(parseIndexItem());
        index->depth = std::max(index->depth, 1 + index->args.back()->depth);
        if (!accept(Tok::Comma))
          break;
      }
      expect(Tok::RBracket, "to close the index (as in x[:, 0] or "
                            "x[..., 1:3])");
      if (index->depth > kMaxExprDepth) {
        error(index->loc, "expression is deeper than " +
                              std::to_string(kMaxExprDepth) +
                              " operators; split it into several statements");
        return bad();
      }
      base = std::move(index);
    }
    return base;
  }

  ExprPtr parseIndexItem() {
    if (cur().kind == Tok::Ellipsis) {
      ExprPtr e = make(Expr::Kind::Ellipsis, cur().loc);
      e->loc.length = 3;
      advance();
      return e;
    }
    SourceLoc loc = cur().loc;
    ExprPtr start;
    if (cur().kind != Tok::Colon) {
      start = parseExpr();
      if (cur().kind != Tok::Colon)
        return start; // a plain index
    }
    ExprPtr slice = make(Expr::Kind::Slice, loc);
    advance(); // ':'
    auto endsPart = [&] {
      return cur().kind == Tok::Colon || cur().kind == Tok::Comma ||
             cur().kind == Tok::RBracket;
    };
    ExprPtr end, step;
    if (!endsPart())
      end = parseExpr();
    if (!failed_ && accept(Tok::Colon) && !endsPart())
      step = parseExpr();
    for (ExprPtr *p : {&start, &end, &step}) {
      if (*p)
        slice->depth = std::max(slice->depth, 1 + (*p)->depth);
      slice->args.push_back(std::move(*p));
    }
    return slice;
  }

  ExprPtr parsePrimary() {
    const Token &t = cur();
    switch (t.kind) {
    case Tok::Int: {
      ExprPtr e = make(Expr::Kind::Int, t.loc);
      e->intValue = t.intValue;
      e->text = t.text;
      advance();
      return e;
    }
    case Tok::Float: {
      ExprPtr e = make(Expr::Kind::Float, t.loc);
      e->floatValue = t.floatValue;
      e->text = t.text;
      advance();
      return e;
    }
    case Tok::String: {
      ExprPtr e = make(Expr::Kind::String, t.loc);
      e->text = t.text;
      advance();
      return e;
    }
    case Tok::KwTrue:
    case Tok::KwFalse: {
      ExprPtr e = make(Expr::Kind::Bool, t.loc);
      e->boolValue = t.kind == Tok::KwTrue;
      advance();
      return e;
    }
    case Tok::Ident: {
      if (peekTok().kind == Tok::LParen) {
        ExprPtr e = make(Expr::Kind::Call, t.loc);
        e->text = t.text;
        advance();
        advance();
        parseArgs(*e, Tok::RParen);
        expect(Tok::RParen, ("to close the call to '" + e->text + "'").c_str());
        return e;
      }
      ExprPtr e = make(Expr::Kind::Name, t.loc);
      e->text = t.text;
      advance();
      return e;
    }
    case Tok::LParen: {
      SourceLoc loc = t.loc;
      advance();
      ExprPtr first = parseExpr();
      if (accept(Tok::RParen))
        return first;
      ExprPtr tuple = make(Expr::Kind::Tuple, loc);
      tuple->args.push_back(std::move(first));
      while (!failed_ && accept(Tok::Comma)) {
        if (cur().kind == Tok::RParen)
          break;
        tuple->args.push_back(parseExpr());
      }
      for (const ExprPtr &x : tuple->args)
        tuple->depth = std::max(tuple->depth, 1 + x->depth);
      expect(Tok::RParen, "to close the parenthesis");
      return tuple;
    }
    case Tok::LBracket: {
      ExprPtr list = make(Expr::Kind::List, t.loc);
      advance();
      while (!failed_ && cur().kind != Tok::RBracket) {
        list->args.push_back(parseExpr());
        list->depth = std::max(list->depth, 1 + list->args.back()->depth);
        if (!accept(Tok::Comma))
          break;
      }
      expect(Tok::RBracket, "to close the list");
      return list;
    }
    default:
      expected("an expression (a name, number, string, call, '(' or '[')");
      return bad();
    }
  }
};

} // namespace

std::optional<FileAST> parse(const SourceFile &file, DiagEngine &diags) {
  std::vector<Token> tokens = lex(file, diags);
  if (diags.hasErrors())
    return std::nullopt;
  return Parser(std::move(tokens), diags).parseFile();
}

} // namespace kiln::frontend
