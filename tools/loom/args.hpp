// Command-line flags: `--name value`, `--name=value`, and boolean `--name`. Every flag must be
// known to the command; values are parsed strictly and errors name the flag.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace loom::cli {

class Args {
 public:
  // valued: flags that take a value; switches: flags that don't. Throws loom::Error on unknown
  // flags, a missing value, or a positional argument.
  Args(const std::vector<std::string>& argv, const std::set<std::string>& valued, const std::set<std::string>& switches);

  bool has(const std::string& name) const { return values_.count(name) != 0; }
  std::string str(const std::string& name, const std::string& fallback) const;
  int64_t integer(const std::string& name, int64_t fallback) const;
  double number(const std::string& name, double fallback) const;
  std::vector<int64_t> integer_list(const std::string& name) const;  // "1,8,32"

 private:
  std::map<std::string, std::string> values_;
};

int64_t parse_integer(const std::string& flag, const std::string& text);
double parse_number(const std::string& flag, const std::string& text);

}  // namespace loom::cli
