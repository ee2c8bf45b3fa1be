// BpeTokenizer::load_tokenizer_json: a Hugging Face tokenizer.json (the `tokenizers` library's
// serialisation) whose model is byte-level BPE. Every field that changes the ids is either
// implemented as `tokenizers` does it or refused by name; fields that only affect offsets,
// padding-free single encodes or decoding of byte-level text are accepted.
#include <algorithm>
#include <cctype>
#include <limits>
#include <nlohmann/json.hpp>

#include "loom/core/error.hpp"
#include "loom/data/bpe_tokenizer.hpp"
#include "loom/data/byte_level.hpp"

namespace loom {
namespace {

using nlohmann::json;

constexpr const char* kEndOfTextToken = "<|endoftext|>";
// Ids are stored densely (one table entry per id up to the largest); this many unused ids
// beyond the tokens themselves are tolerated, so a stray huge id is an error, not 16 GB.
constexpr int64_t kMaxUnusedIds = int64_t{1} << 20;

class TokenizerJsonReader {
 public:
  explicit TokenizerJsonReader(std::string path) : path_(std::move(path)) {}

  BpeTokenizer read(const std::string& text) {
    json root;
    try {
      root = json::parse(text);
    } catch (const json::exception& e) {
      throw_error("tokenizer file '", path_, "' is not valid JSON: ", e.what());
    }
    if (!root.is_object())
      fail("expected a JSON object at the top level, found ", root.type_name());
    for (const char* key : {"truncation", "padding"}) {
      if (root.contains(key) && !root[key].is_null())
        unsupported(std::string("'") + key + "' is set",
                    "loom encodes whole texts; set it to null");
    }
    if (root.contains("normalizer") && !root["normalizer"].is_null())
      unsupported("normalizer '" + type_of(root["normalizer"]) + "'", "loom applies no normalizer");
    read_model(root.value("model", json()));
    if (!root.contains("pre_tokenizer") || root["pre_tokenizer"].is_null())
      unsupported("no pre_tokenizer", "a byte-level model needs a ByteLevel pre-tokenizer");
    read_pre_tokenizer(root["pre_tokenizer"]);
    if (!byte_level_seen_)
      unsupported("pre_tokenizer without ByteLevel", "only byte-level BPE models are supported");
    if (root.contains("added_tokens")) read_added_tokens(root["added_tokens"]);
    if (root.contains("post_processor")) read_post_processor(root["post_processor"]);
    if (root.contains("decoder")) read_decoder(root["decoder"]);
    choose_document_token();
    definition_.source = path_;
    return BpeTokenizer(std::move(definition_));
  }

 private:
  template <typename... Parts>
  [[noreturn]] void fail(Parts&&... parts) const {
    throw_error("tokenizer file '", path_, "': ", std::forward<Parts>(parts)...);
  }
  [[noreturn]] void unsupported(const std::string& feature, const std::string& why) const {
    fail(feature, " is not supported (", why,
         "); loom reads byte-level BPE tokenizers such as GPT-2's and Llama 3's");
  }
  static std::string type_of(const json& node) {
    return node.is_object() && node.contains("type") && node["type"].is_string()
               ? node["type"].get<std::string>()
               : node.dump();
  }
  static bool flag(const json& node, const char* key) {
    return node.contains(key) && node[key].is_boolean() && node[key].get<bool>();
  }
  int32_t checked_id(const json& id, const std::string& what) const {
    if (!id.is_number_integer()) fail(what, " has id ", id.dump(), ", expected an integer");
    if (id.is_number_unsigned() ? id.get<uint64_t>() > static_cast<uint64_t>(kMaxTokenId)
                                : (id.get<int64_t>() < 0 || id.get<int64_t>() > kMaxTokenId)) {
      fail(what, " has id ", id.dump(), ": loom holds token ids in [0, ", kMaxTokenId,
           "] (int32 in memory, at most 32 bits in token shards), so this vocabulary is too large");
    }
    return static_cast<int32_t>(id.get<int64_t>());
  }

  void read_model(const json& model) {
    if (!model.is_object()) fail("'model' is missing or not an object");
    if (!model.contains("type"))
      unsupported("a model without a 'type'", "re-save it with a recent tokenizers");
    const std::string type = type_of(model);
    if (type != "BPE") unsupported("model type '" + type + "'", "only BPE models");
    if (model.contains("dropout") && !model["dropout"].is_null() &&
        !(model["dropout"].is_number() && model["dropout"].get<double>() == 0.0))
      unsupported("BPE dropout " + model["dropout"].dump(), "loom encodes deterministically");
    if (flag(model, "byte_fallback"))
      unsupported("byte_fallback", "it marks a SentencePiece-style model, not a byte-level one");
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      if (model.contains(key) && !model[key].is_null() && model[key] != "")
        unsupported(std::string(key) + " " + model[key].dump(), "byte-level BPE has none");
    }
    definition_.ignore_merges = flag(model, "ignore_merges");

