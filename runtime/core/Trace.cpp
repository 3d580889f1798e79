//===- Trace.cpp - Timed spans of a run -----------------------------------===//
#include "runtime/core/Trace.h"

namespace kiln {

const char *spanKindName(Span::Kind k) {
  switch (k) {
  case Span::Kernel: return "kernel";
  case Span::Gemm: return "gemm";
  case Span::Copy: return "copy";
  case Span::Collective: return "collective";
  case Span::CollectiveWait: return "collective wait";
  case Span::DataWait: return "data wait";
  case Span::HostToDevice: return "host to device";
  case Span::Checkpoint: return "checkpoint";
  case Span::Eval: return "evaluation";
  case Span::Step: return "step";
  case Span::Other: return "other";
  }
  return "other";
}

void Tracer::add(Span s) {
  if (!enabled())
    return;
  if (s.step < 0)
    s.step = step();
  std::lock_guard<std::mutex> lock(mu_);
  spans_.push_back(std::move(s));
}

std::vector<Span> Tracer::spans() const {
  std::lock_guard<std::mutex> lock(mu_);
  return spans_;
}

void Tracer::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  spans_.clear();
}

SpanScope::SpanScope(Tracer *t, Span::Kind kind, std::string name)
    : t_(t && t->enabled() ? t : nullptr) {
  if (!t_)
    return;
  s_.kind = kind;
  s_.name = std::move(name);
  s_.start = t_->now();
}

SpanScope::~SpanScope() { finish(); }

void SpanScope::finish() {
  if (!t_)
    return;
  s_.seconds = t_->now() - s_.start;
  t_->add(std::move(s_));
  t_ = nullptr;
}

} // namespace kiln
