//===- TraceFile.cpp - A run's spans as a Chrome trace / Perfetto file ----===//
#include "runtime/train/TraceFile.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <stdlib.h>
#include <tuple>

namespace kiln::train {

Expected<std::pair<int64_t, int64_t>> parseTraceSteps(const std::string &text) {
  auto bad = [&](const std::string &why) {
    return Status::error(fmt::format(
        "--trace-steps needs A:B, steps A (inclusive) to B (exclusive) with 0 <= A < B, "
        "e.g. 10:20; got '{}' ({})",
        text, why));
  };
  size_t colon = text.find(':');
  if (colon == std::string::npos)
    return bad("no ':'");
  auto number = [](const std::string &s, int64_t &out) {
    if (s.empty() || s[0] == '-' || s[0] == '+')
      return false;
    char *end = nullptr;
    errno = 0;
    long long x = std::strtoll(s.c_str(), &end, 10);
    if (*end || errno)
      return false;
    out = x;
    return true;
  };
  int64_t a = 0, b = 0;
  if (!number(text.substr(0, colon), a) || !number(text.substr(colon + 1), b))
    return bad("A and B must be integers >= 0");
  if (a >= b)
    return bad(fmt::format("{} is not below {}: the window would be empty", a, b));
  return std::make_pair(a, b);
}

std::pair<int64_t, int64_t> traceWindow(int64_t from, int64_t to, int64_t start, int64_t end) {
  if (from < 0) {
    from = start + 2 < end ? start + 2 : start;
    to = from + 10;
  }
  from = std::clamp(from, start, std::max(start, end));
  to = std::clamp(to, from, std::max(from, end));
  return {from, to};
}

Status checkTraceFile(const std::string &path) {
  if (path.empty())
    return Status::error("--trace needs a file name (e.g. --trace run.trace.json)");
  // Opened for appending: an existing file keeps its contents until the
  // trace replaces it; one made here is removed again.
  std::FILE *existing = std::fopen(path.c_str(), "r");
  if (existing)
    std::fclose(existing);
  std::FILE *f = std::fopen(path.c_str(), "a");
  if (!f)
    return Status::error(
        fmt::format("--trace {}: cannot write the trace file there ({}); name a file in a writable "
                    "directory",
                    path, std::strerror(errno)));
  std::fclose(f);
  if (!existing)
    std::remove(path.c_str());
  return Status::ok();
}

std::string jsonString(const std::string &s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
    case '"':
      out += "\\\"";
      break;
    case '\\':
      out += "\\\\";
      break;
    case '\n':
      out += "\\n";
      break;
    case '\t':
      out += "\\t";
      break;
    case '\r':
      out += "\\r";
      break;
    default:
      if (c < 0x20)
        out += fmt::format("\\u{:04x}", c);
      else
        out += char(c);
    }
  }
  return out + "\"";
}

std::string absolutePath(const std::string &path) {
  if (path.empty())
    return path;
  char *resolved = ::realpath(path.c_str(), nullptr);
  if (!resolved)
    return path;
  std::string out = resolved;
  std::free(resolved);
  return out;
}

std::vector<std::pair<std::string, std::string>>
traceSourceInfo(const std::string &artifact, const std::string &sourcePath,
                const std::string &sourceAbsPath, const std::string &sourceHash) {
  // An artifact from before kilnc recorded the absolute path: the path as
  // compiled, made absolute when it names a file from here.
  std::string model = !sourceAbsPath.empty() ? sourceAbsPath : absolutePath(sourcePath);
  size_t slash = model.rfind('/');
  std::string name = slash == std::string::npos ? model : model.substr(slash + 1);
  return {{"artifact", jsonString(absolutePath(artifact))},
          {"model_file", jsonString(model)},
          {"model_file_name", jsonString(name)},
          {"model_file_sha256", jsonString(sourceHash)},
          {"model_file_as_compiled", jsonString(sourcePath)}};
}

