//===- FuzzArtifact.cpp - libFuzzer target: the .kpack loader --------------===//
//
// Package::open on the input as a file: the container (header, section
// table, CRCs), then every section's content (manifest JSON, plan, CUDA
// launch plan, initializers). It must return a package or an
// error that names the file.
//
// Every section carries a CRC-32, so plain byte mutations almost never get
// past the container. A custom mutator therefore also mutates one section
// of a well-formed artifact and re-serializes it with fresh CRCs: those
// inputs reach the section parsers, which are what a damaged or hand-made
// artifact really exercises. For the plan and the manifest it may instead
// change one JSON value or array (mutateJson), which keeps them JSON and
// gets past the JSON parser to the plan's own checks. Seeds: artifacts of the examples, single- and
// multi-device (data, tensor and pipeline parallel, ZeRO, gradient
// accumulation: test/fuzz/run.sh).
//
// An artifact Package::open accepts then goes through what kiln-run does
// with it before the first kernel runs, on every device of its mesh (up to
// kMaxDevices): the one-device check, the start-up handshake's collective
// sequence, each collective's communicator group as the device would form
// it, the inter-op threads' exact dependencies and schedule listing, and
// Model::attach with a backend that runs nothing but checks every write of
// the initial values (ZeRO blocks, tensor-parallel blocks, stage-local
// buffers) against the device's arena. An internal error there, a group
// or peer out of range, or a write outside the arena means open() let
// through a plan the runtime would misuse: the target aborts.
//
//===----------------------------------------------------------------------===//
#include "runtime/core/Artifact.h"
#include "runtime/core/Backend.h"
#include "runtime/core/Collectives.h"
#include "runtime/core/Handshake.h"
#include "runtime/core/Package.h"
#include "runtime/core/StepLoop.h"
#include "runtime/train/Model.h"
#include "test/fuzz/MemFile.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

using namespace kiln;

extern "C" size_t LLVMFuzzerMutate(uint8_t *data, size_t size, size_t maxSize);

namespace {

using json = nlohmann::ordered_json;

/// Mutates the JSON of a manifest or plan section in place, keeping it
/// JSON: 1 to 3 times, one value (a number set to a neighbour, a boundary
/// or another number of the document; a string set to another string of
/// it; a boolean flipped) or one array (an element dropped, duplicated or
/// two swapped). Byte mutations of these sections nearly always break the
/// JSON; these reach the plan's checks (mesh, per-device buffer plans,
/// collectives, queues, dependencies, stages) and what runs after them.
bool mutateJson(std::string &text, std::minstd_rand &rng) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_structured())
    return false;
  std::vector<json *> leaves, arrays;
  std::vector<json> numbers, strings;
  std::vector<json *> stack{&j};
  while (!stack.empty()) {
    json *v = stack.back();
    stack.pop_back();
    if (v->is_array())
      arrays.push_back(v);
    if (v->is_structured()) {
      for (json &c : *v)
        stack.push_back(&c);
      continue;
    }
    leaves.push_back(v);
    if (v->is_number())
      numbers.push_back(*v);
    else if (v->is_string())
      strings.push_back(*v);
  }
  if (leaves.empty() && arrays.empty())
    return false;
  auto pick = [&](size_t n) { return size_t(rng() % n); };
  for (int times = 1 + int(rng() % 3); times > 0; --times) {
    if (!arrays.empty() && (leaves.empty() || rng() % 4 == 0)) {
      json &a = *arrays[pick(arrays.size())];
      if (a.empty())
        continue;
      size_t i = pick(a.size()), k = pick(a.size());
      switch (rng() % 3) {
      case 0: a.erase(a.begin() + std::ptrdiff_t(i)); break;
      case 1: a.push_back(a[i]); break;
      default: std::swap(a[i], a[k]); break;
      }
      arrays.clear(); // pointers into a changed array may dangle
      leaves.clear();
      continue;
    }
    if (leaves.empty())
      continue;
    json &v = *leaves[pick(leaves.size())];
    if (v.is_boolean()) {
      v = !v.get<bool>();
    } else if (v.is_string()) {
      if (!strings.empty())
        v = strings[pick(strings.size())];
    } else if (v.is_number_integer() || v.is_number_unsigned()) {
      int64_t x = v.is_number_unsigned() ? int64_t(v.get<uint64_t>()) : v.get<int64_t>();
      auto add = [x](uint64_t d) { return int64_t(uint64_t(x) + d); }; // wraps, no UB
      const int64_t choices[] = {add(1), add(~uint64_t(0)), 0, 1, -1, add(uint64_t(x)), x / 2,
                                 add(64), add(~uint64_t(63)), int64_t(1) << 31,
                                 int64_t(1) << 40, INT64_MAX, INT64_MIN};
      size_t c = pick(sizeof choices / sizeof choices[0] + 1);
      if (c < sizeof choices / sizeof choices[0])
        v = choices[c];
      else if (!numbers.empty())
        v = numbers[pick(numbers.size())];
    } else if (v.is_number_float()) {
      const double choices[] = {0.0, -1.0, 1e300, -0.5};
      v = choices[pick(4)];
    } else if (v.is_null()) {
      v = 0;
    }
  }
  text = j.dump();
  return true;
}

} // namespace

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t maxSize,
                                          unsigned int seed) {
  Expected<artifact::Artifact> a =
      artifact::Artifact::parse(std::string(reinterpret_cast<char *>(data), size), "seed");
  // A third of the time (and whenever the input is not a valid container),
  // mutate the raw bytes; a third, one section's bytes; a third, the JSON
  // of the manifest or the plan.
  if (!a || a->sections().empty() || seed % 3 == 0)
    return LLVMFuzzerMutate(data, size, maxSize);
  std::vector<artifact::Section> sections = a->sections();
  artifact::Section *s = &sections[(seed / 3) % sections.size()];
  bool mutated = false;
  if (seed % 3 == 2) {
    artifact::Section *plan = nullptr, *manifest = nullptr;
    for (artifact::Section &t : sections) {
      if (t.kind == artifact::SectionKind::Plan)
        plan = &t;
      if (t.kind == artifact::SectionKind::Manifest)
        manifest = &t;
    }
    // The plan twice as often as the manifest.
    std::minstd_rand rng(seed / 3 + 1);
    artifact::Section *t = plan && (!manifest || rng() % 3 != 0) ? plan : manifest;
    if (t) {
      s = t;
      mutated = mutateJson(s->bytes, rng);
    }
  }
  if (!mutated) {
    // Room for the section to grow by up to 1 KiB (bounded by maxSize below).
    std::string bytes = s->bytes;
    size_t room = bytes.size() + 1024;
    bytes.resize(room);
    size_t n =
        LLVMFuzzerMutate(reinterpret_cast<uint8_t *>(bytes.data()), s->bytes.size(), room);
    bytes.resize(n);
    s->bytes = std::move(bytes);
  }
  Expected<std::string> image = artifact::serialize(sections);
  if (!image || image->size() > maxSize)
    return LLVMFuzzerMutate(data, size, maxSize);
  std::memcpy(data, image->data(), image->size());
  return image->size();
}

