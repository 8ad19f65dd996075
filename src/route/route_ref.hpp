// CPU reference of routing: scores -> top-k experts and their weights, computed in double.
//
// softmax: l' = softcap > 0 ? softcap * tanh(l / softcap) : l; p = softmax(l') over all E experts.
//          The k largest p are chosen (rank by the raw logit, which orders the same way since
//          tanh and exp are increasing; ties: the lower expert id wins).
// sigmoid: s = sigmoid(l); b = s + bias[e]. Experts form n_group equal groups; a group's score is
//          the sum of its two best b (its one b when a group has one expert); the topk_group best
//          groups survive (ties: lower group id); the k largest b among their experts are chosen
//          (ties: lower expert id). Weights are the unbiased s of the chosen experts.
// Both:    optional renormalisation (w /= sum w), then w *= scale.
// Slot order: slot 0 is the best expert, descending by rank.
// NaN logits rank below every number (also below -inf) and score 0 probability (softmax) or
// sigmoid 0 (sigmoid); a token whose chosen weights sum to 0 keeps weights 0 after renormalisation
// (never NaN). Softmax: -inf gives probability 0, +inf logits share the mass equally, and a row with
// no logit above -inf gets weights 0. Sigmoid: s = 1 / (1 + exp(-x)); a NaN logit or NaN bias makes
// the biased score NaN (ranked last); a group whose two best include a NaN scores NaN and ranks
// after every scored group.
#pragma once

#include <cstdint>
#include <vector>

#include "loom/types.hpp"

namespace loom {

struct TopK {
  int64_t tokens = 0;
  int64_t topk = 0;
  std::vector<int32_t> ids;    // [T, k], k distinct experts per token
  std::vector<float> weights;  // [T, k]
};

// logits: [T, E] fp32. bias: [E], sigmoid scoring only (nullptr = zeros).
TopK route_ref(const float* logits, int64_t tokens, int64_t experts, int64_t topk, const Routing& routing,
               const float* bias = nullptr);

// Number of tokens with at least one NaN logit.
int64_t count_nan_tokens(const float* logits, int64_t tokens, int64_t experts);

}  // namespace loom