    const json& vocab = model.value("vocab", json());
    if (!vocab.is_object() || vocab.empty()) fail("model.vocab is missing or empty");
    int64_t max_id = -1;
    std::vector<std::pair<int32_t, std::string>> entries;
    entries.reserve(vocab.size());
    for (const auto& [spelled, id_json] : vocab.items()) {
      const int32_t id = checked_id(id_json, "vocabulary entry '" + spelled + "'");
      max_id = std::max<int64_t>(max_id, id);
      entries.emplace_back(id, spelled);
    }
    if (max_id + 1 > static_cast<int64_t>(entries.size()) + kMaxUnusedIds) {
      fail("the vocabulary has ", entries.size(), " entries but ids up to ", max_id,
           ": too sparse for loom's dense id table");
    }
    definition_.token_bytes.assign(static_cast<size_t>(max_id) + 1, std::string());
    id_of_spelled_.reserve(entries.size());
    std::string bytes;
    for (const auto& [id, spelled] : entries) {
      if (!byte_level_to_bytes(spelled, bytes)) {
        unsupported("vocabulary entry '" + spelled + "' (id " + std::to_string(id) +
                        "), which is not spelled in the byte-level alphabet,",
                    "only byte-level BPE models, whose vocabularies spell raw bytes as GPT-2 does");
      }
      if (!definition_.token_bytes[static_cast<size_t>(id)].empty())
        fail("id ", id, " is given to two vocabulary entries");
      definition_.token_bytes[static_cast<size_t>(id)] = bytes;
      id_of_spelled_.emplace(spelled, id);
    }
    read_merges(model.value("merges", json()));
  }

  int32_t vocabulary_id(const std::string& spelled, size_t merge, const std::string& shown) const {
    const auto it = id_of_spelled_.find(spelled);
    if (it == id_of_spelled_.end())
      fail("merge ", merge, " ('", shown, "'): '", spelled, "' is not in the vocabulary");
    return it->second;
  }

  void read_merges(const json& merges) {
    if (!merges.is_array()) fail("model.merges is missing or not a list");
    definition_.merges.reserve(merges.size());
    for (size_t i = 0; i < merges.size(); ++i) {
      const json& merge = merges[i];
      std::string left, right;
      if (merge.is_string()) {  // "left right", the format before tokenizers 0.20
        const std::string line = merge.get<std::string>();
        const size_t space = line.find(' ');
        if (space == std::string::npos || space == 0 || space + 1 == line.size() ||
            line.find(' ', space + 1) != std::string::npos)
          fail("merge ", i, " is '", line, "', expected two tokens separated by one space");
        left = line.substr(0, space);
        right = line.substr(space + 1);
      } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() &&
                 merge[1].is_string()) {
        left = merge[0].get<std::string>();
        right = merge[1].get<std::string>();
      } else {
        fail("merge ", i, " is ", merge.dump(),
             ", expected \"left right\" or [\"left\", \"right\"]");
      }
      const std::string shown = left + " " + right;
      definition_.merges.push_back({vocabulary_id(left, i, shown), vocabulary_id(right, i, shown),
                                    vocabulary_id(left + right, i, shown)});
    }
  }

  void read_pre_tokenizer(const json& node) {
    const std::string type = type_of(node);
    if (byte_level_seen_)
      unsupported("pre-tokenizer '" + type + "' after ByteLevel", "ByteLevel must come last");
    if (type == "Sequence") {
      const json& steps = node.value("pretokenizers", json());
      if (!steps.is_array()) fail("Sequence pre-tokenizer without a 'pretokenizers' list");
      for (const json& step : steps) read_pre_tokenizer(step);
    } else if (type == "ByteLevel") {
      if (flag(node, "add_prefix_space"))
        unsupported("ByteLevel add_prefix_space = true",
                    "set it to false; loom adds no prefix space");
      byte_level_seen_ = true;
      if (!node.contains("use_regex") || flag(node, "use_regex"))
        definition_.split_patterns.emplace_back(kGpt2SplitPattern);
    } else if (type == "Split") {
      if (node.contains("behavior") && !node["behavior"].is_string())
        fail("Split pre-tokenizer's behavior ", node["behavior"].dump(), " is not a string");
      const std::string behavior = node.value("behavior", std::string());
      if (behavior != "Isolated")
        unsupported("Split behavior '" + behavior + "'",
                    "only \"Isolated\" (matches kept as pieces)");
      if (flag(node, "invert")) unsupported("Split invert = true", "only matches kept as pieces");
      const json& pattern = node.value("pattern", json());
      if (pattern.contains("Regex") && pattern["Regex"].is_string()) {
        definition_.split_patterns.push_back(pattern["Regex"].get<std::string>());
      } else if (pattern.contains("String") && pattern["String"].is_string()) {
        std::string literal;  // escaped for PCRE2: a backslash before any ASCII punctuation
        for (const char c : pattern["String"].get<std::string>()) {
          if (static_cast<unsigned char>(c) < 0x80 && !std::isalnum(static_cast<unsigned char>(c)))
            literal += '\\';
          literal += c;
        }
        definition_.split_patterns.push_back(literal);
      } else {
        fail("Split pre-tokenizer pattern ", pattern.dump(),
             ", expected {\"Regex\": ...} or {\"String\": ...}");
      }
    } else {
      unsupported("pre-tokenizer '" + type + "'",
                  "only ByteLevel, Split (Isolated) and Sequence of them");
    }
  }

