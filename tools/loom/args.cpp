#include "args.hpp"

#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "loom/types.hpp"

namespace loom::cli {

Args::Args(const std::vector<std::string>& argv, const std::set<std::string>& valued,
           const std::set<std::string>& switches) {
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (a.rfind("--", 0) != 0) throw Error("unexpected argument '" + a + "'");
    std::string name = a.substr(2), value;
    const size_t eq = name.find('=');
    const bool inline_value = eq != std::string::npos;
    if (inline_value) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    if (valued.count(name)) {
      if (!inline_value) {
        if (i + 1 >= argv.size()) throw Error("--" + name + " needs a value");
        value = argv[++i];
      }
    } else if (switches.count(name)) {
      if (inline_value) throw Error("--" + name + " takes no value");
      value = "1";
    } else {
      throw Error("unknown option '--" + name + "' (see `loom help`)");
    }
    values_[name] = value;
  }
}

std::string Args::str(const std::string& name, const std::string& fallback) const {
  auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second;
}

int64_t parse_integer(const std::string& flag, const std::string& text) {
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno == ERANGE)
    throw Error("--" + flag + " expects an integer, got '" + text + "'");
  return v;
}

double parse_number(const std::string& flag, const std::string& text) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !std::isfinite(v))
    throw Error("--" + flag + " expects a number, got '" + text + "'");
  return v;
}

int64_t Args::integer(const std::string& name, int64_t fallback) const {
  return has(name) ? parse_integer(name, str(name, "")) : fallback;
}

double Args::number(const std::string& name, double fallback) const {
  return has(name) ? parse_number(name, str(name, "")) : fallback;
}

std::vector<int64_t> Args::integer_list(const std::string& name) const {
  std::vector<int64_t> out;
  const std::string s = str(name, "");
  size_t start = 0;
  while (start <= s.size()) {
    const size_t comma = s.find(',', start);
    const std::string item = s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    out.push_back(parse_integer(name, item));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

}  // namespace loom::cli
