#include "bench/report.hpp"

#include <cstdio>
#include <fstream>
#include <sstream>

#include "common/json.hpp"

namespace loom::bench {

const Timed* Record::find(const std::string& name) const {
  for (const Timed& t : gpu)
    if (t.name == name) return &t;
  return nullptr;
}

const Stats* Record::headline() const {
  const Timed* t = find("e2e");
  return t && t->cold.valid() ? &t->cold : nullptr;
}

namespace {

void write_stats(json::Writer& w, const Stats& s) {
  w.begin_object();
  w.field("median_us", s.median_us).field("p10_us", s.p10_us).field("p90_us", s.p90_us);
  w.field("min_us", s.min_us).field("mean_us", s.mean_us).field("reps", s.reps).field("l2", s.l2);
  w.end_object();
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

}  // namespace

std::string to_json(const std::vector<Record>& records) {
  json::Writer w;
  w.begin_array();
  for (const Record& r : records) {
    w.begin_object();
    w.field("tool", "loom bench").field("commit", r.commit).field("preset", r.preset);
    w.key("device");
    if (r.device) {
      w.begin_object();
      w.field("name", r.device->name).field("sm_count", r.device->sm_count).field("l2_bytes", r.device->l2_bytes);
      w.field("cc", std::to_string(r.device->major) + "." + std::to_string(r.device->minor));
      w.field("clock_mhz", r.device->clock_mhz);
      w.end_object();
    } else {
      w.null();
    }
    w.key("shape").begin_object();
    w.field("tokens", r.shape.tokens).field("hidden", r.shape.hidden).field("inter", r.shape.inter);
    w.field("experts", r.shape.experts).field("topk", r.shape.topk);
    w.field("mode", to_string(r.shape.mode)).field("dtype", to_string(r.shape.dtype));
    w.end_object();
    w.field("routing", describe(r.routing)).field("distribution", r.distribution);
    w.field("seed", int64_t(r.seed)).field("path", r.path).field("config", r.config);
    w.field("gemm_config", r.gemm_config).field("launches", r.launches);
    w.key("metrics").begin_object();
    w.field("flops", r.work.flops).field("experts_hit", r.work.experts_hit);
    w.field("weight_bytes", r.work.weight_bytes).field("activation_bytes", r.work.activation_bytes);
    w.field("bytes", r.work.bytes()).field("glue_bytes", r.work.glue_bytes);
    w.end_object();
    w.key("timings").begin_object();
    for (const Timed& t : r.gpu) {
      w.key(t.name).begin_object();
      w.key("cold");
      write_stats(w, t.cold);
      w.key("warm");
      write_stats(w, t.warm);
      w.end_object();
    }
    w.end_object();
    if (r.cpu_reference_ms >= 0) w.field("cpu_reference_ms", r.cpu_reference_ms);
    if (r.check_overall >= 0) {
      w.key("check").begin_object();
      w.field("rel_err", r.check_overall).field("worst_row_rel_err", r.check_worst_row);
      w.end_object();
    }
    w.key("sol").begin_object();
    w.field("measured", r.sol.measured);
    if (r.sol.measured) {
      w.key("read").begin_object();
      w.key("stats");
      write_stats(w, r.sol.read);
      w.field("config", r.sol.read_config).field("bytes", r.sol.read_bytes);
      w.field("loads_median_us", r.sol.read_loads_us).field("bulk_median_us", r.sol.read_bulk_us);
      w.field("tb_per_s", double(r.sol.read_bytes) / (r.sol.read.median_us * 1e6));
      w.end_object();
      w.key("gemm").begin_object();
      w.key("stats");
      write_stats(w, r.sol.gemm);
      w.field("algo", r.sol.gemm_algo);
      w.field("tflops", r.work.flops / (r.sol.gemm.median_us * 1e6));
      w.end_object();
      w.field("floor_us", r.sol.floor_us()).field("bound", r.sol.bound());
    } else {
      w.field("why_not", r.sol.why_not);
    }
    w.end_object();
    w.key("derived").begin_object();
    if (const Stats* h = r.headline()) {
      const double us = h->median_us;
      w.field("tflops", r.work.flops / (us * 1e6)).field("tb_per_s", double(r.work.bytes()) / (us * 1e6));
      w.field("mfu", r.work.flops / (us * 1e6) / peak_tflops(r.shape.dtype));
      if (r.sol.measured) w.field("time_over_floor", us / r.sol.floor_us());
    }
    w.end_object();
    w.field("note", r.note);
    w.end_object();
  }
  w.end_array();
  return w.str() + "\n";
}

std::string to_csv(const std::vector<Record>& records) {
  std::ostringstream o;
  o << "preset,tokens,hidden,inter,experts,topk,mode,dtype,distribution,seed,path,commit,device,experts_hit,flops,"
       "bytes,e2e_median_us,e2e_p10_us,e2e_p90_us,e2e_warm_median_us,gemm_median_us,cpu_reference_ms,"
       "sol_read_us,sol_gemm_us,floor_us,time_over_floor,tflops,tb_per_s,mfu,rel_err,worst_row_rel_err,gemm_config\n";
  for (const Record& r : records) {
    const Stats* h = r.headline();
    const Timed* e2e = r.find("e2e");
    const Timed* gemm = r.find("gemm");
    auto num = [&](bool ok, double v) { return ok ? fmt("%.4f", v) : std::string(); };
    const bool floor_ok = h && r.sol.measured;
    o << r.preset << ',' << r.shape.tokens << ',' << r.shape.hidden << ',' << r.shape.inter << ','
      << r.shape.experts << ',' << r.shape.topk << ',' << to_string(r.shape.mode) << ','
      << to_string(r.shape.dtype) << ',' << r.distribution << ',' << r.seed << ',' << r.path << ',' << r.commit
      << ',' << (r.device ? r.device->name : "") << ',' << r.work.experts_hit << ',' << fmt("%.6g", r.work.flops)
      << ',' << r.work.bytes() << ',' << num(h, h ? h->median_us : 0) << ',' << num(h, h ? h->p10_us : 0) << ','
      << num(h, h ? h->p90_us : 0) << ',' << num(e2e && e2e->warm.valid(), e2e ? e2e->warm.median_us : 0) << ','
      << num(gemm && gemm->cold.valid(), gemm ? gemm->cold.median_us : 0) << ','
      << num(r.cpu_reference_ms >= 0, r.cpu_reference_ms) << ','
      << num(r.sol.measured, r.sol.read.median_us) << ',' << num(r.sol.measured, r.sol.gemm.median_us) << ','
      << num(r.sol.measured, r.sol.floor_us()) << ',' << num(floor_ok, floor_ok ? h->median_us / r.sol.floor_us() : 0)
      << ',' << num(h, h ? r.work.flops / (h->median_us * 1e6) : 0) << ','
      << num(h, h ? double(r.work.bytes()) / (h->median_us * 1e6) : 0) << ','
      << num(h, h ? r.work.flops / (h->median_us * 1e6) / peak_tflops(r.shape.dtype) : 0) << ','
      << num(r.check_overall >= 0, r.check_overall) << ',' << num(r.check_worst_row >= 0, r.check_worst_row) << ','
      << r.gemm_config << '\n';
  }
  return o.str();
}

std::string to_table(const std::vector<Record>& records) {
  std::ostringstream o;
  if (records.empty()) return "no measurements\n";
  const Record& f = records.front();
  o << "loom bench: " << (f.preset.empty() ? "custom shape" : f.preset) << ", " << describe(f.shape) << ", "
    << describe(f.routing) << ", dist " << f.distribution << ", commit " << f.commit << "\n";
  if (f.device)
    o << "device: " << f.device->name << ", " << f.device->sm_count << " SMs, L2 " << (f.device->l2_bytes >> 20)
      << " MiB\n";
  else
    o << "device: none (" << f.sol.why_not << ")\n";
  o << "times in us, median of graph replays with cold L2 [p10, p90]; floor = max(SoL read, SoL GEMM) of the same run\n";
  char line[512];
  std::snprintf(line, sizeof line, "%6s %5s %-26s %9s %9s %9s %9s %9s %8s %8s %7s %6s %6s %8s\n", "T", "hit", "loom",
                "warm", "gemm", "glue", "SoL-read", "SoL-gemm", "floor", "t/floor", "TFLOP/s", "TB/s", "MFU", "rel-err");
  o << line;
  for (const Record& r : records) {
    const Stats* h = r.headline();
    std::string loom_col;
    if (h) {
      loom_col = fmt("%.1f", h->median_us) + " [" + fmt("%.1f", h->p10_us) + ", " + fmt("%.1f", h->p90_us) + "]";
    } else if (r.cpu_reference_ms >= 0) {
      loom_col = "CPU ref " + fmt("%.0f", r.cpu_reference_ms) + " ms (not GPU)";
    } else {
      loom_col = "-";
    }
    const Timed* e2e = r.find("e2e");
    const Timed* gemm = r.find("gemm");
    auto cell = [&](bool ok, const char* f2, double v) { return ok ? fmt(f2, v) : std::string("-"); };
    const bool has_gemm = gemm && gemm->cold.valid();
    std::snprintf(
        line, sizeof line, "%6lld %5lld %-26s %9s %9s %9s %9s %9s %8s %8s %7s %6s %6s %8s\n",
        (long long)r.shape.tokens, (long long)r.work.experts_hit, loom_col.c_str(),
        cell(e2e && e2e->warm.valid(), "%.1f", e2e ? e2e->warm.median_us : 0).c_str(),
        cell(has_gemm, "%.1f", has_gemm ? gemm->cold.median_us : 0).c_str(),
        cell(h && has_gemm, "%.1f", h && has_gemm ? h->median_us - gemm->cold.median_us : 0).c_str(),
        cell(r.sol.measured, "%.1f", r.sol.read.median_us).c_str(),
        cell(r.sol.measured, "%.1f", r.sol.gemm.median_us).c_str(), cell(r.sol.measured, "%.1f", r.sol.floor_us()).c_str(),
        cell(h && r.sol.measured, "%.3f", h && r.sol.measured ? h->median_us / r.sol.floor_us() : 0).c_str(),
        cell(h != nullptr, "%.1f", h ? r.work.flops / (h->median_us * 1e6) : 0).c_str(),
        cell(h != nullptr, "%.2f", h ? double(r.work.bytes()) / (h->median_us * 1e6) : 0).c_str(),
        cell(h != nullptr, "%.3f", h ? r.work.flops / (h->median_us * 1e6) / peak_tflops(r.shape.dtype) : 0).c_str(),
        cell(r.check_overall >= 0, "%.1e", r.check_overall).c_str());
    o << line;
  }
  for (const Record& r : records) {
    std::string parts;
    for (const char* name : {"route", "route+quant", "route+dispatch", "route+dispatch+quant", "clear+route+quant+bins",
                             "dispatch", "dispatch+quant", "quant", "glue_chain"})
      if (const Timed* t = r.find(name)) parts += std::string(parts.empty() ? "" : ", ") + name + " " + fmt("%.1f", t->cold.median_us);
    if (!parts.empty()) o << "stages alone (T=" << r.shape.tokens << ", us): " << parts << "\n";
    std::string ffn;
    for (const char* name : {"gemm1", "act", "gemm2", "out"})
      if (const Timed* t = r.find(name)) ffn += std::string(ffn.empty() ? "" : ", ") + name + " " + fmt("%.1f", t->cold.median_us);
    if (!ffn.empty()) o << "ffn stages alone (T=" << r.shape.tokens << ", us): " << ffn << "\n";
    const Timed *chain = r.find("glue_chain"), *copy = r.find("glue_copy");
    if (chain && copy)
      o << "glue (T=" << r.shape.tokens << "): " << fmt("%.2f", double(r.work.glue_bytes) / (1 << 20))
        << " MiB to move; the chain alone " << fmt("%.1f", chain->cold.median_us) << " us, a device copy of as many bytes "
        << fmt("%.1f", copy->cold.median_us) << " us: " << fmt("%.2f", chain->cold.median_us / copy->cold.median_us)
        << "x\n";
  }
  for (const Record& r : records)
    if (!r.launches.empty()) o << "launches (T=" << r.shape.tokens << "): " << r.launches << "\n";
  for (const Record& r : records)
    if (!r.note.empty()) o << "note (T=" << r.shape.tokens << "): " << r.note << "\n";
  return o.str();
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  if (!out) throw Error("cannot write '" + path + "'");
  out << text;
  if (!out) throw Error("error writing '" + path + "'");
}

}  // namespace loom::bench
