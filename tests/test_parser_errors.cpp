// Malformed files the fuzzers (tests/fuzz/) found or aim at, through the parse-from-bytes
// entries the file readers use: each must end in a loom::Error naming the file and the problem.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>

#include "loom/ckpt/safetensors.hpp"
#include "loom/ckpt/sharded_checkpoint.hpp"
#include "loom/core/error.hpp"
#include "loom/data/token_shard.hpp"

namespace loom::test {
namespace {

using Files = std::map<std::string, std::vector<uint8_t>>;

// fuzz_checkpoint's input format: a mode byte, then [name length][name][size LE32][bytes].
Files unpack_seed(const std::string& name) {
  std::ifstream in(std::string(LOOM_SOURCE_DIR) + "/tests/fuzz/corpus/checkpoint/" + name,
                   std::ios::binary);
  const std::vector<uint8_t> data((std::istreambuf_iterator<char>(in)),
                                  std::istreambuf_iterator<char>());
  Files files;
  size_t at = 1;
  while (at < data.size()) {
    const size_t length = data[at++];
    const std::string file(reinterpret_cast<const char*>(&data[at]), length);
    at += length;
    uint32_t size = 0;
    std::memcpy(&size, &data[at], 4);
    at += 4;
    files[file].assign(data.begin() + static_cast<std::ptrdiff_t>(at),
                       data.begin() + static_cast<std::ptrdiff_t>(at + size));
    at += size;
  }
  return files;
}

std::vector<uint8_t> bytes_of(const std::string& text) { return {text.begin(), text.end()}; }

// Replaces a file and records its true size and CRC in the manifest, as a writer would.
void put(Files& files, const std::string& name, const std::vector<uint8_t>& bytes) {
  files[name] = bytes;
  nlohmann::json manifest = nlohmann::json::parse(files.at("manifest.json"));
  manifest["files"][name] = {{"bytes", bytes.size()},
                             {"crc32", crc32_hex(crc32_of(bytes.data(), bytes.size()))}};
  files["manifest.json"] = bytes_of(manifest.dump());
}

void expect_error(const std::function<void()>& parse, const std::vector<std::string>& fragments) {
  try {
    parse();
    ADD_FAILURE() << "accepted; expected an error with '" << fragments.back() << "'";
  } catch (const Error& e) {
    for (const std::string& f : fragments)
      EXPECT_NE(std::string(e.what()).find(f), std::string::npos) << e.what();
  }
}

TEST(ParserErrors, SafetensorsHeaderWithANumberPastDoubleIsAnError) {
  // Found by fuzz_safetensors: nlohmann::json throws out_of_range, not parse_error, for
  // 91e79017, and it escaped as a non-loom exception.
  const std::string header = R"({"x":{"dtype":"F32","shape":[91e79017],"data_offsets":[0,0]}})";
  const uint64_t n = header.size();
  const std::string text = std::string(reinterpret_cast<const char*>(&n), 8) + header;
  const std::vector<uint8_t> file = bytes_of(text);
  expect_error([&] { (void)parse_safetensors(file.data(), file.size(), "big.safetensors"); },
               {"big.safetensors", "not valid JSON"});
}

TEST(ParserErrors, SeedCheckpointsLoadFromBytes) {
  for (const char* seed : {"ckpt0_as_is", "ckpt1_as_is"}) {
    const CheckpointReader reader = CheckpointReader::from_files("seed", unpack_seed(seed));
    EXPECT_GT(reader.tensor_names().size(), 4u) << seed;
    EXPECT_EQ(reader.sharded(), std::string(seed) == "ckpt1_as_is");
  }
}

TEST(ParserErrors, MalformedManifestsAreErrorsNamingIt) {
  const Files good = unpack_seed("ckpt1_as_is");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"format":"loom.checkpoint.v1","step":1})", "\"files\" is missing"},
      {R"({"format":"loom.checkpoint.v1","step":"1","files":{}})", "\"step\""},
      {R"({"format":"loom.checkpoint.v1","step":1e99999,"files":{}})", "not valid JSON"},
      {R"({"format":"loom.checkpoint.v1","step":1,"files":{"../x":{"bytes":1,"crc32":"00000000"}}})",
       "not a plain file name"},
      {R"({"format":"loom.checkpoint.v1","step":1,"files":{"index.json":{"bytes":-1,"crc32":"00000000"}}})",
       "no valid record"},
      {R"([1])", "not a loom checkpoint manifest"},
  };
  for (const auto& [text, expected] : cases) {
    Files files = good;
    files["manifest.json"] = bytes_of(text);
    expect_error([&] { (void)CheckpointReader::from_files("ck", files); },
                 {"ck/manifest.json", expected});
  }
}

