//===- Reduce.h - The communicators' one reduction kernel -------*- C++ -*-===//
//
// Every CPU communicator (InProcess, Mpi) combines the members' blocks with
// this function, so they agree bit for bit: out[e] = ((x0[e] op x1[e]) op
// x2[e]) op ..., member 0 first. Floating point sums are accumulated in the
// element type, except f16 and bf16, which are accumulated in f32 and rounded
// once at the end (nearest even, runtime/core/Half.h). A mean is that sum
// divided by the group size (in the accumulation type; integers truncate).
// Integer sums wrap (two's complement). i1 is refused.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_COMM_REDUCE_H
#define KILN_RUNTIME_COMM_REDUCE_H

#include "runtime/comm/Communicator.h"

namespace kiln::comm {

/// out[e] = inputs[0][e] op inputs[1][e] op ... for e < count, folded in
/// input order (or, for sums with SumOrder::Tree, in a pairwise tree over
/// the inputs); a mean divides by `groupSize`. `out` may alias any input
/// (each element is read from every input before it is written).
Status reduceBlocks(void *out, const void *const *inputs, int numInputs,
                    int64_t count, ElementType type, Reduction r, int groupSize,
                    SumOrder order = SumOrder::Members);

/// An error unless `type` is one the communicators combine (not i1).
Status checkReducible(ElementType type, const char *op);

/// "all_reduce (sum, 1024 x f32)", for messages.
std::string describeOp(const char *op, int64_t count, ElementType type,
                       const Reduction *r = nullptr);

} // namespace kiln::comm

#endif // KILN_RUNTIME_COMM_REDUCE_H
