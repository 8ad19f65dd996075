// `loom-lab bf16-variants`: the BF16 GEMM pair of the ffn layer (GEMM 1 act, GEMM 2 bf16 route rows)
// on the product's kernel and on the lab's variants (bf16_variant_instances.cuh: the unstaged
// epilogue, CTA pairs, A by token), in rounds that alternate the variants. Every variant's two
// outputs must equal the product's bit for bit (it throws otherwise). Expert rows balanced, or
// uneven (random counts with an empty expert and partial tiles); values random bf16.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace loom::lab {

struct Bf16VariantsOptions {
  std::vector<int> tokens{2048, 8192, 32768};
  int hidden = 3072, inter = 1536, experts = 16, topk = 8;  // h200-bf16
  int repeats = 10;     // timed rounds (each variant's GEMM pair once a round); 0: check only
  bool uneven = false;  // uneven expert rows instead of balanced
  uint32_t seed = 1;
};

// Prints progress to `log`; returns the table (median microseconds and TFLOP/s per variant and T).
std::string run_bf16_variants(const Bf16VariantsOptions& opt, std::ostream& log);

}  // namespace loom::lab
