// Device side of the quantise + gather stage, shared by its kernel and the fused small-batch
// kernel (src/dispatch/route_dispatch_small_sm90.cu), so both compute the same bits.
#pragma once

#include <cstdint>

#include "ptx/prefetch.cuh"
#include "quant/quant_gather_sm90.cuh"
#include "quant/scale_divide.hpp"

// Mapping: one 128-wide group of one token per 8 lanes ("octet"). Lane `sub` of the octet owns 16
// consecutive bf16 (two 16-byte loads) and produces one 16-byte store of 16 codes per target row,
// so an octet writes one full 128-byte line per sorted row. A warp holds 4 (token, group) units;
// lanes past the end of the row (partial last group, H % 128 != 0) or past the last unit still run
// the shuffles but load and store nothing, and contribute amax 0 (neutral: amax >= 0).
// Register use is independent of H (16 values per thread), so H = 16 .. 65536 all fit.
//
// Per unit, every load is issued before any arithmetic: the two hidden loads and the first 16
// route rows (slots sub and 8 + sub). Topk > 16 loads further slots later, 8 at a time.
//
// Arithmetic (bit for bit quantize_1x128_ref, docs/numerics.md):
//   amax  = max over |x| by `a > amax` comparisons: a NaN (quiet or signalling) never wins
//   scale = fmaxf(amax, 1e-10f) / 448      IEEE division (__fdiv_rn)
//   v     = x / scale                      by the group's reciprocal and one correction
//                                          (divide_by_scale): the IEEE quotient's code, never
//                                          the plain x * (1/scale)
//   code  = cvt.rn.satfinite.e4m3x2.f32(v) (the encoder the host codec reproduces); its saturation
//         is the reference's clamp to +-448, and NaN stays NaN.