int64_t originNanos(const Tracer &t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.origin().time_since_epoch())
      .count();
}

namespace {

/// A finite number as JSON (non-finite values as 0).
std::string num(double x) {
  if (!std::isfinite(x))
    return "0";
  if (x == std::floor(x) && std::fabs(x) < 1e15)
    return fmt::format("{}", int64_t(x));
  return fmt::format("{:.6g}", x);
}

/// Microseconds with nanosecond digits, from nanoseconds >= 0.
std::string micros(int64_t ns) {
  if (ns < 0)
    ns = 0;
  return fmt::format("{}.{:03d}", ns / 1000, int(ns % 1000));
}

std::string jsonList(const std::vector<std::string> &v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i)
    out += (i ? "," : "") + jsonString(v[i]);
  return out + "]";
}

/// "path/to/gpt.kiln:41:5" -> "gpt.kiln:41".
std::string shortLoc(const std::string &loc) {
  std::string s = loc;
  size_t last = s.rfind(':');
  if (last != std::string::npos && last > 0) {
    size_t prev = s.rfind(':', last - 1);
    if (prev != std::string::npos)
      s = s.substr(0, last); // drop the column
  }
  size_t slash = s.rfind('/');
  return slash == std::string::npos ? s : s.substr(slash + 1);
}

std::string stripDialect(const std::string &op) {
  return op.rfind("kiln.", 0) == 0 ? op.substr(5) : op;
}

/// Track ids within a device's process (the file's tid is pid * 1000 plus
/// these: unique across processes, never 0, which Perfetto treats as
/// special, like pid 0).
constexpr int kTrainerTid = kTrainerTrack, kComputeTid = kComputeTrack, kWorkerTid = kWorkerTrack;
constexpr int kTidsPerProcess = 1000;

int trackOf(const Span &s) {
  switch (s.kind) {
  case Span::Kernel:
  case Span::Gemm:
  case Span::Copy:
    if (s.thread > 0)
      return kWorkerTid + s.thread;
    return kComputeTid + std::max(0, s.queue);
  case Span::CollectiveWait:
    // Where the waiting happened: the compute track (or an inter-op
    // worker's), whatever queue the awaited call ran on (a pipeline's
    // send/recv wait names the communication queue; drawn there it would
    // overlap the transfer it waits for).
    if (s.thread > 0)
      return kWorkerTid + s.thread;
    return kComputeTid;
  case Span::Collective:
    // On its queue; a collective of a single-queue plan still gets the
    // communication track (its wait is on the compute track).
    return kComputeTid + std::max(1, s.queue);
  default:
    return kTrainerTid;
  }
}

} // namespace

std::string traceTrackName(int tid) {
  if (tid == kTrainerTid)
    return "trainer";
  if (tid == kComputeTid)
    return "compute (queue 0)";
  if (tid >= kWorkerTid)
    return fmt::format("compute worker {}", tid - kWorkerTid);
  return fmt::format("communication (queue {})", tid - kComputeTid);
}

