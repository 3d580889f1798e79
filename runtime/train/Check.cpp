//===- Check.cpp - One backend against another, step by step --------------===//
#include "runtime/train/Check.h"

#include "runtime/core/GemmPlan.h"
#include "runtime/core/Half.h"
#include "runtime/core/Random.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>

namespace kiln::train {

namespace {

using program::Buffer;
using program::DType;
using program::Role;

/// How far apart two copies of a buffer are: the largest difference
/// relative to the reference's largest magnitude (floats), or the number of
/// differing elements (integers, booleans).
struct Diff {
  double error = 0;
  double absolute = 0;   ///< largest absolute difference (floats)
  int64_t nonFinite = 0; ///< NaN/inf in the checked copy but not in the reference
  bool exact = true;     ///< integer/boolean buffer
};

Diff compareBuffers(const Buffer &b, const std::string &ref, const std::string &got) {
  Diff d;
  int64_t n = b.numElements();
  auto floats = [&](auto tag) {
    using T = decltype(tag);
    const T *r = reinterpret_cast<const T *>(ref.data());
    const T *g = reinterpret_cast<const T *>(got.data());
    double scale = 0, worst = 0;
    for (int64_t i = 0; i < n; ++i)
      if (std::isfinite(double(r[i])))
        scale = std::max(scale, std::fabs(double(r[i])));
    for (int64_t i = 0; i < n; ++i) {
      double x = double(r[i]), y = double(g[i]);
      if (std::isfinite(x) != std::isfinite(y) || (std::isnan(x) != std::isnan(y))) {
        ++d.nonFinite;
        continue;
      }
      if (std::isfinite(x))
        worst = std::max(worst, std::fabs(x - y));
    }
    d.error = worst / std::max(scale, 1e-30);
    d.absolute = worst;
  };
  if (b.dtype == DType::F32) {
    d.exact = false;
    floats(float());
  } else if (b.dtype == DType::F64) {
    d.exact = false;
    floats(double());
  } else if (b.dtype == DType::F16 || b.dtype == DType::BF16) {
    d.exact = false;
    std::string rf, gf; // widen to float
    auto widen = [&](const std::string &src, std::string &dst) {
      dst.resize(size_t(n) * 4);
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src.data() + 2 * i, 2);
        float f = halfToFloat(b.dtype, h);
        std::memcpy(&dst[size_t(i) * 4], &f, 4);
      }
    };
    widen(ref, rf);
    widen(got, gf);
    const float *r = reinterpret_cast<const float *>(rf.data());
    const float *g = reinterpret_cast<const float *>(gf.data());
    double scale = 0, worst = 0;
    for (int64_t i = 0; i < n; ++i)
      if (std::isfinite(r[i]))
        scale = std::max(scale, double(std::fabs(r[i])));
    for (int64_t i = 0; i < n; ++i)
      if (std::isfinite(r[i]) && std::isfinite(g[i]))
        worst = std::max(worst, double(std::fabs(r[i] - g[i])));
      else if (std::isfinite(r[i]) != std::isfinite(g[i]))
        ++d.nonFinite;
    d.error = worst / std::max(scale, 1e-30);
    d.absolute = worst;
  } else {
    int64_t width = program::dtypeBytes(b.dtype), differing = 0;
    for (int64_t i = 0; i < n; ++i)
      differing += std::memcmp(ref.data() + i * width, got.data() + i * width, size_t(width)) != 0;
    d.error = double(differing);
  }
  return d;
}

} // namespace

