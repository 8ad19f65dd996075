// The device-side buffers of one layer run and what each kernel reads and writes. One convention,
// written down once; every kernel, launcher and test uses these names.
//
//   route      logits[T,E] (+bias[E])         -> topk_ids[T,k], topk_weights[T,k], nan_flags[T]
//                                                (+ token_masks[ceil(T/32),E] for dispatch+quantise)
//   dispatch   topk_ids, topk_weights, nan_flags -> offsets[E+1], route_row[T*k],
//                                                  row_token[R], row_weight[R], status
//                                                (several CTAs: a count kernel first, through
//                                                 slice_counts[ctas, E+1])
//   quantize   hidden[T,H] bf16 -> x, x_scales in one of two layouts (GemmFp8Config::x_source):
//                token order  x[T_pad,H] fp8, x_scales[ceil(H/128), T_pad]   (no route_row needed)
//                             or, for the register-loaded GEMM, x_scales[ceil(H/512), T_pad, 4]
//                sorted rows  x[R_pad,H] fp8, x_scales[ceil(H/128), R_pad]   (row route_row[t*k+j])
//                             or, for the hand-off GEMM, x_scales[ceil(H/512), R_pad, 4]
//                (the [.., 4] layouts: ScaleLayout::row_quads)
//              and zeroes out[T,N] (the fast combine accumulates into it)
//   gemm       x, x_scales, offsets, row_token, row_weight, weights; gathers a sorted row's
//              activations by row_token (token order) or reads them in place (sorted rows)
//                -> fast: out[T,N] += w * (x . W^T) (atomic vector reductions)
//                -> deterministic: y[R,N] = w * (x . W^T) (plain stores, no atomics)
//   combine    y, route_row (deterministic only) -> out[t,:] = sum over slots j, in order, of y[route_row[t,j],:]
//   bins       (instead of dispatch: routes from logits, register-loaded GEMM, fast combine) a clear
//              kernel zeroes bin_counts and status; the routing appends each route to its expert's
//              bin: bin_counts[e * kBinCountStride] rows, bin_token / bin_weight[e * stride + slot]
//              in atomic order; the GEMM reads them in place of offsets / row_token / row_weight
//
// Launches (moe_pipeline.cpp, Chain): route+quantise share a launch, or route+dispatch+quantise for
// small softmax batches, or dispatch+quantise share one after the routing.
//
// R = T*k (compact routed rows; the rows of expert e are [offsets[e], offsets[e+1]), stable order:
// ascending token, then slot). X_pad = X rounded up to a multiple of 4 (16-byte scale rows for TMA).
#pragma once

#include <cstdint>

#include "loom/status.hpp"  // LayerStatus: written by the dispatch kernel every run (plain stores)
#include "loom/types.hpp"   // kGpuMaxExperts: every per-expert table below and in the stages

namespace loom {

// int32 words from one expert's bin counter to the next: a 128-byte line each. The routing's
// returning atomics on counters that share a line queue at one L2 slice.
inline constexpr int kBinCountStride = 32;

inline constexpr int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }
inline constexpr int64_t padded_rows(int64_t routes) { return round_up(routes, 4); }

// The activation rows' layout the quantiser writes and the GEMM reads.
//  gather_by_token: token order, one row per token (the GEMM gathers a sorted row's activations by
//                   row_token); no route_row needed, so small batches have one kernel before the GEMM.
//  sorted_rows:     one row per route in expert-sorted order (row route_row[t * k + j]), read by TMA.
//  token_fragments: token order with each 128-byte group's words in wgmma A-fragment order
//                   (fragment_word), for the tokens-on-M GEMM.
//  sorted_fragments: expert-sorted rows in A-fragment order (the ffn intermediate, which the
//                   SiLU·mul kernel writes), for the tokens-on-M GEMM reading rows by sorted index.
enum class XSource { gather_by_token, sorted_rows, token_fragments, sorted_fragments };

// The activation scales' layout (G = ceil(H/128) groups of 128, `rows` a multiple of 4):
//  group_major: [G, rows], group g's scales of consecutive rows side by side: a GEMM stage reads
//               one group of its chunk's rows as one TMA box.
//  row_quads:   [ceil(G/4), rows, 4], a row's groups 4q..4q+3 side by side (sorted rows only): a
//               route's four groups of one quad, which one warp quantises, go out as one 16-byte
//               store instead of four scattered 4-byte ones; the GEMM loads a 4-group box and
//               picks its group (journal, tenth session).
enum class ScaleLayout { group_major, row_quads };
inline constexpr int64_t scale_index(ScaleLayout layout, int64_t group, int64_t row, int64_t rows) {
  return layout == ScaleLayout::group_major ? group * rows + row : (group / 4 * rows + row) * 4 + group % 4;
}
// Token-order codes for the GEMM that loads its activations into registers (XSource::
// token_fragments): inside each 128-byte group the 32 four-byte words are permuted so that each
// lane of a wgmma A-fragment quad (q = lane % 4) reads its fragment bytes as two 16-byte loads, and
// the quad's first loads cover the group's first 64 bytes, its second loads the last 64 (each
// 32-byte sector read once). Word w of the plain row (bytes 4w..4w+3: k32 step s = w / 8, half
// h = w / 4 % 2, quad lane q = w % 4) sits at 16 (s / 2) + 4q + 2 (s % 2) + h.
inline constexpr int fragment_word(int w) { return 16 * (w / 16) + 4 * (w % 4) + 2 * (w / 8 % 2) + w / 4 % 2; }
static_assert(fragment_word(0) == 0 && fragment_word(4) == 1 && fragment_word(8) == 2 && fragment_word(12) == 3 &&
                  fragment_word(1) == 4 && fragment_word(16) == 16 && fragment_word(31) == 31,
              "quad lane q's words: steps 0-1 at 4q .. 4q + 3, steps 2-3 at 16 + 4q .. 16 + 4q + 3");

// Early expert ids (the fused small-batch kernel, T * k <= kEarlyIdWords routes, one routing CTA):
// word t * k + j is kEarlyIdValid | (id + 1) of route (t, j) (low bits 0: no expert), stored as
// soon as token t is ranked. The same kernel clears the words after its PDL wait and before it lets
// the GEMM launch, so the GEMM, which spins on them before its own PDL wait, sees this run's ids or
// none: its weight loads then start while the layout and the quantised rows are still being written.
inline constexpr int kEarlyIdWords = 32;
inline constexpr uint32_t kEarlyIdValid = 1u << 31;
inline constexpr uint32_t kEarlyIdMask = 0x3ffu;
static_assert(kGpuMaxExperts + 1 <= kEarlyIdMask, "an early id word holds id + 1");

// Floats a scale buffer of `groups` x `rows` needs in either layout.
inline constexpr int64_t scale_floats(int64_t groups, int64_t rows) { return round_up(groups, 4) * rows; }

}  // namespace loom