namespace {

/// A span's slice name and args.
void describe(const Span &s, const program::Program *p, TraceSlice &out) {
  double secs = s.seconds;
  auto rate = [&](double amount) { return secs > 0 ? amount / secs / 1e9 : 0.0; };
  const program::Step *step = nullptr;
  if (p && s.planStep >= 0)
    if (const program::Function *f = p->function(s.function))
      if (size_t(s.planStep) < f->steps.size())
        step = &f->steps[size_t(s.planStep)];
  auto &args = out.args;
  args.push_back(TraceArg::number("step", double(s.step)));
  if (!s.function.empty()) {
    args.push_back(TraceArg::string("function", s.function));
    args.push_back(TraceArg::number("plan step", s.planStep));
  }
  out.cat = spanKindName(s.kind);
  switch (s.kind) {
  case Span::Kernel: {
    const program::Kernel *k = p && s.kernel >= 0 && size_t(s.kernel) < p->kernels.size()
                                   ? &p->kernels[size_t(s.kernel)]
                                   : nullptr;
    if (k) {
      std::string op = stripDialect(k->op.empty() && !k->ops.empty() ? k->ops.back() : k->op);
      // A kernel the compiler made without a model line (the MLP's
      // constant learning rate): said so in its name.
      out.name = k->locs.empty() ? fmt::format("(compiler) {}", op)
                                 : fmt::format("{} {}", shortLoc(k->locs[0]), op);
      if (k->locs.empty())
        args.push_back(TraceArg::flag("generated", true));
      std::vector<std::string> ops;
      for (const std::string &o : k->ops)
        ops.push_back(stripDialect(o));
      args.push_back(TraceArg::string("symbol", k->symbol));
      args.push_back(TraceArg::strings("ops", ops));
      args.push_back(TraceArg::strings("lines", k->locs));
      args.push_back(TraceArg::number("flops", s.flops));
      args.push_back(TraceArg::number("bytes", s.bytes));
      args.push_back(TraceArg::number("GFLOP/s", rate(s.flops)));
      args.push_back(TraceArg::number("GB/s", rate(s.bytes)));
    } else {
      out.name = s.name;
      args.push_back(TraceArg::string("symbol", s.name));
      args.push_back(TraceArg::number("flops", s.flops));
      args.push_back(TraceArg::number("bytes", s.bytes));
    }
    break;
  }
  case Span::Gemm: {
    out.name = s.name;
    std::string shape = s.name.rfind("gemm ", 0) == 0 ? s.name.substr(5) : s.name;
    args.push_back(TraceArg::string("shape", shape));
    args.push_back(TraceArg::string("line", step ? step->loc : ""));
    args.push_back(TraceArg::number("flops", s.flops));
    args.push_back(TraceArg::number("bytes", s.bytes));
    args.push_back(TraceArg::number("GFLOP/s", rate(s.flops)));
    args.push_back(TraceArg::number("GB/s", rate(s.bytes)));
    break;
  }
  case Span::Collective:
  case Span::CollectiveWait: {
    out.name = s.kind == Span::Collective ? s.name : "wait " + s.name;
    args.push_back(TraceArg::number("bytes", s.bytes));
    args.push_back(TraceArg::number("GB/s", s.kind == Span::Collective ? rate(s.bytes) : 0.0));
    if (step && p) {
      args.push_back(TraceArg::string("axis", step->collective.axis));
      args.push_back(TraceArg::number("devices", step->collective.groupSize(p->mesh)));
      args.push_back(TraceArg::string("line", step->loc));
    }
    break;
  }
  case Span::Copy:
    out.name = "copy";
    args.push_back(TraceArg::number("bytes", s.bytes));
    args.push_back(TraceArg::number("GB/s", rate(s.bytes)));
    break;
  default:
    out.name = s.kind == Span::Other || s.kind == Span::Step ? s.name : spanKindName(s.kind);
    break;
  }
}

/// The args as the members of a JSON object (without the braces).
std::string jsonArgs(const std::vector<TraceArg> &args) {
  std::string out;
  for (const TraceArg &a : args) {
    if (!out.empty())
      out += ',';
    out += jsonString(a.key) + ':';
    switch (a.kind) {
    case TraceArg::Number:
      out += num(a.value);
      break;
    case TraceArg::Bool:
      out += a.value != 0 ? "true" : "false";
      break;
    case TraceArg::String:
      out += jsonString(a.text);
      break;
    case TraceArg::Strings:
      out += jsonList(a.list);
      break;
    }
  }
  return out;
}

/// Clips the slices of each track so they nest: a slice that starts
/// inside another and ends after it is a neighbour overlapping by clock
/// noise (its start moves to the other's end) or, when most of it lies
/// inside, a child (its end moves to the other's end).
void nest(std::vector<TraceSlice> &slices) {
  std::stable_sort(slices.begin(), slices.end(), [](const TraceSlice &a, const TraceSlice &b) {
    if (a.track != b.track)
      return a.track < b.track;
    if (a.begin != b.begin)
      return a.begin < b.begin;
    return a.end > b.end; // the parent first
  });
  std::vector<int64_t> open; // ends of the enclosing slices
  int track = -1;
  for (TraceSlice &s : slices) {
    if (s.track != track) {
      open.clear();
      track = s.track;
    }
    while (!open.empty() && open.back() <= s.begin)
      open.pop_back();
    if (!open.empty() && s.end > open.back()) {
      int64_t top = open.back();
      if (top - s.begin < (s.end - s.begin) / 2) {
        s.begin = top;
        while (!open.empty() && open.back() <= s.begin)
          open.pop_back();
        if (!open.empty() && s.end > open.back())
          s.end = open.back();
      } else {
        s.end = top;
      }
    }
    s.end = std::max(s.end, s.begin);
    open.push_back(s.end);
  }
  // Moving a start may have unsorted the track.
  std::stable_sort(slices.begin(), slices.end(), [](const TraceSlice &a, const TraceSlice &b) {
    if (a.track != b.track)
      return a.track < b.track;
    if (a.begin != b.begin)
      return a.begin < b.begin;
    return a.end > b.end;
  });
}

} // namespace

