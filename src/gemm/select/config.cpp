#include "gemm/select/config.hpp"

#include <sstream>
#include <string>
#include <vector>

#include "gemm/gemm_fp8.hpp"
#include "loom/types.hpp"

namespace loom {

namespace {

const char* rows_name(WmRows r) {
  switch (r) {
    case WmRows::gather: return "gather";
    case WmRows::early: return "early";
    case WmRows::bins: return "bins";
    case WmRows::sorted: return "sorted";
  }
  return "?";
}

template <class... F>
struct Overloaded : F... {
  using F::operator()...;
};
template <class... F>
Overloaded(F...) -> Overloaded<F...>;

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> parts;
  std::string cur;
  for (const char ch : s) {
    if (ch == '.') {
      parts.push_back(cur);
      cur.clear();
    } else {
      cur += ch;
    }
  }
  parts.push_back(cur);
  return parts;
}

}  // namespace

int WeightsOnMConfig::stages() const {
  if (rows != WmRows::sorted) return kStagesGathered;
  return handoff ? kStagesHandoff : kStagesInline;
}

std::string key(const GemmConfig& config) {
  return std::visit(Overloaded{
                        [](const WeightsOnMConfig& c) {
                          std::string k = std::string("wM.") + rows_name(c.rows) + ".s" + std::to_string(c.stages()) +
                                          (c.handoff ? ".ho" : "") + (c.store ? ".store" : ".red") +
                                          (c.dense ? ".dense" : ".compact");
                          if (c.balanced) k += ".bal";
                          if (c.split_k > 1) k += ".k" + std::to_string(c.split_k);
                          if (c.dynamic) k += ".dyn";
                          if (c.weights_evict_first) k += ".efw";
                          if (c.x_evict_first) k += ".exf";
                          if (c.warm_up) k += ".warm";
                          return k;
                        },
                        [](const ResidentConfig& c) {
                          return std::string("wM.res.s5.bulk") + (c.dynamic ? ".dyn" : ".rr") +
                                 (c.weights_evict_first ? ".efw" : "");
                        },
                        [](const TokensOnMConfig& c) {
                          return std::string("tM.") + (c.wide ? "wide" : "tall") + (c.sorted ? ".sorted" : "") + ".s4" +
                                 (c.act ? ".act" : c.store ? ".store" : ".bulk") +
                                 (c.dynamic ? ".dyn" : ".rr") + (c.weights_evict_first ? ".efw" : "") +
                                 (c.x_evict_last ? ".exl" : "");
                        }},
                    config);
}