namespace loom::quant_detail {


constexpr int kLanesPerUnit = 8;                    // 8 lanes x 16 elements = one 128-group
constexpr int kUnitsPerWarp = 32 / kLanesPerUnit;   // 4
constexpr float kE4M3MaxF = 448.0f;
constexpr float kScaleFloor = 1e-10f;

// Two floats -> two E4M3 codes, `lo` in the low byte. The PTX puts its first source in the upper
// byte.
__device__ __forceinline__ uint32_t e4m3x2(float lo, float hi) {
  uint16_t r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
}

// The ffn intermediate's act = SiLU(g) * u in fp32, one formula for every kernel that computes it
// (silu_mul_quant, GEMM 1's epilogue); e^-g overflows to inf for very negative g, giving -0 * u.
__device__ __forceinline__ float silu_mul(float g, float u) { return g / (1.0f + expf(-g)) * u; }

// bf16 pairs in a 32-bit word -> floats (exact widening).
__device__ __forceinline__ float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

// Where slot j of token t goes: the dispatch's route_row in global memory (the default), or a
// caller's own lookup with the same signature (the fused dispatch+quantise kernel computes rows
// from its shared-memory layout).
struct RowsFromRouteRow {
  __device__ __forceinline__ int32_t operator()(const QuantGatherParams& p, uint32_t t, int j) const {
    return __ldcg(p.route_row + int64_t(t) * p.topk + j);
  }
};

// Before the caller's PDL wait: asks L2 for the hidden values of the units its first pass over
// (warp, as in quant_gather_body) will load, so that pass waits on L2 rather than HBM.
__device__ __forceinline__ void prefetch_first_units(const QuantGatherParams& p, uint64_t warp) {
  const int H = p.hidden_dim, sub = int(threadIdx.x & 31u) & (kLanesPerUnit - 1);
  const uint32_t groups = uint32_t(H + 127) / 128u;
  const uint64_t unit = warp * kUnitsPerWarp + (threadIdx.x & 31u) / kLanesPerUnit;
  if (unit >= uint64_t(p.tokens) * groups) return;
  const uint32_t t = uint32_t(unit / groups), g = uint32_t(unit - uint64_t(t) * groups);
  const uint32_t c = g * kLanesPerUnit + uint32_t(sub);  // this lane's 16-element chunk
  if (c >= uint32_t(H) / 16u) return;
  if (p.codes)
    ptx::prefetch_l2(p.codes + int64_t(t) * H + int64_t(c) * 16);
  else
    ptx::prefetch_l2(p.hidden + int64_t(t) * H + int64_t(c) * 16);
}

// One octet's (token, group) unit of a warp pass, quantised: its 16 codes and the group's scale.
struct UnitCodes {
  uint4 codes;
  float scale;
};

// Quantises this lane's 16 values of a 128-group spread over an octet (inactive lanes hold zeros,
// which give amax 0). Every lane of the warp must call it (octet shuffles). kBf16Values: every x
// is a bf16 value, for which the group's reciprocal and one correction give the IEEE quotient's
// code (scale_divide.hpp); any other fp32 x (the ffn intermediate) is divided (__fdiv_rn).
template <bool kBf16Values>
__device__ __forceinline__ UnitCodes quantize_values(float (&x)[16]) {
  // A tree of fmaxf over |x| (one FMNMX each, depth 4; the comparisons took two ALU instructions
  // each in a chain of 16, and the route + quantise launch keeps that pipe ~65 % busy). The device's
  // max returns the other operand for any NaN, quiet or signalling (bf16 0x7f81 included; unlike
  // glibc's fmaxf, which the host reference avoids), so a NaN is skipped unless both operands are
  // NaN; the final max with 0 turns an all-NaN lane into 0, as the reference's comparisons do.
  float m[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) m[i] = fmaxf(fabsf(x[i]), fabsf(x[i + 8]));
#pragma unroll
  for (int w = 4; w > 0; w /= 2)
#pragma unroll
    for (int i = 0; i < w; ++i) m[i] = fmaxf(m[i], m[i + w]);
  float amax = fmaxf(m[0], 0.0f);
  // Octet-wide max (no NaN left): xor offsets 4, 2, 1 stay inside the octet.
#pragma unroll
  for (int off = kLanesPerUnit / 2; off > 0; off /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
  UnitCodes u;
  u.scale = __fdiv_rn(fmaxf(amax, kScaleFloor), kE4M3MaxF);
  // x / scale needs no clamp to +-448 before the encoder: |x| <= amax puts it within an fp32 ulp of
  // 448 at most, and cvt's satfinite saturates that to 448 exactly as the reference's clamp does
  // (NaN stays NaN either way).
  if (kBf16Values && u.scale < INFINITY) {  // by the group's reciprocal (scale_divide.hpp)
    const float rcp = __frcp_rn(u.scale);
#pragma unroll
    for (int i = 0; i < 16; ++i) x[i] = divide_by_scale(x[i], u.scale, rcp);
  } else {  // fp32 values, or an infinite input (its group's codes are NaN and +-0): divide
#pragma unroll
    for (int i = 0; i < 16; ++i) x[i] = __fdiv_rn(x[i], u.scale);
  }
  uint32_t q[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) q[i] = e4m3x2(x[4 * i], x[4 * i + 1]) | (e4m3x2(x[4 * i + 2], x[4 * i + 3]) << 16);
  u.codes = make_uint4(q[0], q[1], q[2], q[3]);
  return u;
}

// Quantises this lane's 16 bf16 values (two 16-byte words; zeros for an inactive lane, which
// gives amax 0). Every lane of the warp must call it (octet shuffles).
__device__ __forceinline__ UnitCodes quantize_raw(uint4 raw0, uint4 raw1) {
  float x[16];
  const uint32_t w[8] = {raw0.x, raw0.y, raw0.z, raw0.w, raw1.x, raw1.y, raw1.z, raw1.w};
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    x[2 * i] = bf16_lo(w[i]);
    x[2 * i + 1] = bf16_hi(w[i]);
  }
  return quantize_values<true>(x);
}

// Loads and quantises this lane's 16 values of unit (t, c) (inactive lanes load nothing and give
// amax 0). Every lane of the warp must call it (octet shuffles).
__device__ __forceinline__ UnitCodes quantize_unit(const QuantGatherParams& p, uint32_t t, uint32_t c, bool active) {
  if (p.codes) {  // pre-quantised (warp-uniform): the unit's codes and its group's scale as given
    UnitCodes u{make_uint4(0u, 0u, 0u, 0u), 0.0f};
    if (active) u.codes = __ldcg(reinterpret_cast<const uint4*>(p.codes + int64_t(t) * p.hidden_dim) + c);
    // Every lane of the octet, active or past a partial group's end, stores the scale; a lane past
    // the last unit reads token 0's (unit_position gives it t = 0, c < 8), in bounds.
    u.scale = __ldcg(p.code_scales + int64_t(t) * ((p.hidden_dim + 127) / 128) + c / kLanesPerUnit);
    return u;
  }
  uint4 raw0 = make_uint4(0u, 0u, 0u, 0u), raw1 = raw0;
  if (active) {
    const uint4* src = reinterpret_cast<const uint4*>(p.hidden + int64_t(t) * p.hidden_dim) + 2 * c;
    raw0 = __ldcg(src);
    raw1 = __ldcg(src + 1);
  }
  return quantize_raw(raw0, raw1);
}

// This lane's unit of the pass starting at unit wbase: token t, group g, 16-element chunk c.
struct UnitPos {
  uint32_t t, g, c;
  bool unit_ok, active;
};
__device__ __forceinline__ UnitPos unit_position(const QuantGatherParams& p, uint64_t wbase) {
  const uint32_t groups = uint32_t(p.hidden_dim + 127) / 128u, chunks = uint32_t(p.hidden_dim) / 16u;
  const uint64_t units = uint64_t(p.tokens) * groups;
  const int lane = int(threadIdx.x & 31u), sub = lane & (kLanesPerUnit - 1);
  const uint64_t unit = wbase + uint64_t(lane / kLanesPerUnit);
  UnitPos u;
  u.unit_ok = unit < units;
  u.t = u.unit_ok ? uint32_t(unit / groups) : 0u;
  u.g = u.unit_ok ? uint32_t(unit - uint64_t(u.t) * groups) : 0u;
  u.c = u.g * kLanesPerUnit + uint32_t(sub);
  u.active = u.unit_ok && u.c < chunks;
  return u;
}

// Octet lane sub's 16 codes of a 128-byte group in A-fragment order: its words 4 sub + i go to
// fragment_word(4 sub + i) = 16 (sub / 4) + 4 i + sub % 4, so the octet's stores of each i fill
// two 16-byte pieces.
__device__ __forceinline__ void store_fragment_codes(uint8_t* group_bytes, uint4 codes) {
  const int sub = int(threadIdx.x & 31u) & (kLanesPerUnit - 1);
  uint32_t* group = reinterpret_cast<uint32_t*>(group_bytes) + 16 * (sub / 4) + sub % 4;
  group[0] = codes.x;
  group[4] = codes.y;
  group[8] = codes.z;
  group[12] = codes.w;
}

// Token order: this lane's 16 codes of unit u into row u.t, plain or in A-fragment order.
__device__ __forceinline__ void store_token_order_codes(const QuantGatherParams& p, const UnitPos& u, uint4 codes) {
  uint8_t* row = p.a_sorted + int64_t(u.t) * p.hidden_dim;
  if (p.fragment_order) {
    store_fragment_codes(row + int64_t(u.g) * 128, codes);
  } else {
    *reinterpret_cast<uint4*>(row + int64_t(u.c) * 16) = codes;
  }
}

// Before a PDL wait, in a kernel that is not the first of its chain (so the hidden rows' producer
// has completed): quantises the caller's first pass, which quant_gather_body then only scatters.
__device__ __forceinline__ UnitCodes quantize_first_pass(const QuantGatherParams& p, uint64_t warp) {
  const UnitPos u = unit_position(p, warp * kUnitsPerWarp);
  return quantize_unit(p, u.t, u.c, u.active);
}

// Clears the fast combine's fp32 output (flat: rows are contiguous) and the words to zero, if asked, with the threads
// [tid, tid + nth, ...) of the caller's grid.
__device__ __forceinline__ void clear_output(const QuantGatherParams& p, int64_t tid, int64_t nth) {
  if (p.zero_words != nullptr && tid < p.zero_word_count) p.zero_words[tid] = 0;
  if (p.zero_out == nullptr) return;
  const int64_t n = int64_t(p.tokens) * p.zero_cols;
  const int64_t n4 = n / 4;
  float4* z4 = reinterpret_cast<float4*>(p.zero_out);
  for (int64_t i = tid; i < n4; i += nth) z4[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  for (int64_t i = n4 * 4 + tid; i < n; i += nth) p.zero_out[i] = 0.0f;
}

// The whole stage for the warps [warp, warp + warps, ...) and threads [tid, tid + nth, ...) of the
// caller's grid (warps and threads counted globally).
template <class RowOf = RowsFromRouteRow>
__device__ __forceinline__ void quant_gather_body(const QuantGatherParams& p, uint64_t warp, uint64_t warps, int64_t tid,
                                                  int64_t nth, const RowOf& row_of = RowOf{},
                                                  const UnitCodes* first_pass = nullptr) {
  // Token order (no route_row): token t's codes go to row t alone, as if it had one slot.
  const bool token_order = p.route_row == nullptr;
  const int H = p.hidden_dim, k = token_order ? 1 : p.topk;
  const uint32_t groups = uint32_t(H + 127) / 128u;
  const uint64_t units = uint64_t(p.tokens) * groups;
  const int lane = int(threadIdx.x & 31u), sub = lane & (kLanesPerUnit - 1);
  const int octet_base = lane & ~(kLanesPerUnit - 1);

  // Warp-uniform trip count (wbase is the same for all 32 lanes), so the full-mask shuffles below
  // always see every lane.
  for (uint64_t wbase = warp * kUnitsPerWarp; wbase < units; wbase += warps * kUnitsPerWarp) {
    const UnitPos u = unit_position(p, wbase);
    const bool unit_ok = u.unit_ok, active = u.active;
    const uint32_t t = u.t, g = u.g, c = u.c;

    // ---- every load of this unit, issued together: the route rows (slots sub and 8 + sub) and,
    // unless the caller quantised this pass already, the hidden values ----
    int32_t row_a = -1, row_b = -1;
    if (unit_ok && sub < k) row_a = token_order ? int32_t(t) : row_of(p, t, sub);
    if (unit_ok && kLanesPerUnit + sub < k) row_b = row_of(p, t, kLanesPerUnit + sub);
    const bool precomputed = first_pass != nullptr && wbase == warp * kUnitsPerWarp;
    const UnitCodes q = precomputed ? *first_pass : quantize_unit(p, t, c, active);
    const float scale = q.scale;
    const uint4 codes = q.codes;

    // ---- scatter to the k sorted rows, 8 slots at a time ----
    for (int j0 = 0; j0 < k; j0 += kLanesPerUnit) {
      int32_t mine;
      if (j0 == 0)
        mine = row_a;
      else if (j0 == kLanesPerUnit)
        mine = row_b;
      else
        mine = (unit_ok && j0 + sub < k) ? row_of(p, t, j0 + sub) : -1;
      // Rows outside [0, R_pad) (dropped, or bad device data) are never written.
      if (mine < 0 || int64_t(mine) >= p.padded_rows) mine = -1;
      // Row quads: the warp's four octets are groups 4q..4q+3 of one token, so for each slot their
      // four scales fill one 16-byte piece of the row's quad.
      if (mine >= 0) p.a_scales[scale_index(p.scale_layout, g, mine, p.padded_rows)] = scale;
      const int n = min(kLanesPerUnit, k - j0);
      for (int jj = 0; jj < n; ++jj) {
        const int32_t row = __shfl_sync(0xffffffffu, mine, octet_base + jj);
        if (!active || row < 0) continue;
        if (token_order)
          store_token_order_codes(p, u, codes);
        else
          *reinterpret_cast<uint4*>(p.a_sorted + int64_t(row) * H + int64_t(c) * 16) = codes;
      }
    }
  }

  clear_output(p, tid, nth);
}

// Token order alone (no route_row; the fused route + quantise launch at large T). A warp item is
// kPasses passes of 4 groups of one token (a token's groups in items_per_token items); the warp
// issues all of an item's loads before any arithmetic, so a thread keeps 2 * kPasses 16-byte loads
// in flight (the one-pass loop above keeps 2). The warp walks its items by a (token, item) pair
// stepped without division (the unit walk divided in 64 bits per lane and pass): with quantize_raw's
// max tree, fewer instructions and a faster launch (journal, thirty-eighth session). Same codes,
// scales and clear as quant_gather_body
// with route_row = nullptr.
template <int kPasses>
__host__ __device__ constexpr uint32_t items_per_token(int hidden_dim) {
  return (uint32_t(hidden_dim + 127) / 128u + kUnitsPerWarp * kPasses - 1) / (kUnitsPerWarp * kPasses);
}

// A warp's place in the token-order walk: token t, item `item` of the token.
struct TokenItem {
  uint64_t t;
  uint32_t item;
};
// n / d and n % d, by a shift where d is a power of two (the preset's 2 items per token): a 64-bit
// division costs ~50 instructions, and most warps take one item.
__device__ __forceinline__ TokenItem split_items(uint64_t n, uint32_t d) {
  if ((d & (d - 1)) == 0) return TokenItem{n >> (__ffs(int(d)) - 1), uint32_t(n) & (d - 1)};
  return TokenItem{n / d, uint32_t(n % d)};
}
template <int kPasses>
__device__ __forceinline__ TokenItem first_token_item(const QuantGatherParams& p, uint64_t warp) {
  return split_items(warp, items_per_token<kPasses>(p.hidden_dim));
}

// This lane's unit of pass i of item (t, item).
template <int kPasses>
__device__ __forceinline__ UnitPos token_item_unit(const QuantGatherParams& p, const TokenItem& w, int i) {
  const uint32_t groups = uint32_t(p.hidden_dim + 127) / 128u, chunks = uint32_t(p.hidden_dim) / 16u;
  const int lane = int(threadIdx.x & 31u), sub = lane & (kLanesPerUnit - 1);
  UnitPos u;
  u.g = (w.item * kPasses + uint32_t(i)) * kUnitsPerWarp + uint32_t(lane / kLanesPerUnit);
  u.unit_ok = w.t < uint64_t(p.tokens) && u.g < groups;
  u.t = uint32_t(w.t);
  u.c = u.g * kLanesPerUnit + uint32_t(sub);
  u.active = u.unit_ok && u.c < chunks;
  return u;
}

// Before the caller's PDL wait: asks L2 for the hidden lines of the warp's first item (one lane
// per 128-byte line).
template <int kPasses>
__device__ __forceinline__ void prefetch_first_token_item(const QuantGatherParams& p, uint64_t warp) {
  const TokenItem w = first_token_item<kPasses>(p, warp);
#pragma unroll
  for (int i = 0; i < kPasses; ++i) {
    const UnitPos u = token_item_unit<kPasses>(p, w, i);
    if (u.active && (threadIdx.x & 3u) == 0) ptx::prefetch_l2(p.hidden + int64_t(u.t) * p.hidden_dim + int64_t(u.c) * 16);
  }
}

template <int kPasses>
__device__ __forceinline__ void quant_token_order_body(const QuantGatherParams& p, uint64_t warp, uint64_t warps,
                                                       int64_t tid, int64_t nth) {
  static_assert(kPasses >= 1 && kPasses <= 4, "2 * kPasses uint4 registers of loads per thread");
  const int H = p.hidden_dim;
  const uint32_t per_token = items_per_token<kPasses>(H);
  const int sub = int(threadIdx.x & 31u) & (kLanesPerUnit - 1);
  TokenItem w = first_token_item<kPasses>(p, warp);
  const TokenItem step = split_items(warps, per_token);
  // Warp-uniform trip count, as in quant_gather_body (the octet shuffles need every lane).
  while (w.t < uint64_t(p.tokens)) {
    UnitPos u[kPasses];
    uint4 raw0[kPasses], raw1[kPasses];
#pragma unroll
    for (int i = 0; i < kPasses; ++i) {
      u[i] = token_item_unit<kPasses>(p, w, i);
      raw0[i] = raw1[i] = make_uint4(0u, 0u, 0u, 0u);
      if (u[i].active) {
        const uint4* src = reinterpret_cast<const uint4*>(p.hidden + int64_t(u[i].t) * H) + 2 * u[i].c;
        raw0[i] = __ldcg(src);
        raw1[i] = __ldcg(src + 1);
      }
    }
#pragma unroll
    for (int i = 0; i < kPasses; ++i) {
      const UnitCodes q = quantize_raw(raw0[i], raw1[i]);
      if (u[i].unit_ok && sub == 0) p.a_scales[scale_index(p.scale_layout, u[i].g, u[i].t, p.padded_rows)] = q.scale;
      if (u[i].active) store_token_order_codes(p, u[i], q.codes);
    }
    w.t += step.t;
    w.item += step.item;
    if (w.item >= per_token) {
      w.item -= per_token;
      ++w.t;
    }
  }
  clear_output(p, tid, nth);
}

}  // namespace loom::quant_detail
