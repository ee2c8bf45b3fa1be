// BpeTokenizer::load_gpt2: openai/gpt-2's encoder.json + vocab.bpe.
#include <nlohmann/json.hpp>
#include <sstream>

#include "loom/core/error.hpp"
#include "loom/data/bpe_tokenizer.hpp"
#include "loom/data/byte_level.hpp"

namespace loom {
namespace {

constexpr const char* kEndOfTextToken = "<|endoftext|>";

struct EncoderTable {
  std::vector<std::string> token_bytes;                  // id -> raw bytes
  std::unordered_map<std::string, int32_t> id_of_token;  // GPT-2 alphabet string -> id
};

EncoderTable parse_encoder_json(const std::string& text, const std::string& path) {
  nlohmann::json encoder;
  try {
    encoder = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw_error("GPT-2 encoder file '", path, "' is not valid JSON: ", e.what());
  }
  if (!encoder.is_object() || encoder.empty()) {
    throw_error("GPT-2 encoder file '", path, "': expected a non-empty JSON object mapping token ",
                "strings to ids, found ", encoder.type_name());
  }
  const auto vocab_size = static_cast<int64_t>(encoder.size());
  EncoderTable table;
  table.token_bytes.resize(encoder.size());
  table.id_of_token.reserve(encoder.size());
  std::vector<bool> id_seen(encoder.size(), false);
  for (const auto& [token, id_json] : encoder.items()) {
    if (!id_json.is_number_integer()) {
      throw_error("GPT-2 encoder file '", path, "': token '", token, "' maps to ", id_json.dump(),
                  ", expected an integer id");
    }
    const int64_t id = id_json.get<int64_t>();
    if (id < 0 || id >= vocab_size) {
      throw_error("GPT-2 encoder file '", path, "': token '", token, "' has id ", id,
                  ", expected ids in [0, ", vocab_size, ") (one per entry)");
    }
    if (id_seen[id])
      throw_error("GPT-2 encoder file '", path, "': id ", id, " is used by two tokens");
    id_seen[id] = true;
    if (!byte_level_to_bytes(token, table.token_bytes[id])) {
      throw_error("GPT-2 encoder file '", path, "': token '", token, "' (id ", id,
                  ") is empty or has a character outside GPT-2's byte-to-unicode alphabet");
    }
    table.id_of_token.emplace(token, static_cast<int32_t>(id));
  }
  return table;
}

// vocab.bpe: a "#version" line, then "left right" per line; the line order is the merge rank.
std::vector<std::array<int32_t, 3>> parse_merges(const std::string& text, const std::string& path,
                                                 const EncoderTable& encoder,
                                                 const std::string& encoder_path) {
  std::vector<std::array<int32_t, 3>> merges;
  std::unordered_map<uint64_t, int32_t> rank_of_pair;
  std::istringstream lines(text);
  std::string line;
  int64_t line_number = 0;
  std::vector<int32_t> last_rank_creating(encoder.token_bytes.size(), -1);
  while (std::getline(lines, line)) {
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (line_number == 1 && line.rfind("#version", 0) == 0)) continue;
    const size_t space = line.find(' ');
    if (space == std::string::npos || space == 0 || space + 1 == line.size() ||
        line.find(' ', space + 1) != std::string::npos) {
      throw_error("GPT-2 merges file '", path, "' line ", line_number,
                  ": expected two tokens separated by one space, found '", line, "'");
    }
    const std::string left = line.substr(0, space);
    const std::string right = line.substr(space + 1);
    std::array<int32_t, 3> ids{};
    const std::string parts[3] = {left, right, left + right};
    for (int k = 0; k < 3; ++k) {
      const auto it = encoder.id_of_token.find(parts[k]);
      if (it == encoder.id_of_token.end()) {
        throw_error("GPT-2 merges file '", path, "' line ", line_number, ": token '", parts[k],
                    "' is not in the encoder file '", encoder_path,
                    "' (files from different models?)");
      }
      ids[k] = it->second;
    }
    const auto rank = static_cast<int32_t>(merges.size());
    const uint64_t pair = (static_cast<uint64_t>(ids[0]) << 32) | static_cast<uint32_t>(ids[1]);
    if (!rank_of_pair.emplace(pair, rank).second) {
      throw_error("GPT-2 merges file '", path, "' line ", line_number, ": merge '", line,
                  "' appears twice");
    }
    last_rank_creating[ids[2]] = rank;
    merges.push_back(ids);
  }
  if (merges.empty()) throw_error("GPT-2 merges file '", path, "' contains no merges");
  // The heap-based merge loop reproduces encoder.py's pass-by-pass order only if every merge
  // comes after all merges that create its parts; GPT-2's trained file satisfies this.
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    for (const int32_t part : {merges[rank][0], merges[rank][1]}) {
      if (last_rank_creating[part] >= static_cast<int32_t>(rank)) {
        throw_error("GPT-2 merges file '", path, "': merge number ", rank + 1,
                    " uses a token that the later merge number ", last_rank_creating[part] + 1,
                    " creates; merges must follow the merges that create their parts");
      }
    }
  }
  return merges;
}

}  // namespace

BpeTokenizer BpeTokenizer::load_gpt2(const std::string& encoder_json_path,
                                     const std::string& vocab_bpe_path) {
  return parse_gpt2(read_whole_file(encoder_json_path, "GPT-2 encoder file"),
                    read_whole_file(vocab_bpe_path, "GPT-2 merges file"), encoder_json_path,
                    vocab_bpe_path);
}

BpeTokenizer BpeTokenizer::parse_gpt2(const std::string& encoder_json, const std::string& vocab_bpe,
                                      const std::string& encoder_json_path,
                                      const std::string& vocab_bpe_path) {
  EncoderTable encoder = parse_encoder_json(encoder_json, encoder_json_path);
  BpeDefinition definition;
  definition.source = encoder_json_path + "' + '" + vocab_bpe_path;
  definition.merges = parse_merges(vocab_bpe, vocab_bpe_path, encoder, encoder_json_path);
  const auto eot = encoder.id_of_token.find(kEndOfTextToken);
  if (eot == encoder.id_of_token.end()) {
    throw_error("GPT-2 encoder file '", encoder_json_path, "' has no '", kEndOfTextToken,
                "' token");
  }
  definition.document_token = eot->second;
  definition.token_bytes = std::move(encoder.token_bytes);
  definition.split_patterns = {kGpt2SplitPattern};
  return BpeTokenizer(std::move(definition));
}

}  // namespace loom