std::vector<TraceSlice> traceSlices(const TraceSource &src) {
  if (!src.tracer)
    return {};
  std::vector<Span> spans = src.tracer->spans();
  auto ns = [&](double seconds) { return int64_t(std::llround((seconds + src.shift) * 1e9)); };
  // An asynchronous collective ran for `seconds` and had finished when
  // queue 0's wait for it ended; its start as recorded (just after it was
  // handed to its queue) can be late when the loop's thread was preempted,
  // so it ends no later than that wait.
  // A function run several times in one step (evaluation batches) waits
  // for the same plan step each time: the k-th call matches the k-th wait.
  using Key = std::tuple<int64_t, std::string, int>;
  std::map<Key, std::vector<std::pair<double, double>>> waits; // start, end
  for (const Span &s : spans)
    if (s.kind == Span::CollectiveWait)
      waits[{s.step, s.function, s.planStep}].push_back({s.start, s.start + s.seconds});
  for (auto &[k, w] : waits)
    std::sort(w.begin(), w.end());
  std::map<Key, size_t> matched;
  // The collectives drawn on one track ran one after another, in the order
  // they were handed over (a device's communication thread makes its calls
  // in order): one handed over while another ran began when that one ended,
  // later than recorded.
  std::vector<std::pair<double, double>> placed(spans.size()); // start, seconds
  {
    std::vector<size_t> order;
    for (size_t i = 0; i < spans.size(); ++i)
      if (spans[i].kind == Span::Collective)
        order.push_back(i);
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      int ta = trackOf(spans[a]), tb = trackOf(spans[b]);
      if (ta != tb)
        return ta < tb;
      return spans[a].start < spans[b].start;
    });
    std::map<int, double> free; // per track: when its previous call ended
    for (size_t i : order) {
      const Span &s = spans[i];
      double secs = std::max(0.0, s.seconds);
      auto f = free.find(trackOf(s));
      double earliest = f == free.end() ? s.start : std::max(s.start, f->second);
      double start = earliest;
      Key key{s.step, s.function, s.planStep};
      auto it = waits.find(key);
      size_t k = matched[key]++;
      if (it != waits.end() && k < it->second.size() && start + secs > it->second[k].second) {
        double waitEnd = it->second[k].second;
        start = std::max(f == free.end() ? -1e300 : f->second, waitEnd - secs);
        secs = std::max(0.0, std::min(secs, waitEnd - start));
      }
      placed[i] = {start, secs};
      free[trackOf(s)] = start + secs;
    }
  }
  std::vector<TraceSlice> slices;
  slices.reserve(spans.size() + spans.size() / 4);
  for (size_t i = 0; i < spans.size(); ++i) {
    const Span &s = spans[i];
    TraceSlice sl;
    sl.track = trackOf(s);
    double start = s.start, secs = std::max(0.0, s.seconds);
    if (s.kind == Span::Collective)
      std::tie(start, secs) = placed[i];
    sl.begin = ns(start);
    sl.end = ns(start + secs);
    describe(s, src.program, sl);
    slices.push_back(std::move(sl));
  }
  // Idle: inside each step, the gaps between what ran on the compute
  // tracks (queue 0 and the inter-op workers).
  std::vector<std::pair<int64_t, int64_t>> busy;
  for (const TraceSlice &s : slices)
    if (s.track == kComputeTid || s.track >= kWorkerTid)
      busy.emplace_back(s.begin, s.end);
  std::sort(busy.begin(), busy.end());
  int64_t minIdle = int64_t(kMinIdleSeconds * 1e9);
  std::vector<TraceSlice> idle;
  for (const Span &s : spans) {
    if (s.kind != Span::Step)
      continue;
    int64_t b = ns(s.start), e = ns(s.start + s.seconds);
    int64_t at = b;
    auto it = std::lower_bound(busy.begin(), busy.end(), std::make_pair(b, INT64_MIN));
    // A slice that began before the step and reaches into it.
    if (it != busy.begin())
      for (auto back = it; back != busy.begin();) {
        --back;
        at = std::max(at, std::min(e, back->second));
        if (back->second <= b)
          break;
      }
    auto gap = [&](int64_t from, int64_t to) {
      if (to - from < minIdle)
        return;
      TraceSlice g;
      g.track = kComputeTid;
      g.begin = from;
      g.end = to;
      g.name = "idle";
      g.cat = "idle";
      g.args = {TraceArg::number("step", double(s.step)),
                TraceArg::number("microseconds", double(to - from) / 1e3)};
      idle.push_back(std::move(g));
    };
    for (; it != busy.end() && it->first < e; ++it) {
      if (it->first > at)
        gap(at, it->first);
      at = std::max(at, std::min(e, it->second));
    }
    if (e > at)
      gap(at, e);
  }
  for (TraceSlice &g : idle)
    slices.push_back(std::move(g));
  nest(slices);
  return slices;
}