TEST(ParserErrors, MalformedShardedIndexesAreErrorsNamingTheTensor) {
  const Files good = unpack_seed("ckpt1_as_is");
  const nlohmann::json index = nlohmann::json::parse(good.at("index.json"));
  const std::string tensor = index["tensors"].begin().key();
  auto with = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json changed = index;
    edit(changed);
    Files files = good;
    put(files, "index.json", bytes_of(changed.dump()));
    return files;
  };
  ASSERT_GE(index["tensors"][tensor]["pieces"].size(), 1u);
  const std::vector<std::pair<std::function<void(nlohmann::json&)>, std::string>> cases = {
      {[](nlohmann::json& i) { i["world_size"] = "two"; }, "\"world_size\""},
      {[](nlohmann::json& i) { i.erase("tensors"); }, "\"tensors\""},
      {[&](nlohmann::json& i) { i["tensors"][tensor]["shape"] = {1099511627777}; }, "2^40"},
      {[&](nlohmann::json& i) { i["tensors"][tensor]["pieces"][0]["start"] = -4; }, "\"start\""},
      {[&](nlohmann::json& i) { i["tensors"][tensor]["pieces"][0]["count"] = 9223372036854775807; },
       "\"count\""},
      {[&](nlohmann::json& i) {
         i["tensors"][tensor]["pieces"].push_back(i["tensors"][tensor]["pieces"][0]);
       },
       "overlap"},
      {[&](nlohmann::json& i) { i["tensors"][tensor]["pieces"].erase(0); }, "element"},
      {[&](nlohmann::json& i) { i["tensors"][tensor]["pieces"][0]["file"] = "other.safetensors"; },
       "the manifest lacks"},
  };
  for (const auto& [edit, expected] : cases)
    expect_error([&] { (void)CheckpointReader::from_files("ck", with(edit)); }, {"ck/", expected});
}

TEST(ParserErrors, TokenShardBytesAreCheckedLikeTheFile) {
  std::vector<uint8_t> shard(kTokenShardHeaderBytes + 4, 0);
  const int32_t header[3] = {kTokenShardMagic, kTokenShardVersion, 2};
  std::memcpy(shard.data(), header, sizeof header);
  shard[kTokenShardHeaderBytes] = 7;
  EXPECT_EQ(parse_token_shard(shard.data(), shard.size(), 50257, "s.bin").to_vector(),
            (std::vector<int32_t>{7, 0}));
  expect_error([&] { (void)parse_token_shard(shard.data(), shard.size() - 1, 50257, "s.bin"); },
               {"s.bin", "truncated"});
  expect_error([&] { (void)parse_token_shard(shard.data(), 100, 50257, "s.bin"); },
               {"s.bin", "header"});
  expect_error([&] { (void)parse_token_shard(shard.data(), shard.size(), 5, "s.bin"); },
               {"s.bin", "vocab_size 5"});
}

// llm.c's uint32 (Llama 3) shards from bytes: the same checks at 4 bytes a token.
TEST(ParserErrors, WideTokenShardBytesAreCheckedLikeTheFile) {
  std::vector<uint8_t> shard(kTokenShardHeaderBytes + 8, 0);
  const int32_t header[3] = {kWideTokenShardMagic, kWideTokenShardVersion, 2};
  std::memcpy(shard.data(), header, sizeof header);
  const uint32_t body[2] = {128000, 70000};
  std::memcpy(shard.data() + kTokenShardHeaderBytes, body, sizeof body);
  const ShardTokens tokens = parse_token_shard(shard.data(), shard.size(), 128256, "w.bin");
  EXPECT_EQ(tokens.bytes_per_token(), 4);
  EXPECT_EQ(tokens.to_vector(), (std::vector<int32_t>{128000, 70000}));
  expect_error([&] { (void)parse_token_shard(shard.data(), shard.size() - 2, 128256, "w.bin"); },
               {"w.bin", "truncated"});
  expect_error([&] { (void)parse_token_shard(shard.data(), shard.size(), 100000, "w.bin"); },
               {"w.bin", "token 128000", "vocab_size 100000"});
  const int32_t bad_version[2] = {kWideTokenShardMagic, kTokenShardVersion};
  std::memcpy(shard.data(), bad_version, sizeof bad_version);
  expect_error([&] { (void)parse_token_shard(shard.data(), shard.size(), 128256, "w.bin"); },
               {"w.bin", "version 1"});
}

}  // namespace
}  // namespace loom::test
