//===- FuzzTest.cpp - No model file crashes, hangs or asserts -------------===//
//
// Feeds thousands of mutated versions of the examples (truncations, byte
// flips, token swaps, deletions, duplications, deep nesting) and a set of
// pathological inputs through the whole frontend (lex, parse, elaborate,
// verify). Every input must end in one of two ways: a module that verifies,
// or a failure with at least one diagnostic that carries file:line:col.
// Anything else — a crash (caught by ASan/UBSan in the sanitizer build), a
// failure without a diagnostic, IR that fails verification (an internal
// error), or an input that takes longer than kSlowSeconds — fails the test.
//
// The mutation RNG is seeded, so a failure is reproducible; the failing input
// is written to the test's temporary directory and named in the message.
//
//===----------------------------------------------------------------------===//
#include "frontend/Frontend.h"
#include "frontend/Lexer.h"

#include "dialects/kiln/KilnDialect.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"

#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <random>
#include <sstream>

using namespace kiln::frontend;

namespace {

#ifndef KILN_EXAMPLES_DIR
#error "KILN_EXAMPLES_DIR must point at examples/"
#endif

constexpr double kSlowSeconds = 10.0;

std::string readFile(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Outcome {
  bool valid = false;
  std::string problem; ///< Non-empty when the frontend misbehaved.
};

class Harness {
public:
  Harness() {
    ctx_.loadDialect<kiln::KilnDialect, mlir::func::FuncDialect>();
    // Verification failures are reported by the outcome, not printed.
    ctx_.getDiagEngine().registerHandler([this](mlir::Diagnostic &d) {
      mlirDiags_ += d.str() + "\n";
      return mlir::success();
    });
  }

  Outcome run(const std::string &text) {
    Outcome o;
    mlirDiags_.clear();
    SourceFile file("fuzz.kiln", text);
    DiagEngine diags(file);
    auto start = std::chrono::steady_clock::now();
    FrontendOptions opts;
    mlir::OwningOpRef<mlir::ModuleOp> module = buildModule(ctx_, file, opts, diags);
    double seconds = std::chrono::duration<double>(
                         std::chrono::steady_clock::now() - start)
                         .count();
    if (seconds > kSlowSeconds)
      o.problem = "took " + std::to_string(seconds) + " s";
    if (module) {
      if (mlir::failed(mlir::verify(*module)))
        o.problem = "built IR that fails verification:\n" + mlirDiags_;
      else
        o.valid = true;
      return o;
    }
    if (!diags.hasErrors()) {
      o.problem = "failed without a diagnostic";
      return o;
    }
    const Diagnostic &first = diags.diagnostics().front();
    std::string rendered = diags.render();
    if (first.loc.line == 0 || rendered.find("fuzz.kiln:") != 0)
      o.problem = "diagnostic without file:line:col:\n" + rendered;
    return o;
  }

private:
  mlir::MLIRContext ctx_;
  std::string mlirDiags_;
};

/// Splits text into token-ish pieces (runs of word characters, single
/// punctuation, runs of whitespace) so mutations can swap whole tokens.
std::vector<std::string> pieces(const std::string &text) {
  std::vector<std::string> out;
  size_t i = 0;
  auto word = [](char c) { return std::isalnum((unsigned char)c) || c == '_' || c == '.'; };
  while (i < text.size()) {
    size_t j = i + 1;
    if (word(text[i]))
      while (j < text.size() && word(text[j])) ++j;
    else if (std::isspace((unsigned char)text[i]))
      while (j < text.size() && std::isspace((unsigned char)text[j])) ++j;
    out.push_back(text.substr(i, j - i));
    i = j;
  }
  return out;
}

std::string join(const std::vector<std::string> &ps) {
  std::string s;
  for (const std::string &p : ps)
    s += p;
  return s;
}

std::string mutate(const std::string &seed, std::mt19937_64 &rng, int &kind) {
  std::string s = seed;
  auto pick = [&](size_t n) { return n ? size_t(rng() % n) : 0; };
  kind = int(rng() % 7);
  switch (kind) {
  case 0: // truncate
    return s.substr(0, pick(s.size()));
  case 1: { // flip random bytes (including non-ASCII and control bytes)
    int flips = 1 + int(rng() % 4);
    for (int i = 0; i < flips && !s.empty(); ++i)
      s[pick(s.size())] = char(rng() & 0xff);
    return s;
  }
  case 2: { // swap two tokens
    auto ps = pieces(s);
    if (ps.size() > 1)
      std::swap(ps[pick(ps.size())], ps[pick(ps.size())]);
    return join(ps);
  }
  case 3: { // delete a run of tokens
    auto ps = pieces(s);
    size_t at = pick(ps.size()), n = 1 + pick(4);
    ps.erase(ps.begin() + at, ps.begin() + std::min(ps.size(), at + n));
    return join(ps);
  }
  case 4: { // duplicate a token somewhere else
    auto ps = pieces(s);
    if (!ps.empty())
      ps.insert(ps.begin() + pick(ps.size()), ps[pick(ps.size())]);
    return join(ps);
  }
  case 5: { // replace a number with an extreme one
    auto ps = pieces(s);
    static const char *extremes[] = {"0", "-1", "99999999999", "1e308",
                                     "9223372036854775807", "100000", "3.5",
                                     "65536", "2147483648"};
    for (int tries = 0; tries < 20; ++tries) {
      size_t at = pick(ps.size());
      if (!ps.empty() && std::isdigit((unsigned char)ps[at][0])) {
        ps[at] = extremes[pick(std::size(extremes))];
        break;
      }
    }
    return join(ps);
  }
  default: { // wrap a random position in deep nesting
    size_t depth = 50 + pick(400);
    size_t at = pick(s.size());
    std::string open(depth, rng() % 2 ? '(' : '[');
    return s.substr(0, at) + open + s.substr(at);
  }
  }
}

class FrontendFuzz : public testing::TestWithParam<const char *> {};

TEST_P(FrontendFuzz, MutantsEndInAModuleOrADiagnostic) {
  std::string seed = readFile(std::string(KILN_EXAMPLES_DIR) + "/" + GetParam());
  ASSERT_FALSE(seed.empty()) << "cannot read example " << GetParam();
  Harness h;
  ASSERT_TRUE(h.run(seed).valid) << GetParam() << " itself must compile";
  std::mt19937_64 rng(std::hash<std::string>()(GetParam()));
  constexpr int kMutants = 3000;
  int rejected = 0;
  for (int i = 0; i < kMutants; ++i) {
    int kind = 0;
    std::string m = mutate(seed, rng, kind);
    if (rng() % 4 == 0) // sometimes stack a second mutation
      m = mutate(m, rng, kind);
    Outcome o = h.run(m);
    if (!o.problem.empty()) {
      std::string path = testing::TempDir() + "kiln-fuzz-failure.kiln";
      std::ofstream(path, std::ios::binary) << m;
      FAIL() << "mutant " << i << " (kind " << kind << ") of " << GetParam()
             << ": " << o.problem << "\ninput written to " << path;
    }
    rejected += !o.valid;
  }
  // Most mutants are broken programs; a mutator that only made valid ones
  // would test nothing.
  EXPECT_GT(rejected, kMutants / 2);
  std::printf("%s: %d mutants, %d rejected with a diagnostic, %d still valid\n",
              GetParam(), kMutants, rejected, kMutants - rejected);
}

INSTANTIATE_TEST_SUITE_P(Examples, FrontendFuzz,
                         testing::Values("mlp.kiln", "shakespeare_char.kiln",
                                         "shakespeare_char_cpu.kiln"),
                         [](const auto &info) {
                           std::string n = info.param;
                           for (char &c : n)
                             if (!std::isalnum((unsigned char)c)) c = '_';
                           return n;
                         });

TEST(FrontendFuzz, PathologicalInputs) {
  Harness h;
  std::vector<std::pair<std::string, std::string>> cases = {
      {"empty", ""},
      {"nul bytes", std::string(1000, '\0')},
      {"binary", [] { std::string s; for (int i = 0; i < 4096; ++i) s += char(i * 7919 % 256); return s; }()},
      {"deep parens", "model m { x = " + std::string(200000, '(') + "1"},
      {"deep brackets", "model m { x = " + std::string(200000, '[')},
      {"deep unary", "model m { x = " + std::string(200000, '-') + "1 }"},
      {"deep repeat", [] { std::string s = "model m { "; for (int i = 0; i < 50000; ++i) s += "repeat 1 { "; return s; }()},
      {"long power chain", [] { std::string s = "model m { x = 2"; for (int i = 0; i < 100000; ++i) s += " ** 2"; return s + " }"; }()},
      {"long sum chain", [] { std::string s = "model m { x = 1"; for (int i = 0; i < 100000; ++i) s += " + 1"; return s + " }"; }()},
      {"huge repeat", "model m { input x: f32[4, 4]\n repeat 1000000 { repeat 1000000 { x = x + 1 } }\n loss = sum(x) }"},
      {"op limit", "model m { input x: f32[4, 4]\n repeat 1000 { repeat 1000 { x = x + 1 } }\n loss = sum(x) }"},
      {"huge tensor", "model m { input x: f32[2147483647, 2147483647, 2147483647]\n loss = sum(x) }"},
      {"recursive def", "def f(x) { return f(x) }\nmodel m { input x: f32[2, 2]\n loss = sum(f(x)) }"},
      {"mutual recursion", "def f(x) { return g(x) }\ndef g(x) { return f(x) }\nmodel m { input x: f32[2, 2]\n loss = sum(f(x)) }"},
      {"many statements", [] { std::string s = "model m { input x: f32[2, 2]\n"; for (int i = 0; i < 100000; ++i) s += "y = x\n"; return s + "loss = sum(x) }"; }()},
      {"long name", "model " + std::string(1 << 20, 'a') + " { }"},
      {"long line", "model m { x = 1 " + std::string(1 << 20, ' ') + "$ }"},
      {"oversized", std::string(kMaxSourceBytes + 10, '#')},
      {"int overflow", "model m(a = 9223372036854775807 + 1) { }"},
      {"pow overflow", "model m(a = 3 ** 99) { }"},
      {"float overflow", "model m(a = 1e300 * 1e300) { }"},
      {"div by zero", "model m(a = 1 // 0) { }"},
      {"unicode", "model m { x = \"\xe2\x9c\x93\" }   # \xf0\x9f\x94\xa5"},
      {"crlf", "model m {\r\n input x: f32[2, 2]\r\n loss = sum(x)\r\n}\r\n"},
  };
  for (const auto &[name, text] : cases) {
    Outcome o = h.run(text);
    EXPECT_TRUE(o.problem.empty()) << name << ": " << o.problem;
  }
}

} // namespace
