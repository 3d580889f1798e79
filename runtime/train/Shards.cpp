//===- Shards.cpp - ZeRO-sharded persistent buffers -----------------------===//
#include "runtime/train/Shards.h"

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
