// Deterministic workloads: shapes by preset or flags, expert-load distributions, inputs and weights
// generated from a seed (same seed, same bytes, whatever the thread count).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/bf16.hpp"
#include "loom/types.hpp"
#include "pipeline/layer_ref.hpp"
#include "route/route_ref.hpp"

namespace loom {

struct Preset {
  std::string name;
  Shape shape;
  Routing routing;
  std::string note;
};
const std::vector<Preset>& presets();
// Throws Error("unknown preset 'x' (known: a, b, c)").
const Preset& find_preset(const std::string& name);

// How routes spread over experts.
//   random        router logits drawn at random, routed by route_ref
//   balanced      per-expert route counts differ by at most 1
//   zipf:S        each token draws k distinct experts without replacement, P(e) ~ rank(e)^-S
//   hot:P         one expert is chosen by round(P*T) tokens; the other routes spread evenly
//   concentrated  every token picks the same k experts
//   replay:FILE   per-expert route counts from a JSON file (docs/workloads.md)
enum class DistKind { random, balanced, zipf, hot, concentrated, replay };
struct Distribution {
  DistKind kind = DistKind::random;
  double param = 0;  // zipf exponent S or hot fraction P
  std::string file;  // replay
};
Distribution parse_distribution(const std::string& spec);  // throws Error
std::string to_string(const Distribution&);

// Per-expert route counts from a replay file; throws Error when a count is negative or exceeds T,
// the list's length is not E, or the counts do not sum to T*k.
std::vector<int32_t> read_replay_counts(const std::string& path, int64_t tokens, int64_t topk, int64_t experts);

// Routes of one batch of tokens.
struct Routes {
  TopK topk;                           // always filled
  std::vector<float> logits;           // [T, E], random distribution only
  std::vector<float> expert_bias;      // [E], sigmoid scoring with random distribution only
  std::vector<int32_t> target_counts;  // [E], what the distribution aimed at (balanced/hot/concentrated/replay)
};
// For every distribution but random, ids are emitted directly and weights are random positive
// numbers normalised to sum 1 per token (then times routing.scale).
Routes make_routes(const Shape& shape, const Routing& routing, const Distribution& dist, uint64_t seed);
// Router logits whose top-k under `routing` are the routes' ids (softmax scoring), for a
// distribution that emits ids, so that it can run through the routing kernel; the top-k (ids and
// weights) are then what the routing reference makes of them. No change when logits exist.
void route_from_logits(const Shape& shape, const Routing& routing, uint64_t seed, Routes& routes);

// hidden [T, H] bf16, random normal with a per-token magnitude.
std::vector<bf16> make_hidden(const Shape& shape, uint64_t seed);

// Expert weights for the shape's mode and dtype, random with a per-expert magnitude and a factor
// per 128x128 block, quantised by quantize_128x128_ref for fp8. Values uniform in the block's
// range, or normal (heavier tails: most codes far below the block's maximum, as trained weights).
enum class WeightValues { uniform, normal };
LayerWeights make_weights(const Shape& shape, uint64_t seed, WeightValues values = WeightValues::uniform);

// Realised per-expert counts of a routing, [E].
std::vector<int32_t> expert_counts(const TopK& topk, int64_t experts);

// Inclusion probability of each expert under zipf:S sampling of k distinct experts out of E,
// estimated by simulation with `samples` draws (for tests and for reporting the target).
std::vector<double> zipf_inclusion(int64_t experts, int64_t topk, double s, uint64_t seed, int64_t samples);

}  // namespace loom
