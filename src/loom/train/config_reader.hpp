#pragma once
// Typed access to a TOML document with dotted keys ("train.steps"), `--key=value` overrides,
// and strictness: a key of the wrong type, or a key nobody asked for (a typo), is an error
// naming the key, the value and what was expected — raised before any work starts.
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#define TOML_EXCEPTIONS 1
#include <toml++/toml.h>

namespace loom {

class ConfigReader {
 public:
  static ConfigReader from_file(const std::string& path);
  static ConfigReader from_string(const std::string& text, const std::string& source_name);

  // Applies "section.key=value" overrides; the value is read as TOML (so 3, 1e-3, true,
  // "text" and bare words all work; a bare word becomes a string).
  void apply_overrides(const std::vector<std::string>& overrides);

  int64_t get_int(const std::string& key, int64_t fallback);
  double get_double(const std::string& key, double fallback);
  bool get_bool(const std::string& key, bool fallback);
  std::string get_string(const std::string& key, const std::string& fallback);
  // A TOML array of integers, e.g. [3, 5].
  std::vector<int64_t> get_int_list(const std::string& key, const std::vector<int64_t>& fallback);
  bool has(const std::string& key) const;
  // An array of tables ([[data.sources]]): the number of tables (0 if absent). Read their
  // values as "key[i].name"; a key inside them other than `allowed` is refused by name.
  int64_t get_table_array(const std::string& key, const std::vector<std::string>& allowed);

  // Throws if the document holds keys that no get_* asked for.
  void reject_unknown_keys() const;
  const std::string& source() const { return source_; }

 private:
  const toml::node* find(const std::string& key) const;
  [[noreturn]] void wrong_type(const std::string& key, const toml::node& node, const std::string& expected) const;
  toml::table table_;
  std::string source_;
  std::set<std::string> used_;
};

}  // namespace loom
