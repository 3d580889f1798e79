//===- Output.h - Where the trainer's messages go ----------------*- C++ -*-===//
//
// runtime/train never writes to stdout or stderr itself: every message goes
// to a Sink the caller gives (kiln-run prints them; a test collects them; a
// multi-rank launcher gives rank 0 a printing sink and the others none).
//
//===----------------------------------------------------------------------===//
#ifndef KILN_RUNTIME_TRAIN_OUTPUT_H
#define KILN_RUNTIME_TRAIN_OUTPUT_H

#include <functional>
#include <string>

namespace kiln::train {

/// What kind of message a line is; the sink decides how to show it.
enum class Channel {
  Note,     ///< a status line ("4 kernels for ..."); kiln-run prefixes "kiln-run: "
  Line,     ///< a line of results, shown as it is
  Progress, ///< a line of progress (a step, an evaluation), to show at once
  Warning,  ///< something the user should know; kiln-run writes it to stderr
};

/// Receives one message (no trailing newline). An empty Sink drops them.
using Sink = std::function<void(Channel, const std::string &)>;

/// Sends `text` to `sink` when there is one.
inline void emit(const Sink &sink, Channel c, const std::string &text) {
  if (sink)
    sink(c, text);
}

} // namespace kiln::train

#endif // KILN_RUNTIME_TRAIN_OUTPUT_H
