#pragma once
// The text form of a parallel layout and of a device-mesh shape: items `key=value` or a bare
// `word`, separated by commas, spaces or both ("tp=2 pp=4 sp 1f1b", "dp=2,tp=2", "tp = 2").
// One tokenizer, so that what `loom plan` prints can be pasted wherever a layout or a mesh
// shape is read (`loom plan --layout`, the [parallel] table, MeshShape::parse).
#include <string>
#include <string_view>
#include <vector>

namespace loom {

struct KeyValueItem {
  std::string key;
  std::string value;  // empty for a bare word
  bool bare = false;  // no '=' ("sp", "1f1b")
  std::string text() const { return bare ? key : key + "=" + value; }
};

// Splits `text` into its items in order. Throws loom::Error naming `what` and the item when an
// item has an empty key or an empty value ("=2", "tp=").
std::vector<KeyValueItem> split_key_values(std::string_view text, std::string_view what);

}  // namespace loom
