#include "common/json.hpp"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "loom/types.hpp"

namespace loom::json {

Value Value::boolean(bool b) {
  Value v;
  v.kind_ = Kind::boolean;
  v.b_ = b;
  return v;
}
Value Value::number(double d) {
  Value v;
  v.kind_ = Kind::number;
  v.d_ = d;
  return v;
}
Value Value::string(std::string s) {
  Value v;
  v.kind_ = Kind::string;
  v.s_ = std::move(s);
  return v;
}
Value Value::array() {
  Value v;
  v.kind_ = Kind::array;
  v.a_ = std::make_shared<std::vector<Value>>();
  return v;
}
Value Value::object() {
  Value v;
  v.kind_ = Kind::object;
  v.o_ = std::make_shared<std::map<std::string, Value>>();
  return v;
}

namespace {
[[noreturn]] void type_error(const char* want) { throw Error(std::string("JSON value is not ") + want); }
}  // namespace

bool Value::as_bool() const {
  if (kind_ != Kind::boolean) type_error("a boolean");
  return b_;
}
double Value::as_number() const {
  if (kind_ != Kind::number) type_error("a number");
  return d_;
}
const std::string& Value::as_string() const {
  if (kind_ != Kind::string) type_error("a string");
  return s_;
}
const std::vector<Value>& Value::as_array() const {
  if (kind_ != Kind::array) type_error("an array");
  return *a_;
}
const std::map<std::string, Value>& Value::as_object() const {
  if (kind_ != Kind::object) type_error("an object");
  return *o_;
}
bool Value::has(const std::string& key) const { return kind_ == Kind::object && o_->count(key) != 0; }
const Value& Value::at(const std::string& key) const {
  if (kind_ != Kind::object) throw Error("JSON value is not an object (looking for '" + key + "')");
  auto it = o_->find(key);
  if (it == o_->end()) throw Error("JSON object has no member '" + key + "'");
  return it->second;
}
Value& Value::push(Value v) {
  if (kind_ != Kind::array) type_error("an array");
  a_->push_back(std::move(v));
  return a_->back();
}
Value& Value::set(const std::string& key, Value v) {
  if (kind_ != Kind::object) type_error("an object");
  return (*o_)[key] = std::move(v);
}

namespace {

class Parser {
 public:
  Parser(const std::string& text, const std::string& what) : t_(text), what_(what) {}

