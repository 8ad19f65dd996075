// The named workloads of DESIGN.md (docs/workloads.md lists them with their sources).
#include <string>
#include <vector>

#include "workload/workload.hpp"

namespace loom {

namespace {

Preset make_preset(std::string name, int64_t tokens, int64_t hidden, int64_t inter, int64_t experts, int64_t topk,
                   Mode mode, DType dtype, std::string note) {
  Preset p;
  p.name = std::move(name);
  p.shape.tokens = tokens;
  p.shape.hidden = hidden;
  p.shape.inter = inter;
  p.shape.experts = experts;
  p.shape.topk = topk;
  p.shape.mode = mode;
  p.shape.dtype = dtype;
  // All three route like Qwen-style MoE: softmax over all experts, top-k renormalised, no extra scale.
  p.routing.scoring = Scoring::softmax;
  p.routing.renormalize = true;
  p.routing.scale = 1.0f;
  p.note = std::move(note);
  return p;
}

}  // namespace

const std::vector<Preset>& presets() {
  static const std::vector<Preset> all = {
      make_preset("qwen35-single", 128, 2048, 512, 256, 8, Mode::single, DType::fp8,
                  "the seed benchmark: one FP8 grouped GEMM (K=2048 -> N=512) per route, decode-sized"),
      make_preset("qwen35-layer", 128, 2048, 512, 256, 8, Mode::ffn, DType::fp8,
                  "full FP8 MoE FFN of the same model; T from 1 to 8192 (default 128)"),
      make_preset("h200-bf16", 2048, 3072, 1536, 16, 8, Mode::ffn, DType::bf16,
                  "BF16 MoE FFN with few, wide experts; prefill-sized, T from 512 to 32768 (default 2048)"),
  };
  return all;
}

const Preset& find_preset(const std::string& name) {
  std::string known;
  for (const Preset& p : presets()) {
    if (p.name == name) return p;
    known += (known.empty() ? "" : ", ") + p.name;
  }
  throw Error("unknown preset '" + name + "' (known: " + known + ")");
}

}  // namespace loom
