#include "dispatch/dispatch_ref.hpp"

#include <limits>
#include <string>

#include "loom/types.hpp"

namespace loom {

Dispatch dispatch_ref(const int32_t* ids, int64_t tokens, int64_t topk, int64_t experts) {
  constexpr int64_t kMaxIndex = std::numeric_limits<int32_t>::max();
  if (tokens < 0) throw Error("dispatch_ref: tokens must be >= 0, got " + std::to_string(tokens));
  if (topk <= 0) throw Error("dispatch_ref: topk must be positive, got " + std::to_string(topk));
  if (experts <= 0 || experts > kMaxIndex)
    throw Error("dispatch_ref: experts must be in [1, 2^31), got " + std::to_string(experts));
  // Rows and route indices are stored as int32.
  if (tokens > kMaxIndex / topk)
    throw Error("dispatch_ref: tokens * topk = " + std::to_string(tokens) + " * " + std::to_string(topk) +
                " does not fit in int32");
  const int64_t routes = tokens * topk;
  if (routes > 0 && !ids) throw Error("dispatch_ref: ids is null");

  auto kept = [experts](int32_t e) { return e >= 0 && int64_t(e) < experts; };

  Dispatch d;
  d.experts = experts;
  d.routes = routes;
  d.counts.assign(size_t(experts), 0);
  d.offsets.assign(size_t(experts + 1), 0);
  d.route_row.assign(size_t(routes), -1);

  for (int64_t r = 0; r < routes; ++r) {
    if (kept(ids[r]))
      ++d.counts[size_t(ids[r])];
    else
      ++d.dropped;
  }
  for (int64_t e = 0; e < experts; ++e) d.offsets[size_t(e + 1)] = d.offsets[size_t(e)] + d.counts[size_t(e)];

  // Visiting routes in index order r = t*k + j and filling each segment front to back is what
  // makes the sort stable: ascending token, then ascending slot, inside every expert.
  std::vector<int32_t> next_row(d.offsets.begin(), d.offsets.end() - 1);
  d.row_route.resize(size_t(d.offsets[size_t(experts)]));
  for (int64_t r = 0; r < routes; ++r) {
    if (!kept(ids[r])) continue;
    const int32_t row = next_row[size_t(ids[r])]++;
    d.route_row[size_t(r)] = row;
    d.row_route[size_t(row)] = int32_t(r);
  }
  return d;
}

std::vector<uint32_t> token_masks_ref(const int32_t* ids, int64_t tokens, int64_t topk, int64_t experts) {
  std::vector<uint32_t> masks(size_t((tokens + 31) / 32) * size_t(experts), 0u);
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t j = 0; j < topk; ++j) {
      const int32_t e = ids[t * topk + j];
      if (e >= 0 && e < experts) masks[size_t((t / 32) * experts + e)] |= 1u << (t % 32);
    }
  return masks;
}

std::vector<int32_t> hit_list_ref(const std::vector<int32_t>& offsets) {
  std::vector<int32_t> hits{0, 0, 0, 0};
  for (size_t e = 0; e + 1 < offsets.size(); ++e) {
    const int32_t first = offsets[e], rows = offsets[e + 1] - first;
    if (rows == 0) continue;
    ++hits[0];
    hits.insert(hits.end(), {int32_t(e), first, rows, 0});
  }
  return hits;
}

}  // namespace loom
