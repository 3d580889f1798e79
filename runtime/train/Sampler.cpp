//===- Sampler.cpp - Text from a character-level language model -----------===//
#include "runtime/train/Sampler.h"

#include "runtime/core/Data.h"
#include "runtime/core/Random.h"

#include <fmt/format.h>

#include <map>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>

namespace kiln::train {

using program::Buffer;

Expected<std::string> sample(Model &m, const SampleOptions &o, const BackendFactory &make,
                             const Sink &out) {
  const program::Function *pred = m.prog().function("predict");
  if (!pred || pred->results.empty() ||
      m.prog().buffers[pred->results[0]].shape.size() != 3)
    return Status::error(m.pkg.path + ": sampling needs a language model (logits of "
                                          "shape [batch, context, vocab])");
  std::optional<ckpt::Checkpoint> params;
  if (!o.checkpoint.empty()) {
    auto c = readCheckpoint(m, o.checkpoint, false, out,
                            CheckpointUse::Parameters);
    if (!c)
      return c.status();
    params = std::move(*c);
  }
  std::string vocabPath = o.vocab;
  if (vocabPath.empty() && !m.pkg.train.data.empty())
    vocabPath = dirOf(resolvePath(m.pkg.train.data, m.pkg)) + "/vocab.json";
  auto vocab = data::readVocab(vocabPath);
  if (!vocab)
    return Status::error(vocab.status().message() +
                         " (the vocabulary kiln-run prepare wrote; pass --vocab FILE)");
  int logitsId = pred->results[0];
  const Buffer &lb = m.prog().buffers[logitsId];
  int64_t context = lb.shape[1], V = lb.shape[2];
  if (int64_t(vocab->size()) != V)
    return Status::error(fmt::format("{} has {} characters, the model {} classes", vocabPath,
                                     vocab->size(), V));
  // The prompt's characters (UTF-8, as kiln-run prepare reads its text).
  std::map<std::string, int64_t> index;
  for (size_t k = 0; k < vocab->size(); ++k)
    index[(*vocab)[k]] = int64_t(k);
  std::vector<int64_t> seq;
  for (size_t i = 0; i < o.prompt.size();) {
    size_t len = data::utf8CharLength(o.prompt, i);
    auto byte = static_cast<unsigned char>(o.prompt[i]);
    if (len == 0)
      return Status::error(fmt::format(
          "the prompt is not UTF-8 text: byte 0x{:02x} at byte offset {} does not start a "
          "character",
          byte, i));
    std::string ch = o.prompt.substr(i, len);
    auto it = index.find(ch);
    if (it == index.end()) {
      std::string shown = byte < 0x20 || byte == 0x7f
                              ? fmt::format("U+{:04X}{}", byte, ch == "\n" ? " (a newline)" : "")
                              : fmt::format("'{}'", ch);
      return Status::error(fmt::format(
          "the prompt's character {} at byte offset {} is not in the vocabulary {} (it has the "
          "{} characters of the training text){}",
          shown, i, vocabPath, vocab->size(),
          o.promptGiven ? ""
                        : "; the default prompt is a newline: give one with --prompt TEXT"));
    }
    seq.push_back(it->second);
    i += len;
  }
  if (seq.empty())
    seq.push_back(0);
  std::vector<int> inputs = m.dataInputs("predict");
  if (inputs.size() != 1)
    return Status::error(m.pkg.path + ": @predict should take one token input");
  if (Status s = m.compile(make, o.profile); !s)
    return s;
  if (params)
    if (Status s = m.setPersistent(*params); !s)
      return s;
  uint64_t seed = o.seed ? *o.seed : 1;
  int64_t rows = m.prog().buffers[inputs[0]].shape[0];
  std::string text = o.prompt;
  std::vector<int64_t> window(size_t(rows * context), 0);
  std::vector<double> p(static_cast<size_t>(V));
  for (int64_t t = 0; t < o.tokens; ++t) {
    int64_t len = std::min<int64_t>(int64_t(seq.size()), context);
    std::fill(window.begin(), window.end(), 0);
    std::copy(seq.end() - len, seq.end(), window.begin());
    if (Status s = storeInts(*m.exec, inputs[0], window.data(), int64_t(window.size())); !s)
      return s;
    if (Status s = m.exec->run("predict"); !s)
      return s;
    auto all = m.exec->readAll<float>(logitsId);
    if (!all)
      return all.status();
    // Causal: position len-1 of row 0 sees exactly the window.
    const float *logits = all->data() + (len - 1) * V;
    int64_t next = 0;
    if (o.temperature == 0) {
      next = std::max_element(logits, logits + V) - logits;
    } else {
      std::vector<int64_t> order(static_cast<size_t>(V));
      std::iota(order.begin(), order.end(), 0);
      int64_t k = o.topK > 0 ? std::min(o.topK, V) : V;
      std::partial_sort(order.begin(), order.begin() + k, order.end(),
                        [&](int64_t a, int64_t b) { return logits[a] > logits[b]; });
      double mx = logits[order[0]], sum = 0;
      for (int64_t i = 0; i < k; ++i)
        sum += (p[size_t(i)] = std::exp((logits[order[size_t(i)]] - mx) / o.temperature));
      double u = double(random::bits(seed, 0x5a3e1eULL, uint64_t(t)) >> 11) * 0x1.0p-53 * sum;
      next = order[size_t(k - 1)];
      for (int64_t i = 0; i < k; ++i) {
        u -= p[size_t(i)];
        if (u < 0) {
          next = order[size_t(i)];
          break;
        }
      }
    }
    seq.push_back(next);
    text += (*vocab)[size_t(next)];
  }
  return text;
}

} // namespace kiln::train