  void read_added_tokens(const json& added) {
    if (!added.is_array()) fail("'added_tokens' is not a list");
    for (const json& token : added) {
      if (!token.is_object() || !token.contains("content") || !token["content"].is_string())
        fail("added token ", token.dump(), " has no 'content' text");
      const std::string content = token["content"].get<std::string>();
      for (const char* key : {"single_word", "lstrip", "rstrip"}) {
        if (flag(token, key))
          unsupported("added token '" + content + "' with " + key + " = true",
                      "added tokens match their text exactly");
      }
      require_valid_utf8(content, ("added token in '" + path_ + "'").c_str());
      definition_.added_tokens.push_back(
          {content, checked_id(token.value("id", json()), "added token '" + content + "'"),
           flag(token, "special")});
      added_id_of_[content] = definition_.added_tokens.back().id;
    }
  }

  // TemplateProcessing's `single`: special tokens around "$A", the text (tokenizers'
  // processors/template.rs). Only the ids matter for one text; type ids are not kept.
  void read_template(const json& node) {
    if (template_seen_) unsupported("two TemplateProcessing post-processors", "one template");
    template_seen_ = true;
    const json& single = node.value("single", json());
    const json& special_tokens = node.value("special_tokens", json::object());
    if (!single.is_array()) fail("TemplateProcessing without a 'single' list");
    if (!special_tokens.is_object()) fail("TemplateProcessing 'special_tokens' is not an object");
    // A piece's {"id": "..."}, "" when it has none; an id of another type is refused by name.
    auto piece_id = [&](const json& inner) {
      if (!inner.is_object() || !inner.contains("id")) return std::string();
      if (!inner["id"].is_string())
        fail("TemplateProcessing piece ", inner.dump(), ": its id is not a string");
      return inner["id"].get<std::string>();
    };
    bool text_seen = false;
    for (const json& piece : single) {
      if (!piece.is_object()) fail("TemplateProcessing piece ", piece.dump(), " is not an object");
      if (piece.contains("Sequence")) {
        if (piece_id(piece["Sequence"]) != "A")
          fail("TemplateProcessing 'single' uses sequence ", piece["Sequence"].dump(),
               ", expected A");
        text_seen = true;
      } else if (piece.contains("SpecialToken")) {
        const std::string name = piece_id(piece["SpecialToken"]);
        const json& entry = special_tokens.value(name, json());
        if (!entry.is_object() || !entry.contains("ids") || !entry["ids"].is_array())
          fail("TemplateProcessing names special token '", name,
               "' but its special_tokens has no ids for it");
        for (const json& id : entry["ids"])
          (text_seen ? definition_.template_suffix : definition_.template_prefix)
              .push_back(checked_id(id, "template token '" + name + "'"));
      } else {
        fail("TemplateProcessing piece ", piece.dump(), ", expected a SpecialToken or a Sequence");
      }
    }
  }

  void read_post_processor(const json& node) {
    if (node.is_null()) return;
    const std::string type = type_of(node);
    if (type == "ByteLevel") return;  // it adjusts offsets only
    if (type == "TemplateProcessing") return read_template(node);
    if (type == "Sequence") {
      const json& steps = node.value("processors", json());
      if (!steps.is_array()) fail("Sequence post-processor without a 'processors' list");
      for (const json& step : steps) read_post_processor(step);
      return;
    }
    unsupported("post-processor '" + type + "'",
                "only ByteLevel, TemplateProcessing and Sequence of them");
  }

  void read_decoder(const json& node) {
    if (node.is_null()) return;
    const std::string type = type_of(node);
    if (type == "ByteLevel") return;
    if (type == "Sequence" && node.value("decoders", json()).is_array()) {
      for (const json& step : node["decoders"]) read_decoder(step);
      return;
    }
    unsupported("decoder '" + type + "'", "byte-level models decode with ByteLevel");
  }

  // What `loom tokenize` puts before each document: the template's BOS when there is one
  // (Llama 3's later files), else "<|endoftext|>" (GPT-2 and its family), else none.
  void choose_document_token() {
    if (definition_.template_prefix.size() == 1) {
      definition_.document_token = definition_.template_prefix.front();
    } else if (const auto added = added_id_of_.find(kEndOfTextToken); added != added_id_of_.end()) {
      definition_.document_token = added->second;
    }
  }

  std::string path_;
  BpeDefinition definition_;
  std::unordered_map<std::string, int32_t> id_of_spelled_;  // vocabulary as spelled in the file
  std::unordered_map<std::string, int32_t> added_id_of_;
  bool byte_level_seen_ = false;
  bool template_seen_ = false;
};

}  // namespace

BpeTokenizer BpeTokenizer::load_tokenizer_json(const std::string& path) {
  return parse_tokenizer_json(read_whole_file(path, "tokenizer file"), path);
}

BpeTokenizer BpeTokenizer::parse_tokenizer_json(const std::string& text, const std::string& path) {
  return TokenizerJsonReader(path).read(text);
}

}  // namespace loom