namespace {

/// Devices of a mesh whose pre-run checks are replayed (each costs a pass
/// over the initial values).
constexpr int kMaxDevices = 16;

[[noreturn]] void bug(const std::string &what) {
  std::fprintf(stderr, "kiln artifact loader bug: %s\n", what.c_str());
  std::abort();
}

/// A backend that runs nothing: write() checks what the CPU executor's
/// would (the buffer in range, held by the device, the bytes inside the
/// device's arena) and keeps nothing.
class CheckingBackend : public Backend {
public:
  CheckingBackend(const program::Program &p, int device) : p_(p), device_(device) {}
  const program::Program &program() const override { return p_; }
  std::string describe() const override { return "fuzz"; }
  Status write(int id, const void *, size_t bytes) override {
    const program::BufferPlan &plan = p_.plan(device_);
    if (id < 0 || size_t(id) >= plan.buffers.size() ||
        bytes > size_t(plan.buffers[size_t(id)].bytes))
      return Status::internal("write to buffer " + std::to_string(id) + " out of range");
    if (!p_.holds(device_, id))
      return notHeld(p_, device_, id, "write");
    const program::Buffer &b = plan.buffers[size_t(id)];
    if (b.offset < 0 || b.offset + int64_t(bytes) > plan.arenaBytes)
      bug("device " + std::to_string(device_) + " writes buffer " + std::to_string(id) +
          " outside its arena");
    return Status::ok();
  }
  Status read(int, void *, size_t) override { return Status::internal("fuzz: no reads"); }
  Status runSteps(const std::string &, size_t, size_t) override {
    return Status::internal("fuzz: nothing runs");
  }
  Status synchronize() override { return Status::ok(); }
  void setProfiling(bool) override {}
  std::vector<Timing> timings() override { return {}; }

private:
  const program::Program &p_;
  int device_;
};

/// kiln-run's checks between loading the artifact and running it.
void checkBeforeRun(Package pkg) {
  train::Model m;
  m.pkg = std::move(pkg);
  const program::Program &p = m.prog();
  int devices = p.numDevices();
  if (devices == 1)
    (void)checkSingleDevice(p);
  // The handshake (every rank compares these).
  (void)collectiveDigest(p);
  if (collectiveLines(p).size() != size_t(collectiveCount(p)))
    bug("the collective sequence has a line per collective step");
  (void)collectiveGroups(p);
  // Inter-op threads: exact dependencies and the schedule listing.
  for (const program::Function &f : p.functions) {
    program::Function exact = f;
    program::exactDependencies(p, exact);
    for (size_t i = 0; i < exact.steps.size(); ++i)
      for (int d : exact.steps[i].deps)
        if (d < 0 || size_t(d) >= i)
          bug("exactDependencies gives a step a dependency that is not an earlier step");
    (void)program::scheduleShape(exact);
    for (size_t i = 0; i < f.steps.size(); ++i)
      (void)program::scheduleNote(f, i);
  }
  // Each device: the communicator group of every collective it runs, as
  // callCommunicator() forms it, then the initial values into its arena.
  for (int d = 0; d < devices && d < kMaxDevices; ++d) {
    for (const program::Function &f : p.functions)
      for (const program::Step &s : f.steps) {
        if (s.kind != program::Step::Collective || !p.runs(d, s))
          continue;
        const program::Collective &c = s.collective;
        comm::Group g = collectiveGroup(p.mesh, c, d);
        int members = g.empty() ? devices : int(g.size());
        if (members != c.groupSize(p.mesh))
          bug("a collective's group differs from its group size");
        for (int r : g)
          if (r < 0 || r >= devices)
            bug("a collective's group names a device outside the mesh");
        if (c.peer >= members)
          bug("a collective's peer is outside its group");
      }
    m.device = d;
    m.shards.clear();
    Status s = m.attach(std::make_unique<CheckingBackend>(p, d));
    if (!s && s.kind() == ErrorKind::Internal)
      bug("device " + std::to_string(d) + ": an internal error loading the initial values of " +
          "an accepted artifact: " + s.message());
    m.exec.reset();
  }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static fuzz::MemFile file;
  const std::string &path = file.set(data, size);
  Expected<Package> p = Package::open(path);
  if (!p && p.status().message().find(path) == std::string::npos)
    bug("an error that does not name the file\n" + p.status().message());
  if (p)
    checkBeforeRun(std::move(*p));
  return 0;
}
