// x / scale for the E4M3 encoder from the group's reciprocal: one IEEE reciprocal per 128-group,
// then three IEEE operations per element (q0 = x * rcp, its exact residual, one correction),
// instead of one IEEE division (~8 instructions with its range check) per element.
//
// Bit-exact where it matters: for every bf16 x with |x| <= amax and scale = quant_scale(amax)
// (amax any finite bf16 magnitude), the E4M3 code of the result equals the code of the IEEE
// quotient x / scale. The fp32 results themselves are equal except below 2^-40 (the residual of a
// tiny x underflows), where both have x's sign and encode as +-0.
// QuantRef.ReciprocalDivisionKeepsEveryCode checks all 1.07e9 such pairs.
//
// Not for an infinite scale (an infinite input): the residual would be inf * 0. Divide there.
#pragma once

#if !defined(__CUDA_ARCH__)
#include <cmath>
#endif

#include "common/host_device.hpp"

namespace loom {

// rcp must be the correctly rounded 1 / scale (1.0f / scale on the host, __frcp_rn on the device).
LOOM_HOST_DEVICE inline float divide_by_scale(float x, float scale, float rcp) {
#if defined(__CUDA_ARCH__)
  const float q0 = __fmul_rn(x, rcp);
  const float minus_residual = __fmaf_rn(q0, scale, -x);  // exact: q0 is within an ulp of x / scale
  // q0 - residual * rcp, written so that x = -0 keeps its sign (-0 * rcp + -0 = -0).
  return __fmaf_rn(-minus_residual, rcp, q0);
#else
  const float q0 = x * rcp;
  const float minus_residual = std::fma(q0, scale, -x);
  return std::fma(-minus_residual, rcp, q0);
#endif
}

}  // namespace loom
