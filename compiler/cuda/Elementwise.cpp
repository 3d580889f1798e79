//===- Elementwise.cpp - The elementwise kernel form ------------------------===//
//
// A grid-stride loop per output shape (at most 8 outputs per launch,
// ordered around in-place updates); 16-byte loads and stores when every input
// is read at the output's index: float4 when every buffer is f32, vec8 (8
// elements a thread) when some are f16/bf16.
//
//===----------------------------------------------------------------------===//
#include "compiler/cuda/KernelEmitter.h"

#include "dialects/kiln/KilnOps.h"
#include "passes/Fusion.h"

#include <fmt/format.h>

#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/SetVector.h"

#include <functional>
#include <map>

using namespace mlir;

namespace kiln::cudagen {

LogicalResult KernelEmitter::emitElementwise(std::vector<gpu::Launch> &launches) {
  Block &b = fusion_.getBlock();
  auto yields = b.getTerminator()->getOperands();
  // A launch per output shape, and at most 8 outputs per launch: one
  // thread's share of a wide multi-output kernel (13 optimizer updates) would
  // not fit in registers; shared scalar work is recomputed per launch.
  //
  // Outputs written over an input (parameters and optimizer state updated
  // in place) constrain the split: a launch that overwrites X must not run
  // before a launch that still reads X. Outputs of one shape that touch the
  // same overwritten input stay in one launch; across shapes, readers are
  // ordered before the writer.
  unsigned numOut = yields.size();
  SmallVector<int> writesInput(numOut, -1); // kernel arg overwritten, or -1
  SmallVector<llvm::DenseSet<unsigned>> reads(numOut);
  for (unsigned o = 0; o < numOut; ++o) {
    for (auto &[arg, num] : argOf_)
      if (num == outArg_[o])
        writesInput[o] = int(num);
    llvm::DenseSet<Value> seen;
    SmallVector<Value> work{yields[o]};
    while (!work.empty()) {
      Value v = work.pop_back_val();
      if (!seen.insert(v).second)
        continue;
      if (isa<BlockArgument>(v)) {
        if (argOf_.count(v))
          reads[o].insert(argOf_.lookup(v));
        continue;
      }
      for (Value x : v.getDefiningOp()->getOperands())
        work.push_back(x);
    }
  }
  auto conflict = [&](unsigned a, unsigned b) {
    return (writesInput[a] >= 0 && reads[b].count(unsigned(writesInput[a]))) ||
           (writesInput[b] >= 0 && reads[a].count(unsigned(writesInput[b])));
  };
  std::map<SmallVector<int64_t>, SmallVector<unsigned>> byShape;
  for (auto [i, y] : llvm::enumerate(yields))
    byShape[SmallVector<int64_t>(tensorOf(y).getShape())].push_back(unsigned(i));
  std::vector<std::pair<SmallVector<int64_t>, SmallVector<unsigned>>> groups;
  for (auto &[shape, all] : byShape) {
    // Components of outputs linked by in-place hazards, packed into launches.
    SmallVector<unsigned> comp(all.size());
    for (unsigned i = 0; i < all.size(); ++i)
      comp[i] = i;
    std::function<unsigned(unsigned)> root = [&](unsigned i) {
      return comp[i] == i ? i : comp[i] = root(comp[i]);
    };
    for (unsigned i = 0; i < all.size(); ++i)
      for (unsigned j = i + 1; j < all.size(); ++j)
        if (conflict(all[i], all[j]))
          comp[root(i)] = root(j);
    std::map<unsigned, SmallVector<unsigned>> members;
    for (unsigned i = 0; i < all.size(); ++i)
      members[root(i)].push_back(all[i]);
    SmallVector<SmallVector<unsigned>> comps;
    for (unsigned i = 0; i < all.size(); ++i)
      if (root(i) == i)
        comps.push_back(members[i]);
    SmallVector<unsigned> cur;
    for (auto &c : comps) {
      if (!cur.empty() && cur.size() + c.size() > 8) {
        groups.push_back({shape, cur});
        cur.clear();
      }
      cur.append(c.begin(), c.end());
    }
    if (!cur.empty())
      groups.push_back({shape, cur});
  }
  // Order the launches: a launch that reads X before the one overwriting it.
  {
    size_t g = groups.size();
    std::vector<SmallVector<size_t>> after(g);
    std::vector<int> indegree(g, 0);
    for (size_t a = 0; a < g; ++a)
      for (size_t w = 0; w < g; ++w)
        if (a != w && llvm::any_of(groups[a].second, [&](unsigned ra) {
              return llvm::any_of(groups[w].second, [&](unsigned ow) {
                return writesInput[ow] >= 0 && reads[ra].count(unsigned(writesInput[ow]));
              });
            })) {
          after[a].push_back(w);
          ++indegree[w];
        }
    std::vector<std::pair<SmallVector<int64_t>, SmallVector<unsigned>>> ordered;
    std::vector<bool> done(g, false);
    while (ordered.size() < g) {
      size_t next = g;
      for (size_t i = 0; i < g && next == g; ++i)
        if (!done[i] && indegree[i] == 0)
          next = i;
      if (next == g)
        return fail(nullptr, "outputs of different shapes written over inputs that each "
                             "other's outputs read");
      done[next] = true;
      for (size_t w : after[next])
        --indegree[w];
      ordered.push_back(groups[next]);
    }
    groups = std::move(ordered);
  }
  for (auto &[shape, outs] : groups) {
    int64_t n = product(shape);
    // 16-byte loads and stores when every value on the way is elementwise
    // at this shape (or a broadcast scalar): each input is then read at the
    // output's index. float4 (4 elements a thread) when every such input
    // and every output is f32; vec8 (8 elements a thread: a uint4 of 8
    // halves or two float4 per buffer) when they are f32, f16 or bf16 and
    // one is a half type.
    auto isF32 = [](Value v) { return tensorOf(v).getElementType().isF32(); };
    auto isHalf = [](Value v) {
      Type t = tensorOf(v).getElementType();
      return t.isF16() || t.isBF16();
    };
    bool vec = !shape.empty(); // every input is read at the output's index
    llvm::SetVector<Value> identityArgs; // in first-use order: the source must be deterministic
    std::function<void(Value)> check = [&](Value v) {
      if (!vec)
        return;
      if (isa<BlockArgument>(v)) {
        if (tensorOf(v).getShape() == ArrayRef<int64_t>(shape) && (isF32(v) || isHalf(v)))
          identityArgs.insert(v);
        else if (tensorOf(v).getRank() != 0)
          vec = false;
        return;
      }
      Operation *op = v.getDefiningOp();
      if (isa<ConstantOp>(op))
        return;
      if (auto bc = dyn_cast<BroadcastInDimOp>(op)) {
        if (tensorOf(bc.getOperand()).getNumElements() != 1)
          vec = false;
        else
          check(bc.getOperand());
        return;
      }
      if (!isElementwiseOp(op) || tensorOf(v).getShape() != ArrayRef<int64_t>(shape)) {
        if (tensorOf(v).getRank() != 0)
          vec = false;
        for (Value o : op->getOperands())
          check(o);
        return;
      }
      for (Value o : op->getOperands())
        check(o);
    };
    bool allF32 = true, anyHalf = false;
    for (unsigned o : outs) {
      allF32 = allF32 && isF32(yields[o]);
      anyHalf = anyHalf || isHalf(yields[o]);
      if (!isF32(yields[o]) && !isHalf(yields[o]))
        vec = false;
      check(yields[o]);
    }
    for (Value a : identityArgs) {
      allF32 = allF32 && isF32(a);
      anyHalf = anyHalf || isHalf(a);
    }
    // The width: 4 (float4), 8 (vec8) or 1 (scalar).
    int width = 1;
    if (vec && allF32 && n % 4 == 0 && n >= 4)
      width = 4;
    else if (vec && anyHalf && halfVectors_ && n % 8 == 0 && n >= 8)
      width = 8;
    std::string fname = fmt::format("{}_{}", name_, kernelCount_++);
    int64_t block = 256;
    int64_t work = n / width;
    int64_t grid = std::min<int64_t>((work + block - 1) / block, 4096);
    indent_ = 1;
    memo_.clear();
    memo_.emplace_back();
    line("const int stride = gridDim.x * blockDim.x;");
    if (width == 8) {
      emitHalfVectors(shape, outs, identityArgs.getArrayRef());
    } else if (width == 4) {
      line(fmt::format("for (int q = blockIdx.x * blockDim.x + threadIdx.x; q < {}; q += stride) {{",
                       n / 4));
      push();
      llvm::DenseMap<Value, std::string> vecs;
      for (Value a : identityArgs) {
        std::string va = fresh("va");
        line(fmt::format("const float4 {} = reinterpret_cast<const float4 *>(a{})[q];", va,
                         argOf_.lookup(a)));
        vecs[a] = va;
      }
      static const char *comp[] = {"x", "y", "z", "w"};
      SmallVector<std::string> results =
          emitLanes(4, shape, outs, identityArgs.getArrayRef(),
                    [&](Value a, int c) { return vecs[a] + "." + comp[c]; });
      for (auto [j, o] : llvm::enumerate(outs))
        line(fmt::format("reinterpret_cast<float4 *>(a{0})[q] = make_float4({1}[0], {1}[1], "
                         "{1}[2], {1}[3]);",
                         outArg_[o], results[j]));
      pop();
      line("}");
    } else {
      line(fmt::format("for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < {}; e += stride) {{",
                       n));
      push();
      SmallVector<std::string> idx = delinear("e", shape);
      storeAll(outs, idx);
      pop();
      line("}");
    }
    if (!error_.empty())
      return failure();
    finish(fname,
           width == 8   ? "elementwise(vec8)"
           : width == 4 ? "elementwise(float4)"
                        : "elementwise",
           grid, block, launches);
  }
  return success();
}

SmallVector<std::string> KernelEmitter::emitLanes(
    int width, ArrayRef<int64_t> shape, ArrayRef<unsigned> outs, ArrayRef<Value> identityArgs,
    llvm::function_ref<std::string(Value, int)> laneOf) {
  auto yields = fusion_.getBlock().getTerminator()->getOperands();
  SmallVector<std::string> results;
  for (size_t j = 0; j < outs.size(); ++j) {
    results.push_back(fresh("r"));
    line(fmt::format("float {}[{}];", results.back(), width));
  }
  for (int c = 0; c < width; ++c) {
    for (Value a : identityArgs)
      laneRead_[a] = laneOf(a, c);
    line("{");
    push();
    std::string lin = fresh("e");
    line(fmt::format("const int {} = {} * q + {};", lin, width, c));
    SmallVector<std::string> idx = delinear(lin, shape);
    for (auto [j, o] : llvm::enumerate(outs))
      line(fmt::format("{}[{}] = {};", results[j], c, emit(yields[o], idx)));
    pop();
    line("}");
  }
  laneRead_.clear();
  return results;
}

void KernelEmitter::emitHalfVectors(ArrayRef<int64_t> shape, ArrayRef<unsigned> outs,
                                    ArrayRef<Value> identityArgs) {
  // Thread q handles elements 8q .. 8q+7: each f16/bf16 buffer moves as one
  // 16-byte uint4, each f32 buffer as two float4 (buffers are 64-byte
  // aligned, runtime/core/Program.h). Each element is computed exactly as
  // the scalar form computes it (loaded with kiln_to_float, stored with
  // kiln_from_float), so the results are the same bits.
  auto yields = fusion_.getBlock().getTerminator()->getOperands();
  int64_t n = product(shape);
  line(fmt::format("for (int q = blockIdx.x * blockDim.x + threadIdx.x; q < {}; q += stride) {{",
                   n / 8));
  push();
  // Lane c of each input, as a float expression.
  llvm::DenseMap<Value, std::function<std::string(int)>> lanes;
  for (Value a : identityArgs) {
    TypeInfo ti;
    typeInfo(tensorOf(a).getElementType(), ti);
    unsigned arg = argOf_.lookup(a);
    if (ti.isLow) {
      std::string u = fresh("ua"), h = fresh("ha");
      line(fmt::format("const uint4 {} = reinterpret_cast<const uint4 *>(a{})[q];", u, arg));
      line(fmt::format("const {0} *{1} = reinterpret_cast<const {0} *>(&{2});", ti.storage, h, u));
      lanes[a] = [h](int c) { return fmt::format("kiln_to_float({}[{}])", h, c); };
    } else {
      std::string lo = fresh("va"), hi = fresh("va");
      line(fmt::format("const float4 {} = reinterpret_cast<const float4 *>(a{})[2 * q];", lo, arg));
      line(fmt::format("const float4 {} = reinterpret_cast<const float4 *>(a{})[2 * q + 1];", hi,
                       arg));
      lanes[a] = [lo, hi](int c) {
        static const char *comp[] = {"x", "y", "z", "w"};
        return fmt::format("{}.{}", c < 4 ? lo : hi, comp[c % 4]);
      };
    }
  }
  SmallVector<std::string> results =
      emitLanes(8, shape, outs, identityArgs, [&](Value a, int c) { return lanes[a](c); });
  for (auto [j, o] : llvm::enumerate(outs)) {
    TypeInfo ti;
    typeInfo(tensorOf(yields[o]).getElementType(), ti);
    const std::string &r = results[j];
    if (ti.isLow) {
      std::string u = fresh("uo"), h = fresh("ho");
      line(fmt::format("uint4 {};", u));
      line(fmt::format("{0} *{1} = reinterpret_cast<{0} *>(&{2});", ti.storage, h, u));
      for (int c = 0; c < 8; ++c)
        line(fmt::format("{}[{}] = kiln_from_float<{}>({}[{}]);", h, c, ti.storage, r, c));
      line(fmt::format("reinterpret_cast<uint4 *>(a{})[q] = {};", outArg_[o], u));
    } else {
      for (int half = 0; half < 2; ++half)
        line(fmt::format("reinterpret_cast<float4 *>(a{0})[2 * q + {1}] = make_float4({2}[{3}], "
                         "{2}[{4}], {2}[{5}], {2}[{6}]);",
                         outArg_[o], half, r, 4 * half, 4 * half + 1, 4 * half + 2,
                         4 * half + 3));
    }
  }
  pop();
  line("}");
}

} // namespace kiln::cudagen