Expected<CheckResult> check(Model &m, Model &ref, const CheckOptions &o, const Sink &out) {
  auto line = [&](const std::string &text) { emit(out, Channel::Line, text); };
  const program::Program &p = m.prog();
  // Fresh random batches each run (tokens below the vocabulary, floats in
  // [-1, 1)); --seed repeats one.
  uint64_t seed = o.seed ? *o.seed
                         : (uint64_t(std::random_device{}()) << 32) ^ std::random_device{}();
  seed &= (uint64_t(1) << 53) - 1; // printable and re-readable as --seed
  // A step that touches float16 or bfloat16 values is judged in their
  // precision: every op rounds to the type, so the backends may differ by a
  // rounding per op of a chain (allowed: 8 units of the last place at the
  // tensor's largest value, 2^-8 * 8 for bfloat16, 2^-11 * 8 for float16).
  const double bf16Tol = std::max(o.tolerance, 8 * std::ldexp(1.0, -8));
  const double f16Tol = std::max(o.tolerance, 8 * std::ldexp(1.0, -11));
  // KILN_CUDA_TF32=1 puts every f32 GEMM of the device under test in TF32.
  auto tf32Env = gpu::allTf32FromEnv();
  const bool envTf32 = tf32Env && *tf32Env;
  line(fmt::format("kiln-run check: every step of @train_step, @eval_step and @predict on {} "
             "against {}: the step's inputs copied from the reference (random, --seed {}), its "
             "outputs poisoned (NaN) first; tolerance {:g} of each tensor's largest value ({:g} "
             "for steps with bfloat16 values, {:g} with float16 or TF32 GEMMs; times sqrt(N/65536) for sums "
             "of N > 65536 terms) or 1e-6 absolute (integers: exact)",
             m.exec->describe(), ref.exec->describe(), seed, o.tolerance, bf16Tol, f16Tol));
  int64_t vocab = std::max<int64_t>(m.vocabSize(), 2);
  struct Worst { double error = 0; std::string where; int64_t checked = 0; };
  std::map<std::string, Worst> byForm;
  int failures = 0;
  auto readAll = [&](Backend &b, int id, std::string &out) {
    out.resize(size_t(p.buffers[size_t(id)].bytes));
    return b.read(id, out.data(), out.size());
  };
  for (const char *fn : {"train_step", "eval_step", "predict"}) {
    const program::Function *func = p.function(fn);
    if (!func)
      continue;
    std::map<int, std::string> inputBytes; ///< this entry point's random batch
    for (int id : func->args) {
      const Buffer &b = p.buffers[size_t(id)];
      if (b.role != Role::Input)
        continue;
      std::string bytes(size_t(b.bytes), '\0');
      for (int64_t i = 0; i < b.numElements(); ++i) {
        uint64_t r = random::bits(seed, uint64_t(id) + 0xc4ecULL, uint64_t(i));
        if (b.name == "step") {
          int64_t v = 0;
          std::memcpy(&bytes[0], &v, 8);
          break;
        }
        if (b.dtype == DType::I32) {
          int32_t v = int32_t(r % uint64_t(vocab));
          std::memcpy(&bytes[size_t(i) * 4], &v, 4);
        } else if (b.dtype == DType::I64) {
          int64_t v = int64_t(r % uint64_t(vocab));
          std::memcpy(&bytes[size_t(i) * 8], &v, 8);
        } else if (b.dtype == DType::F32) {
          float v = float(double(r >> 40) / double(1 << 24) * 2 - 1);
          std::memcpy(&bytes[size_t(i) * 4], &v, 4);
        } else if (b.dtype == DType::F64) {
          double v = double(r >> 11) / double(uint64_t(1) << 53) * 2 - 1;
          std::memcpy(&bytes[size_t(i) * 8], &v, 8);
        } else if (b.dtype == DType::BF16 || b.dtype == DType::F16) {
          // Multiples of 2^-7 in [-1, 1): exact in both types.
          uint16_t h = floatToHalf(b.dtype, float(int64_t(r % 256) - 128) / 128.0f);
          std::memcpy(&bytes[size_t(i) * 2], &h, 2);
        }
      }
      if (Status s = ref.exec->write(id, bytes.data(), bytes.size()); !s)
        return s;
      // A backend that stages inputs (CUDA) applies them at its next run:
      // the checked backend gets them from here, not read back.
      inputBytes[id] = std::move(bytes);
    }
    for (size_t si = 0; si < func->steps.size(); ++si) {
      const program::Step &st = func->steps[si];
      std::vector<int> all = st.args, written;
      std::string what, form;
      if (st.kind == program::Step::Kernel) {
        const program::Kernel &k = p.kernels[size_t(st.kernel)];
        for (int w : k.writes)
          written.push_back(st.args[size_t(w)]);
        what = k.symbol;
        form = m.pkg.hasCuda && !m.pkg.cudaPlan.kernels[size_t(st.kernel)].empty()
                   ? m.pkg.cudaPlan.kernels[size_t(st.kernel)][0].form
                   : k.kind;
      } else if (st.kind == program::Step::Gemm && st.lt.valid() &&
                 m.exec->usesLibraryEpilogues()) {
        // The epilogue in the library call: its result (and pre-activation).
        written.push_back(st.lt.out);
        if (st.lt.aux >= 0)
          written.push_back(st.lt.aux);
        all.insert(all.end(), st.epilogueArgs.begin(), st.epilogueArgs.end());
        what = "gemm + library epilogue " + std::string(program::activationName(st.lt.activation)) +
               (st.lt.bias >= 0 ? " with bias" : "");
        form = "gemm+library epilogue";
      } else if (st.kind == program::Step::Gemm) {
        written.push_back(st.args[2]);
        what = "gemm";
        form = "gemm";
        if (st.epilogue >= 0) {
          all.insert(all.end(), st.epilogueArgs.begin(), st.epilogueArgs.end());
          for (int w : p.kernels[size_t(st.epilogue)].writes)
            written.push_back(st.epilogueArgs[size_t(w)]);
          what = "gemm + " + p.kernels[size_t(st.epilogue)].symbol;
          form = "gemm+epilogue";
        }
      } else {
        written.push_back(st.args[1]);
        what = "copy";
        form = "copy";
      }
      // The reference's state before the step, for every buffer it touches;
      // outputs that are not also read start as NaN.
      // Buffers the step reads.
      std::vector<int> reads;
      if (st.kind == program::Step::Kernel) {
        const program::Kernel &k = p.kernels[size_t(st.kernel)];
        reads.assign(st.args.begin(), st.args.begin() + k.numInputs);
      } else if (st.kind == program::Step::Gemm && st.lt.valid() &&
                 m.exec->usesLibraryEpilogues()) {
        reads = {st.args[0], st.args[1]};
        if (st.lt.bias >= 0)
          reads.push_back(st.lt.bias);
      } else if (st.kind == program::Step::Gemm) {
        reads = {st.args[0], st.args[1]};
        if (st.epilogue >= 0) {
          const program::Kernel &k = p.kernels[size_t(st.epilogue)];
          reads.insert(reads.end(), st.epilogueArgs.begin(),
                       st.epilogueArgs.begin() + k.numInputs);
        }
      } else {
        reads = {st.args[0]};
      }
      for (int id : all) {
        std::string bytes;
        if (auto in = inputBytes.find(id); in != inputBytes.end())
          bytes = in->second;
        else if (Status s = readAll(*ref.exec, id, bytes); !s)
          return s;
        bool read = std::count(reads.begin(), reads.end(), id) > 0;
        // The GEMM's own result is read by its epilogue but written first.
        if (st.kind == program::Step::Gemm && id == st.args[2])
          read = false;
        if (!read)
          std::fill(bytes.begin(), bytes.end(), '\xff');
        if (Status s = m.exec->write(id, bytes.data(), bytes.size()); !s)
          return s;
      }
      if (Status s = ref.exec->runSteps(fn, si, si + 1); !s)
        return s;
      if (Status s = m.exec->runSteps(fn, si, si + 1); !s)
        return s;
      for (int id : written) {
        std::string a, b;
        if (Status s = readAll(*ref.exec, id, a); !s)
          return s;
        if (Status s = readAll(*m.exec, id, b); !s)
          return s;
        const Buffer &buf = p.buffers[size_t(id)];
        Diff d = compareBuffers(buf, a, b);
        // Relative to the tensor's largest value, with an absolute floor for
        // values that are rounding noise around zero (a row sum of
        // softmax - onehot is 0 in exact arithmetic, ~1e-8 in float32).
        // Sums over many elements differ by their order (the CPU adds in
        // sequence, a GPU in a tree): about sqrt(N) roundings of 2^-24, so
        // the tolerance grows as sqrt(N / 65536) past 65536 terms per output.
        int64_t largestIn = 1;
        for (int r : reads)
          largestIn = std::max(largestIn, p.buffers[size_t(r)].numElements());
        double terms = double(largestIn) / double(std::max<int64_t>(buf.numElements(), 1));
        // The step's precision: its buffers' types and what its kernels
        // compute in (a kernel may round to bfloat16 inside).
        double base = o.tolerance;
        auto lower = [&](DType t) {
          base = std::max(base, t == DType::BF16 ? bf16Tol : t == DType::F16 ? f16Tol : 0.0);
        };
        for (int id2 : all)
          lower(p.buffers[size_t(id2)].dtype);
        if (st.kind == program::Step::Kernel)
          lower(p.kernels[size_t(st.kernel)].lowestFloat);
        if (st.kind == program::Step::Gemm && st.epilogue >= 0)
          lower(p.kernels[size_t(st.epilogue)].lowestFloat);
        // A TF32 GEMM rounds its operands to float16's 10-bit mantissa (the
        // reference, the CPU, computes it in float32).
        if (st.kind == program::Step::Gemm && st.gemm.dtype == DType::F32 &&
            (st.gemm.tf32 || envTf32))
          lower(DType::F16);
        double tol = base * std::max(1.0, std::sqrt(terms / 65536.0));
        bool bad = d.nonFinite > 0 ||
                   (d.exact ? d.error > 0 : d.error > tol && d.absolute > 1e-6);
        Worst &w = byForm[form];
        w.checked++;
        if (d.error > w.error || (bad && w.error <= o.tolerance)) {
          w.error = d.error;
          w.where = fmt::format("@{} step {} {}", fn, si, what);
        }
        if (bad && failures++ < 20)
          line(fmt::format("  MISMATCH @{} step {} {} ({}): output {} {}[{}]: {} {}{}", fn, si, what,
                     form, buf.name.empty() ? "#" + std::to_string(id) : buf.name,
                     program::dtypeName(buf.dtype), fmt::join(buf.shape, "x"),
                     d.exact ? "elements differ:" : "relative error", d.error,
                     d.nonFinite ? fmt::format(", {} NaN/inf where the reference is finite "
                                               "(an output not written?)", d.nonFinite)
                                 : ""));
      }
    }
  }
  line(fmt::format("  {:<28} {:>8} {:>12}  {}", "kernel form", "outputs", "worst error", "where"));
  for (auto &[form, w] : byForm)
    line(fmt::format("  {:<28} {:>8} {:>12.3g}  {}", form, w.checked, w.error, w.where));
  if (failures)
    line(fmt::format("kiln-run check: FAIL: {} outputs outside the tolerance", failures));
  else
    line("kiln-run check: PASS");
  CheckResult r;
  r.failures = failures;
  return r;
}

} // namespace kiln::train
