#include "loom/types.hpp"

#include <cmath>
#include <sstream>

namespace loom {

const char* to_string(Mode m) { return m == Mode::single ? "single" : "ffn"; }
const char* to_string(DType d) { return d == DType::fp8 ? "fp8" : "bf16"; }
const char* to_string(Scoring s) { return s == Scoring::softmax ? "softmax" : "sigmoid"; }

Mode parse_mode(const std::string& s) {
  if (s == "single") return Mode::single;
  if (s == "ffn") return Mode::ffn;
  throw Error("unknown mode '" + s + "' (expected single or ffn)");
}
DType parse_dtype(const std::string& s) {
  if (s == "fp8") return DType::fp8;
  if (s == "bf16") return DType::bf16;
  throw Error("unknown dtype '" + s + "' (expected fp8 or bf16)");
}
Scoring parse_scoring(const std::string& s) {
  if (s == "softmax") return Scoring::softmax;
  if (s == "sigmoid") return Scoring::sigmoid;
  throw Error("unknown scoring '" + s + "' (expected softmax or sigmoid)");
}

namespace {
void check_width(const char* name, int64_t v) {
  if (v <= 0) throw Error(std::string(name) + " must be positive, got " + std::to_string(v));
  if (v > kMaxWidth)
    throw Error(std::string(name) + " = " + std::to_string(v) + " exceeds the limit " + std::to_string(kMaxWidth));
  if (v % kWidthAlign != 0)
    throw Error(std::string(name) + " = " + std::to_string(v) + " is not a multiple of " +
                std::to_string(kWidthAlign));
}
}  // namespace

void validate(const Shape& s) {
  if (s.tokens < 0) throw Error("tokens must be >= 0, got " + std::to_string(s.tokens));
  if (s.tokens > kMaxTokens)
    throw Error("tokens = " + std::to_string(s.tokens) + " exceeds the limit " + std::to_string(kMaxTokens));
  const bool single = s.mode == Mode::single;
  check_width(single ? "K (hidden)" : "hidden", s.hidden);
  check_width(single ? "N (inter)" : "inter", s.inter);
  if (s.experts <= 0) throw Error("experts must be positive, got " + std::to_string(s.experts));
  if (s.experts > kMaxExperts)
    throw Error("experts = " + std::to_string(s.experts) + " exceeds the limit " + std::to_string(kMaxExperts));
  if (s.topk <= 0) throw Error("topk must be positive, got " + std::to_string(s.topk));
  if (s.topk > s.experts)
    throw Error("topk = " + std::to_string(s.topk) + " exceeds experts = " + std::to_string(s.experts));
}

void validate(const Routing& r, const Shape& s) {
  if (!std::isfinite(r.softcap) || r.softcap < 0.0f)
    throw Error("softcap must be finite and >= 0 (0 disables it)");
  if (!std::isfinite(r.scale)) throw Error("routing scale must be finite");
  if (r.scoring == Scoring::softmax) {
    if (r.n_group != 1 || r.topk_group != 1)
      throw Error("grouped top-k (n_group, topk_group) is defined for sigmoid scoring only");
    return;
  }
  if (r.n_group <= 0 || s.experts % r.n_group != 0)
    throw Error("n_group = " + std::to_string(r.n_group) + " must divide experts = " + std::to_string(s.experts));
  if (r.topk_group <= 0 || r.topk_group > r.n_group)
    throw Error("topk_group = " + std::to_string(r.topk_group) + " must be in [1, n_group = " +
                std::to_string(r.n_group) + "]");
  const int64_t kept = int64_t(r.topk_group) * (s.experts / r.n_group);
  if (s.topk > kept)
    throw Error("topk = " + std::to_string(s.topk) + " exceeds the " + std::to_string(kept) +
                " experts left in topk_group groups");
}

std::string describe(const Shape& s) {
  std::ostringstream o;
  o << "T=" << s.tokens << " H=" << s.hidden << " I=" << s.inter << " E=" << s.experts << " k=" << s.topk << " "
    << to_string(s.dtype) << " " << to_string(s.mode);
  return o.str();
}

std::string describe(const Routing& r) {
  std::ostringstream o;
  o << to_string(r.scoring);
  if (r.softcap > 0) o << " softcap=" << r.softcap;
  if (r.scoring == Scoring::sigmoid) o << " groups=" << r.topk_group << "/" << r.n_group;
  o << (r.renormalize ? " renorm" : " no-renorm") << " scale=" << r.scale;
  return o.str();
}

}  // namespace loom
