//===- LexerTest.cpp - Unit tests for the .kiln lexer ---------------------===//
#include "frontend/Lexer.h"

#include <gtest/gtest.h>

using namespace kiln::frontend;

namespace {

std::vector<Token> lexText(const std::string &text, std::string *errors = nullptr) {
  SourceFile file("t.kiln", text);
  DiagEngine diags(file);
  std::vector<Token> toks = lex(file, diags);
  if (errors)
    *errors = diags.render();
  return toks;
}

TEST(Lexer, KeywordsNamesAndPunctuation) {
  auto t = lexText("model m(d = 4) { input x: f32[B, d] }");
  std::vector<Tok> kinds;
  for (const Token &k : t)
    kinds.push_back(k.kind);
  std::vector<Tok> want = {Tok::KwModel, Tok::Ident,  Tok::LParen, Tok::Ident,
                           Tok::Assign,  Tok::Int,    Tok::RParen, Tok::LBrace,
                           Tok::KwInput, Tok::Ident,  Tok::Colon,  Tok::Ident,
                           Tok::LBracket, Tok::Ident, Tok::Comma,  Tok::Ident,
                           Tok::RBracket, Tok::RBrace, Tok::Eof};
  EXPECT_EQ(kinds, want);
}

TEST(Lexer, Numbers) {
  auto t = lexText("42 1.5 1e-3 2E+2 0.25");
  ASSERT_EQ(t.size(), 6u);
  EXPECT_EQ(t[0].kind, Tok::Int);
  EXPECT_EQ(t[0].intValue, 42);
  EXPECT_EQ(t[1].kind, Tok::Float);
  EXPECT_DOUBLE_EQ(t[1].floatValue, 1.5);
  EXPECT_EQ(t[2].kind, Tok::Float);
  EXPECT_DOUBLE_EQ(t[2].floatValue, 1e-3);
  EXPECT_DOUBLE_EQ(t[3].floatValue, 200.0);
  EXPECT_DOUBLE_EQ(t[4].floatValue, 0.25);
}

TEST(Lexer, Operators) {
  auto t = lexText("a ** b // c / d * e @ f - g + h");
  std::vector<Tok> ops;
  for (const Token &k : t)
    if (k.kind != Tok::Ident && k.kind != Tok::Eof)
      ops.push_back(k.kind);
  std::vector<Tok> want = {Tok::StarStar, Tok::SlashSlash, Tok::Slash,
                           Tok::Star,     Tok::At,         Tok::Minus,
                           Tok::Plus};
  EXPECT_EQ(ops, want);
}

TEST(Lexer, Ellipsis) {
  // '...' is one token (x[..., 0]); '..' and '.' alone are errors.
  auto t = lexText("x[..., 0]");
  ASSERT_EQ(t.size(), 7u);
  EXPECT_EQ(t[2].kind, Tok::Ellipsis);
  EXPECT_EQ(t[2].loc.col, 3u);
  EXPECT_EQ(t[2].loc.length, 3u);
  EXPECT_EQ(t[3].kind, Tok::Comma);
  std::string errors;
  auto bad = lexText("x[.., 0]", &errors);
  EXPECT_EQ(bad.back().kind, Tok::Error);
  EXPECT_NE(errors.find("unexpected character '.'"), std::string::npos) << errors;
}

TEST(Lexer, CommentsAndLocations) {
  auto t = lexText("# header\n  x = 1 # trailing\n\ty");
  ASSERT_EQ(t.size(), 5u);
  EXPECT_EQ(t[0].text, "x");
  EXPECT_EQ(t[0].loc.line, 2u);
  EXPECT_EQ(t[0].loc.col, 3u);
  EXPECT_EQ(t[3].text, "y");
  EXPECT_EQ(t[3].loc.line, 3u);
  EXPECT_EQ(t[3].loc.col, 2u);
}

TEST(Lexer, Strings) {
  auto t = lexText(R"("data/a b.bin" "q\"uote\\")");
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(t[0].kind, Tok::String);
  EXPECT_EQ(t[0].text, "data/a b.bin");
  EXPECT_EQ(t[1].text, "q\"uote\\");
}

TEST(Lexer, ErrorsNameLineColumnAndCaret) {
  std::string err;
  auto t = lexText("x = 1\ny = $", &err);
  EXPECT_EQ(t.back().kind, Tok::Error);
  EXPECT_NE(err.find("t.kiln:2:5: error: unexpected character '$'"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find(" 2 | y = $"), std::string::npos) << err;
  EXPECT_NE(err.find("   |     ^"), std::string::npos) << err;
}

TEST(Lexer, RejectsBinaryAndBadLiterals) {
  std::string err;
  lexText(std::string("x = \x01\xff"), &err);
  EXPECT_NE(err.find("unexpected byte 0x01"), std::string::npos) << err;
  lexText("x = \"open", &err);
  EXPECT_NE(err.find("unterminated string"), std::string::npos) << err;
  lexText("x = 99999999999999999999", &err);
  EXPECT_NE(err.find("too large"), std::string::npos) << err;
  lexText("x = 1e999", &err);
  EXPECT_NE(err.find("out of range"), std::string::npos) << err;
  lexText("x = 12abc", &err);
  EXPECT_NE(err.find("after number"), std::string::npos) << err;
}

TEST(Lexer, RejectsOversizedFiles) {
  std::string err;
  auto t = lexText(std::string(kMaxSourceBytes + 1, ' '), &err);
  EXPECT_EQ(t.back().kind, Tok::Error);
  EXPECT_NE(err.find("limited to"), std::string::npos) << err;
}

} // namespace
