// A small JSON reader and writer: enough for replay files, benchmark records and their tests.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace loom::json {

class Value {
 public:
  enum class Kind { null, boolean, number, string, array, object };

  Value() = default;
  static Value boolean(bool b);
  static Value number(double d);
  static Value string(std::string s);
  static Value array();
  static Value object();

  Kind kind() const { return kind_; }
  bool is_null() const { return kind_ == Kind::null; }
  bool as_bool() const;
  double as_number() const;
  const std::string& as_string() const;
  const std::vector<Value>& as_array() const;
  const std::map<std::string, Value>& as_object() const;
  // Object member; throws loom::Error naming the key when missing or not an object.
  const Value& at(const std::string& key) const;
  bool has(const std::string& key) const;

  Value& push(Value v);                         // array append
  Value& set(const std::string& key, Value v);  // object member (insertion order not kept)

 private:
  Kind kind_ = Kind::null;
  bool b_ = false;
  double d_ = 0;
  std::string s_;
  std::shared_ptr<std::vector<Value>> a_;
  std::shared_ptr<std::map<std::string, Value>> o_;
};

// Parse a whole document; throws loom::Error("<what>: JSON error at line L col C: ...").
Value parse(const std::string& text, const std::string& what = "JSON");
Value parse_file(const std::string& path);

// Streaming writer that keeps member order as written (benchmark records read top to bottom).
class Writer {
 public:
  Writer& begin_object();
  Writer& end_object();
  Writer& begin_array();
  Writer& end_array();
  Writer& key(const std::string& k);
  Writer& value(const std::string& s);
  Writer& value(const char* s) { return value(std::string(s)); }
  Writer& value(double d);  // non-finite numbers are written as null
  Writer& value(int64_t i);
  Writer& value(int i) { return value(int64_t(i)); }
  Writer& value(bool b);
  Writer& null();
  template <class T>
  Writer& field(const std::string& k, const T& v) {
    key(k);
    return value(v);
  }
  const std::string& str() const { return out_; }

 private:
  void separator();
  std::string out_;
  std::vector<bool> first_;  // per open container: no element written yet
  bool after_key_ = false;
};

std::string escape(const std::string& s);

}  // namespace loom::json
