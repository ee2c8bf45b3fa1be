#include "loom/core/key_values.hpp"

#include "loom/core/error.hpp"

namespace loom {

namespace {
bool is_separator(char c) { return c == ',' || c == ' ' || c == '\t' || c == '\n'; }
bool is_blank(char c) { return c == ' ' || c == '\t'; }
}  // namespace

std::vector<KeyValueItem> split_key_values(std::string_view text, std::string_view what) {
  // Spaces around '=' belong to the item ("tp = 2"), not between two items.
  std::string joined;
  for (size_t i = 0; i < text.size(); ++i) {
    if (is_blank(text[i])) {
      size_t next = i;
      while (next < text.size() && is_blank(text[next])) ++next;
      const bool before_equals = next < text.size() && text[next] == '=';
      const bool after_equals = !joined.empty() && joined.back() == '=';
      if (before_equals || after_equals) {
        i = next - 1;
        continue;
      }
    }
    joined += text[i];
  }
  std::vector<KeyValueItem> items;
  size_t start = 0;
  while (start < joined.size()) {
    if (is_separator(joined[start])) {
      ++start;
      continue;
    }
    size_t end = start;
    while (end < joined.size() && !is_separator(joined[end])) ++end;
    const std::string item = joined.substr(start, end - start);
    start = end;
    const size_t equals = item.find('=');
    KeyValueItem kv;
    if (equals == std::string::npos) {
      kv.key = item;
      kv.bare = true;
    } else {
      kv.key = item.substr(0, equals);
      kv.value = item.substr(equals + 1);
      if (kv.key.empty() || kv.value.empty())
        throw_error(what, " '", text, "': item '", item, "' is not key=value");
    }
    items.push_back(std::move(kv));
  }
  return items;
}

}  // namespace loom
