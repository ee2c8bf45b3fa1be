#include "loom/train/config_reader.hpp"

#include <algorithm>
#include <sstream>

#include "loom/core/error.hpp"

namespace loom {

ConfigReader ConfigReader::from_file(const std::string& path) {
  ConfigReader reader;
  reader.source_ = path;
  try {
    reader.table_ = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    std::ostringstream where;
    where << e.source().begin;
    throw_error("config ", path, ": ", e.description(), " at ", where.str());
  }
  return reader;
}

ConfigReader ConfigReader::from_string(const std::string& text, const std::string& source_name) {
  ConfigReader reader;
  reader.source_ = source_name;
  try {
    reader.table_ = toml::parse(text, source_name);
  } catch (const toml::parse_error& e) {
    throw_error("config ", source_name, ": ", e.description());
  }
  return reader;
}

void ConfigReader::apply_overrides(const std::vector<std::string>& overrides) {
  for (std::string item : overrides) {
    if (item.rfind("--", 0) == 0) item = item.substr(2);
    const auto eq = item.find('=');
    if (eq == std::string::npos || eq == 0)
      throw_error("override '", item, "': expected section.key=value");
    const std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    const auto dot = key.rfind('.');
    if (dot == std::string::npos)
      throw_error("override '", item, "': key '", key, "' needs a section, e.g. train.steps");
    toml::table parsed;
    try {
      parsed = toml::parse("v = " + value);
    } catch (const toml::parse_error&) {
      parsed = toml::table{{"v", value}};  // a bare word: take it as a string
    }
    toml::table* section = &table_;
    std::stringstream path(key.substr(0, dot));
    for (std::string part; std::getline(path, part, '.');) {
      auto [it, inserted] = section->emplace(part, toml::table{});
      (void)inserted;
      section = it->second.as_table();
      if (!section) throw_error("override '", item, "': '", part, "' is not a section");
    }
    section->insert_or_assign(key.substr(dot + 1), *parsed.get("v"));
  }
}

const toml::node* ConfigReader::find(const std::string& key) const {
  return table_.at_path(key).node();
}

bool ConfigReader::has(const std::string& key) const { return find(key) != nullptr; }

int64_t ConfigReader::get_table_array(const std::string& key, const std::vector<std::string>& allowed) {
  used_.insert(key);
  const toml::node* node = find(key);
  if (!node) return 0;
  const toml::array* array = node->as_array();
  if (!array || !array->is_array_of_tables())
    wrong_type(key, *node, "an array of tables ([[" + key + "]] sections)");
  for (size_t i = 0; i < array->size(); ++i) {
    for (const auto& [name, value] : *array->get(i)->as_table()) {
      (void)value;
      const std::string field(name.str());
      if (std::find(allowed.begin(), allowed.end(), field) == allowed.end()) {
        std::string known;
        for (const std::string& k : allowed) known += (known.empty() ? "" : ", ") + k;
        throw_error("config ", source_, ": unknown key '", field, "' in ", key, "[", i, "]; known keys are ", known);
      }
    }
  }
  return static_cast<int64_t>(array->size());
}

void ConfigReader::wrong_type(const std::string& key, const toml::node& node, const std::string& expected) const {
  std::ostringstream value;
  node.visit([&](const auto& concrete) { value << concrete; });
  throw_error("config ", source_, ": key '", key, "' has value ", value.str(), ", expected ", expected);
}

int64_t ConfigReader::get_int(const std::string& key, int64_t fallback) {
  used_.insert(key);
  const toml::node* node = find(key);
  if (!node) return fallback;
  if (auto v = node->value_exact<int64_t>()) return *v;
  wrong_type(key, *node, "an integer");
}

std::vector<int64_t> ConfigReader::get_int_list(const std::string& key, const std::vector<int64_t>& fallback) {
  used_.insert(key);
  const toml::node* node = find(key);
  if (!node) return fallback;
  const toml::array* array = node->as_array();
  if (!array) wrong_type(key, *node, "an array of integers");
  std::vector<int64_t> values;
  for (const toml::node& element : *array) {
    const auto v = element.value_exact<int64_t>();
    if (!v) wrong_type(key, *node, "an array of integers");
    values.push_back(*v);
  }
  return values;
}

double ConfigReader::get_double(const std::string& key, double fallback) {
  used_.insert(key);
  const toml::node* node = find(key);
  if (!node) return fallback;
  if (auto v = node->value_exact<double>()) return *v;
  if (auto v = node->value_exact<int64_t>()) return static_cast<double>(*v);
  wrong_type(key, *node, "a number");
}

bool ConfigReader::get_bool(const std::string& key, bool fallback) {
  used_.insert(key);
  const toml::node* node = find(key);
  if (!node) return fallback;
  if (auto v = node->value_exact<bool>()) return *v;
  wrong_type(key, *node, "true or false");
}

std::string ConfigReader::get_string(const std::string& key, const std::string& fallback) {
  used_.insert(key);
  const toml::node* node = find(key);
  if (!node) return fallback;
  if (auto v = node->value_exact<std::string>()) return *v;
  wrong_type(key, *node, "a string");
}

void ConfigReader::reject_unknown_keys() const {
  std::vector<std::string> unknown;
  for (const auto& [section, node] : table_) {
    const std::string section_name(section.str());
    if (const toml::table* inner = node.as_table()) {
      for (const auto& [key, value] : *inner) {
        (void)value;
        const std::string full = section_name + "." + std::string(key.str());
        if (!used_.count(full)) unknown.push_back(full);
      }
      // An empty table is a typo too unless some key of that section was asked for.
      const bool known_section = std::any_of(used_.begin(), used_.end(), [&](const std::string& k) {
        return k.rfind(section_name + ".", 0) == 0;
      });
      if (inner->empty() && !known_section) unknown.push_back("[" + section_name + "]");
    } else if (!used_.count(section_name)) {
      unknown.push_back(section_name);
    }
  }
  if (unknown.empty()) return;
  std::string known;
  for (const auto& k : used_) known += (known.empty() ? "" : ", ") + k;
  std::string listed;
  for (const auto& k : unknown) listed += (listed.empty() ? "" : ", ") + k;
  throw_error("config ", source_, ": unknown key(s) ", listed, "; known keys are ", known);
}

}  // namespace loom
