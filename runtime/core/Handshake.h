//===- Handshake.h - Ranks agree on the program before they run it -*- C++
//-*-===//
//
// Before the first step, every rank of a run all-gathers what it is about to
// execute: the artifact's hash, and a digest of the compiled collective
// sequence (each function's collective steps in order: op, axis or group,
// dtype, reduction, bytes, peer, offsets, queue). Ranks that would make
// different collective calls would deadlock or exchange garbage; the
// handshake refuses to start instead, naming the ranks that differ from
// rank 0 and what differs. The exchange is one all_gather through the
// communicator, so it has the communicator's deadline.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_CORE_HANDSHAKE_H
#define KILN_RUNTIME_CORE_HANDSHAKE_H

#include "runtime/comm/Communicator.h"
#include "runtime/core/Program.h"
#include "runtime/core/Status.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kiln {

/// The collective sequence of `p`, one line per collective step:
/// "@train_step 12: all_reduce axis=dp f32 mean 4096 bytes peer=-1 send=0
/// recv=0 queue=1" (what collectiveDigest() hashes; for messages and tests).
std::string collectiveSequence(const program::Program &p);
/// collectiveSequence(p)'s lines, one per collective step.
std::vector<std::string> collectiveLines(const program::Program &p);
/// FNV-1a (64 bits) of collectiveSequence(p).
uint64_t collectiveDigest(const program::Program &p);
/// Number of collective steps over all functions.
int64_t collectiveCount(const program::Program &p);
/// FNV-1a (64 bits) of `bytes`, as 16 hex digits: a cheap artifact hash
/// for callers that have none (it detects different files, not attacks).
std::string contentHash(const void *bytes, size_t size);

/// Every rank of `comm` calls this with the program it loaded and the
/// artifact's hash (up to 64 characters are compared); an error on every
/// rank if any rank's hash, mesh or collective sequence differs from rank
/// 0's (then naming the first collective that differs, among the first
/// 256, with both ranks' descriptions of it), or the communicator's size is
/// not the mesh's device count.
Status checkSameProgram(comm::Communicator &comm, const program::Program &p,
                        const std::string &artifactHash);

} // namespace kiln

#endif // KILN_RUNTIME_CORE_HANDSHAKE_H
