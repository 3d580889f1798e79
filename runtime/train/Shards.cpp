//===- Shards.cpp - ZeRO-sharded persistent buffers -----------------------===//
#include "runtime/train/Shards.h"

#include <fmt/format.h>

#include <algorithm>
#include <type_traits>
#include <utility>

namespace kiln::train {

namespace {

// program::Buffer gains shardAxis and logicalShape with ZeRO (part B of
// issue 12); read them where they exist so this file builds either way.
template <typename B>
auto axisOf(const B &b, int) -> decltype(std::string(b.shardAxis)) {
  return b.shardAxis;
}
template <typename B> std::string axisOf(const B &, long) { return {}; }
template <typename B>
auto logicalOf(const B &b, int)
    -> decltype(std::vector<int64_t>(b.logicalShape)) {
  return b.logicalShape;
}
template <typename B> std::vector<int64_t> logicalOf(const B &b, long) {
  return b.shape;
}

} // namespace

int64_t ShardSpec::logicalElements() const {
  int64_t n = 1;
  for (int64_t d : logicalShape)
    n *= d;
  return n;
}

ShardSpec shardOf(const program::Buffer &b) {
  ShardSpec s;
  s.axis = axisOf(b, 0);
  s.logicalShape = s.axis.empty() ? b.shape : logicalOf(b, 0);
  if (!s.axis.empty()) {
    s.dim = b.shardDim;
    s.outer = b.shardOuter;
    s.zeroAxis = b.zeroAxis;
  }
  return s;
}

std::vector<ShardSpec> shardSpecs(const program::Program &p) {
  std::vector<ShardSpec> out;
  out.reserve(p.buffers.size());
  for (const program::Buffer &b : p.buffers)
    out.push_back(shardOf(b));
  return out;
}

int64_t blockElements(int64_t numel, int parts) {
  return parts <= 0 ? numel : (numel + parts - 1) / parts;
}

std::string cutBlock(const std::string &logical, int64_t numel, int elemBytes,
                     int parts, int index) {
  int64_t block = blockElements(numel, parts);
  std::string out(size_t(block * elemBytes), '\0');
  int64_t first = int64_t(index) * block;
  int64_t n = std::clamp<int64_t>(numel - first, 0, block);
  if (n > 0)
    std::copy_n(logical.data() + first * elemBytes, size_t(n * elemBytes),
                out.begin());
  return out;
}

std::string joinBlocks(const std::string &gathered, int64_t numel,
                       int elemBytes) {
  return gathered.substr(0, size_t(numel * elemBytes));
}

namespace {

/// The per-dimension split as [A, K, N, r, B] runs: A = the product of the
/// dimensions before `dim`, B of those after, K = outer, r the rows of one
/// part's block. Logical element (a, k, c, j, b) is local element
/// (a, k, j, b) of device c.
struct DimSplit {
  int64_t a = 1, k = 1, n = 1, r = 0, b = 1;
  int64_t run() const { return r * b; }           ///< contiguous elements
  int64_t local() const { return a * k * r * b; } ///< elements per device
};

Expected<DimSplit> dimSplit(const std::vector<int64_t> &shape, int64_t dim,
                            int64_t outer, int parts, const std::string &what) {
  if (dim < 0 || dim >= int64_t(shape.size()))
    return Status::error(
        fmt::format("{}: tensor-parallel dimension {} is not a dimension of "
                    "its {}-d logical shape; recompile the model with kilnc",
                    what, dim, shape.size()));
  if (outer < 1 || parts < 1 || shape[size_t(dim)] % (outer * parts) != 0)
    return Status::error(
        fmt::format("{}: dimension {} (size {}) cannot be split into {} "
                    "part(s) of {} equal blocks; "
                    "recompile the model with kilnc for this mesh",
                    what, dim, shape[size_t(dim)], outer, parts));
  DimSplit s;
  for (int64_t i = 0; i < dim; ++i)
    s.a *= shape[size_t(i)];
  for (size_t i = size_t(dim) + 1; i < shape.size(); ++i)
    s.b *= shape[i];
  s.k = outer;
  s.n = parts;
  s.r = shape[size_t(dim)] / (outer * parts);
  return s;
}

} // namespace

Expected<std::string> cutDimBlock(const std::string &logical,
                                  const std::vector<int64_t> &shape,
                                  int64_t dim, int64_t outer, int elemBytes,
                                  int parts, int index,
                                  const std::string &what) {
  auto split = dimSplit(shape, dim, outer, parts, what);
  if (!split)
    return split.status();
  const DimSplit &s = *split;
  if (index < 0 || index >= parts)
    return Status::internal(
        fmt::format("{}: block {} of {}", what, index, parts));
  if (int64_t(logical.size()) != s.local() * s.n * elemBytes)
    return Status::error(
        fmt::format("{}: {} bytes, but its logical shape needs {}", what,
                    logical.size(), s.local() * s.n * elemBytes));
  size_t run = size_t(s.run() * elemBytes);
  std::string out(size_t(s.local() * elemBytes), '\0');
  char *to = out.data();
  for (int64_t a = 0; a < s.a; ++a)
    for (int64_t k = 0; k < s.k; ++k, to += run)
      std::copy_n(logical.data() +
                      (((a * s.k + k) * s.n + index) * s.run()) * elemBytes,
                  run, to);
  return out;
}

Expected<std::string> joinDimBlocks(const std::string &gathered,
                                    const std::vector<int64_t> &shape,
                                    int64_t dim, int64_t outer, int elemBytes,
                                    int parts, const std::string &what) {
  auto split = dimSplit(shape, dim, outer, parts, what);
  if (!split)
    return split.status();
  const DimSplit &s = *split;
  if (int64_t(gathered.size()) != s.local() * s.n * elemBytes)
    return Status::error(
        fmt::format("{}: gathered {} bytes from {} devices, but its logical "
                    "shape needs {}",
                    what, gathered.size(), parts, s.local() * s.n * elemBytes));
  size_t run = size_t(s.run() * elemBytes);
  std::string out(gathered.size(), '\0');
  for (int64_t c = 0; c < s.n; ++c) {
    const char *from = gathered.data() + c * s.local() * elemBytes;
    for (int64_t a = 0; a < s.a; ++a)
      for (int64_t k = 0; k < s.k; ++k, from += run)
        std::copy_n(from, run,
                    out.data() +
                        (((a * s.k + k) * s.n + c) * s.run()) * elemBytes);
  }
  return out;
}

std::vector<int> axisGroup(const program::Mesh &mesh, int device,
                           const std::string &axis, int *coordinate) {
  int a = mesh.axis(axis);
  if (coordinate)
    *coordinate = 0;
  if (a < 0)
    return {device};
  // Row-major over the axes: the last axis varies fastest.
  int64_t stride = 1;
  for (size_t k = size_t(a) + 1; k < mesh.axes.size(); ++k)
    stride *= mesh.axes[k].size;
  int64_t size = mesh.axes[size_t(a)].size;
  int64_t coord = (device / stride) % size;
  if (coordinate)
    *coordinate = int(coord);
  int64_t base = device - coord * stride;
  std::vector<int> group;
  for (int64_t c = 0; c < size; ++c)
    group.push_back(int(base + c * stride));
  return group;
}

} // namespace kiln::train
