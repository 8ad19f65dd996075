// The BF16 GEMM's lab variants (`loom-lab bf16-variants`) write the product kernel's outputs bit
// for bit (the product's are checked against the CPU reference in tests/gemm/), on uneven expert
// rows with an empty expert and partial tiles, and widths that 256 does not divide.
#include <gtest/gtest.h>

#include <sstream>

#include "bf16_variants/bf16_variants_sm90.cuh"
#include "gpu_test.hpp"
#include "test_seed.hpp"
#include "loom/types.hpp"

namespace loom::lab {
namespace {

TEST(Bf16VariantsGpu, EveryVariantWritesTheProductsBits) {
  LOOM_REQUIRE_GPU();
  LOOM_FRESH_SEED();
  Bf16VariantsOptions opt;
  opt.tokens = {37, 300};
  opt.hidden = 2880;  // GEMM 2's N: neither 128 nor 256 divides it
  opt.inter = 1088;   // GEMM 1's act blocks: 8.5 of 128
  opt.experts = 16;
  opt.topk = 4;
  opt.repeats = 0;
  opt.uneven = true;
  opt.seed = uint32_t(seed);
  std::ostringstream log;
  EXPECT_NO_THROW(run_bf16_variants(opt, log)) << log.str();
  EXPECT_NE(log.str().find("T=300: every variant's outputs equal the product's"), std::string::npos) << log.str();
}

}  // namespace
}  // namespace loom::lab