GemmConfig parse_gemm_key(const std::string& text) {
  const std::vector<std::string> t = split(text);
  auto bad = [&](const std::string& why) -> Error {
    return Error("GEMM config '" + text + "': " + why +
                 " (keys read wM.<gather|early|bins|sorted>.s<N>[.ho].<red|store>.<dense|compact>[.bal|.k<N>][.dyn]"
                 "[.efw][.exf][.warm], wM.res.s5.bulk.<dyn|rr>[.efw], tM.<tall|wide>[.sorted].s4.<bulk|store|act>.<dyn|rr>"
                 "[.efw][.exl])");
  };
  size_t i = 0;
  auto next = [&]() -> const std::string& {
    if (i >= t.size()) throw bad("ends early");
    return t[i++];
  };
  GemmConfig result;
  const std::string family = next();
  if (family == "wM") {
    const std::string rows = next();
    if (rows == "res") {
      ResidentConfig c;
      if (next() != "s5") throw bad("the resident-rows kernel has 5 stages");
      if (next() != "bulk") throw bad("the resident-rows kernel combines by bulk reductions ('bulk')");
      const std::string walk = next();
      if (walk != "dyn" && walk != "rr") throw bad("expected dyn or rr, got '" + walk + "'");
      c.dynamic = walk == "dyn";
      for (; i < t.size(); ++i) {
        if (t[i] == "efw") c.weights_evict_first = true;
        else throw bad("unknown option '" + t[i] + "'");
      }
      result = c;
    } else {
      WeightsOnMConfig c;
      if (rows == "gather") c.rows = WmRows::gather;
      else if (rows == "early") c.rows = WmRows::early;
      else if (rows == "bins") c.rows = WmRows::bins;
      else if (rows == "sorted") c.rows = WmRows::sorted;
      else throw bad("unknown rows '" + rows + "'");
      const std::string stages = next();
      std::string epi = next();
      if (epi == "ho") {
        c.handoff = true;
        epi = next();
      }
      if (epi != "red" && epi != "store") throw bad("expected red or store, got '" + epi + "'");
      c.store = epi == "store";
      if (stages != "s" + std::to_string(c.stages()))
        throw bad("this kernel has " + std::to_string(c.stages()) + " stages, not '" + stages + "'");
      const std::string walk = next();
      if (walk != "dense" && walk != "compact") throw bad("expected dense or compact, got '" + walk + "'");
      c.dense = walk == "dense";
      for (; i < t.size(); ++i) {
        const std::string& o = t[i];
        if (o == "bal") c.balanced = true;
        else if (o == "dyn") c.dynamic = true;
        else if (o == "efw") c.weights_evict_first = true;
        else if (o == "exf") c.x_evict_first = true;
        else if (o == "warm") c.warm_up = true;
        else if (o.size() > 1 && o[0] == 'k' && o.find_first_not_of("0123456789", 1) == std::string::npos &&
                 o.size() < 4)
          c.split_k = std::stoi(o.substr(1));
        else throw bad("unknown option '" + o + "'");
      }
      result = c;
    }
  } else if (family == "tM") {
    TokensOnMConfig c;
    const std::string tile = next();
    if (tile != "tall" && tile != "wide") throw bad("expected tall or wide, got '" + tile + "'");
    c.wide = tile == "wide";
    std::string stages = next();
    if (stages == "sorted") {
      c.sorted = true;
      stages = next();
    }
    if (stages != "s4") throw bad("the tokens-on-M kernels have 4 stages");
    const std::string epi = next();
    if (epi != "bulk" && epi != "store" && epi != "act") throw bad("expected bulk, store or act, got '" + epi + "'");
    c.store = epi == "store";
    c.act = epi == "act";
    const std::string walk = next();
    if (walk != "dyn" && walk != "rr") throw bad("expected dyn or rr, got '" + walk + "'");
    c.dynamic = walk == "dyn";
    for (; i < t.size(); ++i) {
      if (t[i] == "efw") c.weights_evict_first = true;
      else if (t[i] == "exl") c.x_evict_last = true;
      else throw bad("unknown option '" + t[i] + "'");
    }
    result = c;
  } else {
    throw bad("unknown family '" + family + "' (wM or tM)");
  }
  try {
    validate(result);
  } catch (const Error& e) {
    throw bad(e.what());
  }
  return result;
}

void validate(const GemmConfig& config) {
  if (const auto* c = std::get_if<WeightsOnMConfig>(&config)) {
    const bool sorted = c->rows == WmRows::sorted;
    if (c->handoff && !sorted) throw Error("the hand-off epilogue needs sorted rows (gathering takes every producer thread)");
    if (c->dynamic && !sorted) throw Error("the dynamic tail is the sorted-rows kernel's");
    if (c->x_evict_first && !sorted) throw Error("the activation eviction hint is for sorted rows (TMA)");
    if (c->warm_up && sorted) throw Error("the warm-up is the gathering kernels'");
    if (c->split_k < 1 || c->split_k > 64) throw Error("split_k must be in [1, 64]");
    if ((c->split_k > 1 || c->balanced) && c->store) throw Error("split K and balanced shares need the red combine");
    if (c->split_k > 1 && c->balanced) throw Error("split K and balanced shares are two walks");
    if (c->balanced && c->dynamic) throw Error("balanced shares and the queue tail are two walks");
    if (c->rows == WmRows::bins && (c->store || c->dense || c->split_k > 1))
      throw Error("the chunk walk over expert bins is compact, red, without split K");
    if (c->rows == WmRows::early && c->dense) throw Error("early ids serve a compact walk");
  }
  if (const auto* c = std::get_if<TokensOnMConfig>(&config)) {
    if (c->act && (!c->wide || c->sorted))
      throw Error("the SiLU*up epilogue takes wide tiles (a gate block and its up block) of token-order rows");
  }
}

void check_shape(const GemmConfig& config, int64_t n, int64_t k, int64_t experts, int64_t max_tokens) {
  const std::string who = "GEMM config " + key(config) + ": ";
  if (n <= 0 || k <= 0 || n % 16 || k % 16)
    throw Error(who + "N and K must be positive multiples of 16 (got N=" + std::to_string(n) + ", K=" + std::to_string(k) +
                ")");
  if (experts > kGpuMaxExperts) throw Error(who + "at most " + std::to_string(kGpuMaxExperts) + " experts");
  if (std::holds_alternative<ResidentConfig>(config) && resident_rows_capacity(n, k) == 0)
    throw Error(who + "the resident-rows kernel cannot hold 16 rows of K=" + std::to_string(k) + " (N=" +
                std::to_string(n) + ") in shared memory");
  if (const auto* c = std::get_if<TokensOnMConfig>(&config)) {
    if (k % kFp8BlockK || k < kRegsRing * kFp8BlockK || k > kRegsMaxK)
      throw Error(who + "the tokens-on-M kernels take K a multiple of 128 in [" + std::to_string(kRegsRing * kFp8BlockK) +
                  ", " + std::to_string(kRegsMaxK) + "], got " + std::to_string(k));
    if (c->wide && k % (2 * kFp8BlockK)) throw Error(who + "wide tiles take K a multiple of 256, got " + std::to_string(k));
    if (max_tokens * k >= (int64_t(1) << 31))
      throw Error(who + "the tokens-on-M kernels address T x K below 2^31 (T=" + std::to_string(max_tokens) + ")");
  }
}