std::string renderTraceEvents(const TraceSource &src) {
  if (!src.tracer)
    return "";
  std::vector<TraceSlice> slices = traceSlices(src);
  std::string out;
  auto add = [&](const std::string &event) {
    if (!out.empty())
      out += ",\n";
    out += event;
  };
  // pid: the rank + 1 (Perfetto treats pid 0 as the kernel's).
  int pid = src.pid + 1;
  auto fileTid = [&](int tid) { return pid * kTidsPerProcess + tid; };
  add(fmt::format("{{\"ph\":\"M\",\"pid\":{},\"tid\":{},\"name\":\"process_name\","
                  "\"args\":{{\"name\":{}}}}}",
                  pid, fileTid(kTrainerTid), jsonString(src.process)));
  add(fmt::format("{{\"ph\":\"M\",\"pid\":{},\"tid\":{},\"name\":\"process_sort_index\","
                  "\"args\":{{\"sort_index\":{}}}}}",
                  pid, fileTid(kTrainerTid), src.pid));
  std::map<int, bool> tids{{kTrainerTid, true}, {kComputeTid, true}};
  for (const TraceSlice &s : slices)
    tids[s.track] = true;
  for (auto &[tid, _] : tids) {
    add(fmt::format("{{\"ph\":\"M\",\"pid\":{},\"tid\":{},\"name\":\"thread_name\","
                    "\"args\":{{\"name\":{}}}}}",
                    pid, fileTid(tid), jsonString(traceTrackName(tid))));
    add(fmt::format("{{\"ph\":\"M\",\"pid\":{},\"tid\":{},\"name\":\"thread_sort_index\","
                    "\"args\":{{\"sort_index\":{}}}}}",
                    pid, fileTid(tid), tid));
  }
  for (const TraceSlice &s : slices)
    add(fmt::format("{{\"ph\":\"X\",\"pid\":{},\"tid\":{},\"ts\":{},\"dur\":{},\"name\":{},"
                    "\"cat\":{},\"args\":{{{}}}}}",
                    pid, fileTid(s.track), micros(s.begin), micros(s.end - s.begin),
                    jsonString(s.name), jsonString(s.cat), jsonArgs(s.args)));
  return out;
}