  Value document() {
    Value v = value(0);
    ws();
    if (p_ != t_.size()) fail("trailing characters after the document");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& msg) const {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < p_ && i < t_.size(); ++i) {
      if (t_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    throw Error(what_ + ": JSON error at line " + std::to_string(line) + " col " + std::to_string(col) + ": " + msg);
  }
  void ws() {
    while (p_ < t_.size() && (t_[p_] == ' ' || t_[p_] == '\t' || t_[p_] == '\n' || t_[p_] == '\r')) ++p_;
  }
  bool eat(char c) {
    ws();
    if (p_ < t_.size() && t_[p_] == c) {
      ++p_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!eat(c)) fail(std::string("expected '") + c + "'");
  }
  bool literal(const char* word) {
    const size_t n = std::char_traits<char>::length(word);
    if (t_.compare(p_, n, word) == 0) {
      p_ += n;
      return true;
    }
    return false;
  }

  Value value(int depth) {
    if (depth > 64) fail("nesting too deep");
    ws();
    if (p_ >= t_.size()) fail("unexpected end of input");
    const char c = t_[p_];
    if (c == '{') return object(depth);
    if (c == '[') return array(depth);
    if (c == '"') return Value::string(string());
    if (literal("true")) return Value::boolean(true);
    if (literal("false")) return Value::boolean(false);
    if (literal("null")) return Value();
    if (c == '-' || (c >= '0' && c <= '9')) return number();
    fail(std::string("unexpected character '") + c + "'");
  }

  Value object(int depth) {
    ++p_;
    Value o = Value::object();
    if (eat('}')) return o;
    do {
      ws();
      if (p_ >= t_.size() || t_[p_] != '"') fail("expected a member name");
      std::string k = string();
      expect(':');
      o.set(k, value(depth + 1));
    } while (eat(','));
    expect('}');
    return o;
  }

  Value array(int depth) {
    ++p_;
    Value a = Value::array();
    if (eat(']')) return a;
    do {
      a.push(value(depth + 1));
    } while (eat(','));
    expect(']');
    return a;
  }

  Value number() {
    const size_t start = p_;
    if (t_[p_] == '-') ++p_;
    auto digits = [&] {
      const size_t s = p_;
      while (p_ < t_.size() && t_[p_] >= '0' && t_[p_] <= '9') ++p_;
      return p_ > s;
    };
    if (!digits()) fail("malformed number");
    if (p_ < t_.size() && t_[p_] == '.') {
      ++p_;
      if (!digits()) fail("malformed number");
    }
    if (p_ < t_.size() && (t_[p_] == 'e' || t_[p_] == 'E')) {
      ++p_;
      if (p_ < t_.size() && (t_[p_] == '+' || t_[p_] == '-')) ++p_;
      if (!digits()) fail("malformed number");
    }
    return Value::number(std::strtod(t_.substr(start, p_ - start).c_str(), nullptr));
  }

  std::string string() {
    ++p_;  // opening quote
    std::string s;
    while (true) {
      if (p_ >= t_.size()) fail("unterminated string");
      const char c = t_[p_++];
      if (c == '"') return s;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in string");
      if (c != '\\') {
        s += c;
        continue;
      }
      if (p_ >= t_.size()) fail("unterminated escape");
      const char e = t_[p_++];
      switch (e) {
        case '"': s += '"'; break;
        case '\\': s += '\\'; break;
        case '/': s += '/'; break;
        case 'b': s += '\b'; break;
        case 'f': s += '\f'; break;
        case 'n': s += '\n'; break;
        case 'r': s += '\r'; break;
        case 't': s += '\t'; break;
        case 'u': {
          if (p_ + 4 > t_.size()) fail("short \\u escape");
          const unsigned cp = std::stoul(t_.substr(p_, 4), nullptr, 16);
          p_ += 4;
          if (cp < 0x80) {
            s += char(cp);
          } else if (cp < 0x800) {
            s += char(0xc0 | (cp >> 6));
            s += char(0x80 | (cp & 0x3f));
          } else {
            s += char(0xe0 | (cp >> 12));
            s += char(0x80 | ((cp >> 6) & 0x3f));
            s += char(0x80 | (cp & 0x3f));
          }
          break;
        }
        default: fail("bad escape");
      }
    }
  }

  const std::string& t_;
  std::string what_;
  size_t p_ = 0;
};

}  // namespace

Value parse(const std::string& text, const std::string& what) { return Parser(text, what).document(); }

Value parse_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error("cannot open '" + path + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse(ss.str(), path);
}

std::string escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '"': o += "\\\""; break;
      case '\\': o += "\\\\"; break;
      case '\n': o += "\\n"; break;
      case '\t': o += "\\t"; break;
      case '\r': o += "\\r"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          o += buf;
        } else {
          o += c;
        }
    }
  }
  return o;
}

void Writer::separator() {
  if (after_key_) {
    after_key_ = false;
    return;
  }
  if (!first_.empty()) {
    if (!first_.back()) out_ += ',';
    first_.back() = false;
  }
}
Writer& Writer::begin_object() {
  separator();
  out_ += '{';
  first_.push_back(true);
  return *this;
}
Writer& Writer::end_object() {
  out_ += '}';
  first_.pop_back();
  return *this;
}
Writer& Writer::begin_array() {
  separator();
  out_ += '[';
  first_.push_back(true);
  return *this;
}
Writer& Writer::end_array() {
  out_ += ']';
  first_.pop_back();
  return *this;
}
Writer& Writer::key(const std::string& k) {
  separator();
  out_ += '"' + escape(k) + "\":";
  after_key_ = true;
  return *this;
}
Writer& Writer::value(const std::string& s) {
  separator();
  out_ += '"' + escape(s) + '"';
  return *this;
}
Writer& Writer::value(double d) {
  separator();
  if (!std::isfinite(d)) {
    out_ += "null";
  } else {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.9g", d);
    out_ += buf;
  }
  return *this;
}
Writer& Writer::value(int64_t i) {
  separator();
  out_ += std::to_string(i);
  return *this;
}
Writer& Writer::value(bool b) {
  separator();
  out_ += b ? "true" : "false";
  return *this;
}
Writer& Writer::null() {
  separator();
  out_ += "null";
  return *this;
}

}  // namespace loom::json
