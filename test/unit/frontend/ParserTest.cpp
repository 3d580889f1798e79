//===- ParserTest.cpp - Unit tests for the .kiln parser -------------------===//
#include "frontend/Parser.h"

#include <gtest/gtest.h>

using namespace kiln::frontend;

namespace {

struct Parsed {
  std::optional<FileAST> ast;
  std::string errors;
};

Parsed parseText(const std::string &text) {
  SourceFile file("p.kiln", text);
  DiagEngine diags(file);
  Parsed p;
  p.ast = parse(file, diags);
  p.errors = diags.render();
  return p;
}

TEST(Parser, ModelDefAndTrain) {
  Parsed p = parseText(R"(
def block(x, width = 4) {
  h = relu(linear(x, width))
  return x + h
}
model m(d = 8, n = 2) {
  input x: f32[B, d]
  input y: i32[B]
  repeat n as blocks { x = block(x) }
  logits = linear(x, 3)
  loss = cross_entropy(logits, y)
}
train { batch = 4  steps = 10, optimizer = adam(lr = 1e-3) ; seed = 1 }
)");
  ASSERT_TRUE(p.ast) << p.errors;
  ASSERT_EQ(p.ast->defs.size(), 1u);
  EXPECT_EQ(p.ast->defs[0].name, "block");
  ASSERT_EQ(p.ast->defs[0].params.size(), 2u);
  EXPECT_FALSE(p.ast->defs[0].params[0].defaultValue);
  EXPECT_TRUE(p.ast->defs[0].params[1].defaultValue);
  const ModelDecl &m = *p.ast->model;
  EXPECT_EQ(m.name, "m");
  ASSERT_EQ(m.body.size(), 5u);
  EXPECT_EQ(m.body[0].kind, Stmt::Kind::Input);
  EXPECT_EQ(m.body[0].dtype, "f32");
  EXPECT_EQ(m.body[0].dims.size(), 2u);
  EXPECT_EQ(m.body[2].kind, Stmt::Kind::Repeat);
  EXPECT_EQ(m.body[2].name, "blocks");
  EXPECT_EQ(m.body[2].body.size(), 1u);
  ASSERT_EQ(p.ast->train.size(), 4u);
  EXPECT_EQ(p.ast->train[2].key, "optimizer");
  EXPECT_EQ(p.ast->train[2].value->kind, Expr::Kind::Call);
}

TEST(Parser, PrecedenceAndAssociativity) {
  Parsed p = parseText("model m { a = 1 + 2 * 3 ** 2 ** 2  b = -x ** 2  c = (1, 2) d = [1, 2,] }");
  ASSERT_TRUE(p.ast) << p.errors;
  const Expr &a = *p.ast->model->body[0].value;
  ASSERT_EQ(a.kind, Expr::Kind::Binary);
  EXPECT_EQ(a.text, "+");
  const Expr &mul = *a.args[1];
  EXPECT_EQ(mul.text, "*");
  const Expr &pow = *mul.args[1];
  EXPECT_EQ(pow.text, "**");
  EXPECT_EQ(pow.args[1]->text, "**"); // right-associative
  const Expr &b = *p.ast->model->body[1].value;
  EXPECT_EQ(b.kind, Expr::Kind::Unary); // -(x ** 2)
  EXPECT_EQ(b.args[0]->text, "**");
  EXPECT_EQ(p.ast->model->body[2].value->kind, Expr::Kind::Tuple);
  EXPECT_EQ(p.ast->model->body[3].value->kind, Expr::Kind::List);
  EXPECT_EQ(p.ast->model->body[3].value->args.size(), 2u);
}

TEST(Parser, KeywordArguments) {
  Parsed p = parseText("model m { y = f(x, 3, bias = false, name = \"a\") }");
  ASSERT_TRUE(p.ast) << p.errors;
  const Expr &c = *p.ast->model->body[0].value;
  ASSERT_EQ(c.args.size(), 4u);
  EXPECT_EQ(c.argNames[0], "");
  EXPECT_EQ(c.argNames[2], "bias");
  EXPECT_EQ(c.argNames[3], "name");
}

TEST(Parser, IndexingAndTuples) {
  // Indexing is a postfix: y[...] after a primary; a list still parses.
  Parsed p = parseText("model m { a = x[:, -1, ..., 1:3:2] ** 2  b = [1][0]  "
                       "p, q = f(x)[0]  def_ = g(x) }"
                       "def f(x) { return x, x }");
  ASSERT_TRUE(p.ast) << p.errors;
  const Expr &pow = *p.ast->model->body[0].value;
  ASSERT_EQ(pow.text, "**");
  const Expr &ix = *pow.args[0];
  ASSERT_EQ(ix.kind, Expr::Kind::Index);
  ASSERT_EQ(ix.args.size(), 5u); // x and four items
  EXPECT_EQ(ix.args[1]->kind, Expr::Kind::Slice);
  EXPECT_FALSE(ix.args[1]->args[0]); // ':' has no start, end or step
  EXPECT_FALSE(ix.args[1]->args[2]);
  EXPECT_EQ(ix.args[2]->kind, Expr::Kind::Unary);
  EXPECT_EQ(ix.args[3]->kind, Expr::Kind::Ellipsis);
  const Expr &sl = *ix.args[4];
  ASSERT_EQ(sl.kind, Expr::Kind::Slice);
  EXPECT_EQ(sl.args[0]->intValue, 1);
  EXPECT_EQ(sl.args[1]->intValue, 3);
  EXPECT_EQ(sl.args[2]->intValue, 2);
  const Expr &b = *p.ast->model->body[1].value;
  ASSERT_EQ(b.kind, Expr::Kind::Index);
  EXPECT_EQ(b.args[0]->kind, Expr::Kind::List);
  const Stmt &unpack = p.ast->model->body[2];
  ASSERT_EQ(unpack.kind, Stmt::Kind::Unpack);
  EXPECT_EQ(unpack.names, (std::vector<std::string>{"p", "q"}));
  EXPECT_EQ(unpack.value->kind, Expr::Kind::Index);
  EXPECT_EQ(p.ast->model->body[3].kind, Stmt::Kind::Assign);
  const Stmt &ret = p.ast->defs[0].body[0];
  ASSERT_EQ(ret.kind, Stmt::Kind::Return);
  EXPECT_EQ(ret.value->kind, Expr::Kind::Tuple);
  EXPECT_EQ(ret.value->args.size(), 2u);
}

struct ErrorCase {
  const char *text;
  const char *message;
};

class ParserErrors : public testing::TestWithParam<ErrorCase> {};

TEST_P(ParserErrors, ReportsLocationAndExpectation) {
  Parsed p = parseText(GetParam().text);
  EXPECT_FALSE(p.ast);
  EXPECT_NE(p.errors.find(GetParam().message), std::string::npos) << p.errors;
  EXPECT_EQ(p.errors.rfind("p.kiln:", 0), 0u) << p.errors;
  EXPECT_NE(p.errors.find("^"), std::string::npos) << p.errors;
}

INSTANTIATE_TEST_SUITE_P(
    All, ParserErrors,
    testing::Values(
        ErrorCase{"", "no model in this file"},
        ErrorCase{"foo", "expected 'model', 'def' or 'train' at the top level"},
        ErrorCase{"model { }", "expected a model name"},
        ErrorCase{"model m(d) { }", "expected '=' and a value for model parameter 'd'"},
        ErrorCase{"model m(d = 1, d = 2) { }", "parameter 'd' is declared twice"},
        ErrorCase{"model m { x = }", "expected an expression"},
        ErrorCase{"model m { x = (1 + 2 }", "expected ')' to close the parenthesis"},
        ErrorCase{"model m { x = f(1, 2 }", "expected ')' to close the call to 'f'"},
        ErrorCase{"model m { x = f(a = 1, 2) }", "positional argument after a keyword"},
        ErrorCase{"model m { x = f(a = 1, a = 2) }", "argument 'a' is given twice"},
        ErrorCase{"model m { input x f32[1] }", "expected ':'"},
        ErrorCase{"model m { input x: f32(1) }", "expected '[' to start the input's shape"},
        ErrorCase{"model m { x 1 }", "expected '=' after the name"},
        ErrorCase{"model m { 3 }", "expected a statement"},
        ErrorCase{"model m { x = 1", "expected '}' to close the block"},
        ErrorCase{"model m { } model n { }", "a file holds one model"},
        ErrorCase{"model m { } train { } train { }", "a file holds one train section"},
        ErrorCase{"model m { } train { batch = 1 batch = 2 }", "train setting 'batch' is given twice"},
        ErrorCase{"model m { } train { 5 }", "expected a setting name"},
        ErrorCase{"def f(x) { return x } def f(y) { return y } model m { }", "def 'f' is defined twice"},
        ErrorCase{"model m { x = [1, 2 }", "expected ']' to close the list"},
        ErrorCase{"model m { x = y[] }", "expected an index, a slice 'start:end' or '...'"},
        ErrorCase{"model m { x = y[:, 0 }", "expected ']' to close the index"},
        ErrorCase{"model m { p, q 1 }", "expected '=' after the names"},
        ErrorCase{"model m { p, p = f(x) }", "'p' is assigned twice in one statement"}));

TEST(Parser, DeepNestingIsAnErrorNotACrash) {
  std::string deep = "model m { x = " + std::string(100000, '(') + "1" +
                     std::string(100000, ')') + " }";
  Parsed p = parseText(deep);
  EXPECT_FALSE(p.ast);
  EXPECT_NE(p.errors.find("nesting is deeper than"), std::string::npos);
  std::string blocks = "model m { ";
  for (int i = 0; i < 10000; ++i)
    blocks += "repeat 1 { ";
  Parsed q = parseText(blocks);
  EXPECT_FALSE(q.ast);
  EXPECT_NE(q.errors.find("nesting is deeper than"), std::string::npos);
  std::string unary = "model m { x = " + std::string(100000, '-') + "1 }";
  Parsed r = parseText(unary);
  EXPECT_FALSE(r.ast);
}

} // namespace