Status writeTraceFile(const std::string &path, const std::vector<std::string> &pieces,
                      const std::vector<std::pair<std::string, std::string>> &otherData) {
  std::string tmp = path + ".tmp";
  std::FILE *f = std::fopen(tmp.c_str(), "w");
  if (!f)
    return Status::error(
        fmt::format("--trace {}: cannot write {} ({})", path, tmp, std::strerror(errno)));
  std::string head = "{\"traceEvents\":[\n";
  bool ok = std::fwrite(head.data(), 1, head.size(), f) == head.size();
  bool first = true;
  for (const std::string &p : pieces) {
    if (p.empty())
      continue;
    if (!first)
      ok = ok && std::fputs(",\n", f) >= 0;
    first = false;
    ok = ok && std::fwrite(p.data(), 1, p.size(), f) == p.size();
  }
  std::string tail = "\n],\n\"displayTimeUnit\":\"ms\",\n\"otherData\":{";
  for (size_t i = 0; i < otherData.size(); ++i)
    tail +=
        fmt::format("{}{}:{}", i ? "," : "", jsonString(otherData[i].first), otherData[i].second);
  tail += "}}\n";
  ok = ok && std::fwrite(tail.data(), 1, tail.size(), f) == tail.size();
  ok = std::fclose(f) == 0 && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return Status::error(
        fmt::format("--trace {}: writing the trace failed ({})", path, std::strerror(errno)));
  }
  return Status::ok();
}

Expected<std::vector<std::string>> gatherTrace(comm::Communicator &c, TraceSource src,
                                               const TraceRender &render) {
  int n = c.size();
  c.setContext("gathering the trace (--trace)");
  int64_t mine = src.tracer ? originNanos(*src.tracer) : 0;
  std::vector<int64_t> origins(size_t(n), 0);
  if (Status s = c.allGather(&mine, origins.data(), 1, ElementType::I64); !s)
    return s;
  int64_t earliest = *std::min_element(origins.begin(), origins.end());
  src.shift = double(mine - earliest) / 1e9;
  return gatherText(c, render(src));
}

Expected<std::vector<std::string>> gatherText(comm::Communicator &c, std::string text) {
  int n = c.size(), me = c.rank();
  int64_t len = int64_t(text.size());
  std::vector<int64_t> lens(size_t(n), 0);
  if (Status s = c.allGather(&len, lens.data(), 1, ElementType::I64); !s)
    return s;
  std::vector<std::string> out;
  // Sent as 8-byte words (the text padded with spaces).
  auto words = [](int64_t bytes) { return (bytes + 7) / 8; };
  if (me == 0) {
    out.resize(size_t(n));
    out[0] = std::move(text);
    for (int r = 1; r < n; ++r) {
      std::vector<int64_t> buf(size_t(std::max<int64_t>(1, words(lens[size_t(r)]))));
      if (Status s = c.recv(buf.data(), int64_t(buf.size()), ElementType::I64, r); !s)
        return s;
      out[size_t(r)].assign(reinterpret_cast<const char *>(buf.data()), size_t(lens[size_t(r)]));
    }
  } else {
    std::vector<int64_t> buf(size_t(std::max<int64_t>(1, words(len))), 0);
    std::memcpy(buf.data(), text.data(), text.size());
    if (Status s = c.send(buf.data(), int64_t(buf.size()), ElementType::I64, 0); !s)
      return s;
  }
  return out;
}

} // namespace kiln::train