std::string describe(const GemmConfig& config) {
  return std::visit(
      Overloaded{
          [](const WeightsOnMConfig& c) {
            std::ostringstream o;
            o << "weights on M: 128 weight rows x an expert's rows in {16..128}-wide chunks, ";
            switch (c.rows) {
              case WmRows::gather: o << "rows gathered by token (cp.async, chunks of at most 32)"; break;
              case WmRows::early: o << "rows gathered by token, the experts from the routes' early ids"; break;
              case WmRows::bins: o << "rows gathered by token from expert bins (the chunk walk)"; break;
              case WmRows::sorted: o << "expert-sorted rows by TMA"; break;
            }
            o << ", " << c.stages() << " stages, " << (c.dense ? "dense" : "compact") << " walk";
            if (c.balanced) o << ", balanced shares of (unit, K block)";
            if (c.split_k > 1) o << ", split K " << c.split_k;
            if (c.dynamic) o << ", last round from the queue";
            o << ", epilogue " << (c.handoff ? "handed to the producer's spare warps" : "in the consumers") << " ("
              << (c.store ? "route rows" : "red.v4 into the output") << ")";
            if (c.weights_evict_first) o << ", weights L2 evict-first";
            if (c.x_evict_first) o << ", activations L2 evict-first";
            if (c.warm_up) o << ", instruction-cache warm-up before the PDL wait";
            return o.str();
          },
          [](const ResidentConfig& c) {
            return std::string("weights on M, an expert's rows (chunks of up to 48) resident in shared memory over "
                               "all of K, 5 stages, ") +
                   (c.dynamic ? "units past the first round from the queue" : "round robin") +
                   ", combine by bulk reductions" + (c.weights_evict_first ? ", weights L2 evict-first" : "");
          },
          [](const TokensOnMConfig& c) {
            return std::string("tokens on M: ") +
                   (c.wide ? "64 rows x 256 weight rows" : "128 rows x 128 weight rows") +
                   " tiles, A fragments" + (c.sorted ? " of expert-sorted rows" : "") +
                   " from a shared-memory ring, 4 stages, " +
                   (c.dynamic ? "last round from the queue" : "round robin") + ", " +
                   (c.act ? "SiLU(gate)*up requantised into the ffn intermediate (gate and up blocks per tile)"
                    : c.store ? "route rows stored"
                              : "combine by bulk reductions") +
                   (c.weights_evict_first ? ", weights L2 evict-first" : "") +
                   (c.x_evict_last ? ", activation rows L2 evict-last" : "");
          }},
      config);
}

XSource x_source(const GemmConfig& config) {
  if (const auto* c = std::get_if<TokensOnMConfig>(&config))
    return c->sorted ? XSource::sorted_fragments : XSource::token_fragments;
  if (const auto* c = std::get_if<WeightsOnMConfig>(&config); c && c->rows == WmRows::sorted)
    return XSource::sorted_rows;
  return XSource::gather_by_token;
}

ScaleLayout scale_layout(const GemmConfig& config) {
  if (std::holds_alternative<TokensOnMConfig>(config)) return ScaleLayout::row_quads;
  if (const auto* c = std::get_if<WeightsOnMConfig>(&config); c && c->handoff) return ScaleLayout::row_quads;
  return ScaleLayout::group_major;
}

bool uses_work_queue(const GemmConfig& config) {
  return std::visit([](const auto& c) { return c.dynamic; }, config);
}

bool fused_act(const GemmConfig& config) {
  const auto* c = std::get_if<TokensOnMConfig>(&config);
  return c && c->act;
}

bool combine_stores_rows(const GemmConfig& config) {
  if (const auto* c = std::get_if<WeightsOnMConfig>(&config)) return c->store;
  if (const auto* c = std::get_if<TokensOnMConfig>(&config)) return c->store;
  return false;
}

}  // namespace loom
