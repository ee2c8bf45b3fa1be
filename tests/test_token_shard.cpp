// llm.c token shards: exact byte layout, round trips, and a clear error for each way a shard
// can be wrong (missing, foreign, other version, truncated, other vocabulary).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/data/token_shard.hpp"
#include "test_support.hpp"

namespace loom::test {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;

int32_t header_int(const std::vector<uint8_t>& bytes, int index) {
  int32_t value = 0;
  std::memcpy(&value, bytes.data() + 4 * index, sizeof(value));
  return value;
}

void overwrite_header_int(const std::string& path, int index, int32_t value) {
  std::fstream file(path, std::ios::binary | std::ios::in | std::ios::out);
  file.seekp(4 * index);
  file.write(reinterpret_cast<const char*>(&value), sizeof(value));
  if (!file) throw std::runtime_error("cannot patch " + path);
}

constexpr int64_t kGpt2VocabSize = 50257;

TEST(TokenShard, WritesLlmcLayoutAndRoundTrips) {
  TempDir dir("loom_test_token_shard");
  const std::string path = dir.file("shard.bin");
  const std::vector<int32_t> tokens = {50256, 0, 1, 15496, 995, 65535, 12345};
  write_token_shard(path, tokens);

  const std::vector<uint8_t> bytes = read_file_bytes(path);
  ASSERT_EQ(bytes.size(), 1024u + 2 * tokens.size());
  EXPECT_EQ(header_int(bytes, 0), 20240520);
  EXPECT_EQ(header_int(bytes, 1), 1);
  EXPECT_EQ(header_int(bytes, 2), static_cast<int32_t>(tokens.size()));
  for (int i = 3; i < 256; ++i) EXPECT_EQ(header_int(bytes, i), 0) << "header int " << i;
  // Little-endian uint16 body: 50256 = 0xC450.
  EXPECT_EQ(static_cast<unsigned char>(bytes[1024]), 0x50);
  EXPECT_EQ(static_cast<unsigned char>(bytes[1025]), 0xC4);

  EXPECT_EQ(token_shard_size(path), static_cast<int64_t>(tokens.size()));
  EXPECT_EQ(read_token_shard(path, 65536).to_vector(), tokens);
  EXPECT_FALSE(fs::exists(path + ".tmp"));
}

TEST(TokenShard, EmptyShardRoundTripsAndRewriteReplaces) {
  TempDir dir("loom_test_token_shard");
  const std::string path = dir.file("shard.bin");
  write_token_shard(path, {1, 2, 3});
  write_token_shard(path, {});
  EXPECT_EQ(token_shard_size(path), 0);
  EXPECT_TRUE(read_token_shard(path, kGpt2VocabSize).empty());
}

TEST(TokenShard, WriteRejectsTokensOutsideTheVocabulary) {
  TempDir dir("loom_test_token_shard");
  const std::string path = dir.file("shard.bin");
  EXPECT_THAT(
      error_message([&] {
        write_token_shard(path, {1, 65536}, 65536);
      }),
      AllOf(HasSubstr(path), HasSubstr("65536"), HasSubstr("position 1"), HasSubstr("outside [0, 65535]")));
  EXPECT_THAT(error_message([&] { write_token_shard(path, {-1}); }), HasSubstr("-1"));
  EXPECT_FALSE(fs::exists(path));
  EXPECT_FALSE(fs::exists(path + ".tmp"));
}

TEST(TokenShard, MissingFileIsAnErrorNamingIt) {
  TempDir dir("loom_test_token_shard");
  const std::string path = dir.file("absent.bin");
  EXPECT_THAT(error_message([&] { read_token_shard(path, kGpt2VocabSize); }),
              AllOf(HasSubstr(path), HasSubstr("cannot open")));
  EXPECT_THAT(error_message([&] { token_shard_size(path); }), HasSubstr(path));
}

TEST(TokenShard, WrongMagicIsAnError) {
  TempDir dir("loom_test_token_shard");
  const std::string path = dir.file("shard.bin");
  write_token_shard(path, {1, 2, 3});
  overwrite_header_int(path, 0, 12345);
  const std::string message = error_message([&] { read_token_shard(path, kGpt2VocabSize); });
  EXPECT_THAT(message, AllOf(HasSubstr(path), HasSubstr("magic"), HasSubstr("12345"), HasSubstr("20240520")));
  EXPECT_THAT(error_message([&] { token_shard_size(path); }), HasSubstr("magic"));
}

TEST(TokenShard, WrongVersionIsAnError) {
  TempDir dir("loom_test_token_shard");
  const std::string path = dir.file("shard.bin");
  write_token_shard(path, {1, 2, 3});
  overwrite_header_int(path, 1, 2);
  EXPECT_THAT(error_message([&] { read_token_shard(path, kGpt2VocabSize); }),
              AllOf(HasSubstr(path), HasSubstr("version 2"), HasSubstr("expected 1")));
}

TEST(TokenShard, TruncatedFileIsAnError) {
  TempDir dir("loom_test_token_shard");
  const std::string path = dir.file("shard.bin");
  write_token_shard(path, std::vector<int32_t>(100, 7));
  fs::resize_file(path, 1024 + 2 * 99);
  EXPECT_THAT(
      error_message([&] { read_token_shard(path, kGpt2VocabSize); }),
      AllOf(HasSubstr(path), HasSubstr("truncated"), HasSubstr("100 tokens"), HasSubstr("1222 bytes")));
  EXPECT_THAT(error_message([&] { token_shard_size(path); }), HasSubstr("truncated"));

  fs::resize_file(path, 500);  // not even a whole header
  EXPECT_THAT(error_message([&] { read_token_shard(path, kGpt2VocabSize); }),
              AllOf(HasSubstr("truncated"), HasSubstr("500 bytes")));
}

TEST(TokenShard, TrailingBytesAreAnError) {
  TempDir dir("loom_test_token_shard");
  const std::string path = dir.file("shard.bin");
  write_token_shard(path, {1, 2, 3});
  fs::resize_file(path, 1024 + 2 * 3 + 2);
  EXPECT_THAT(error_message([&] { read_token_shard(path, kGpt2VocabSize); }),
              AllOf(HasSubstr(path), HasSubstr("trailing data")));
}

TEST(TokenShard, TokenOutsideVocabularyIsAnError) {
  TempDir dir("loom_test_token_shard");
  const std::string path = dir.file("shard.bin");
  write_token_shard(path, {1, 2, 50257, 3});
  const std::string message = error_message([&] { read_token_shard(path, kGpt2VocabSize); });
  EXPECT_THAT(message, AllOf(HasSubstr(path), HasSubstr("token 50257"), HasSubstr("position 2"),
                             HasSubstr("vocab_size 50257"), HasSubstr("vocabulary mismatch")));
  EXPECT_EQ(read_token_shard(path, 50258).size(), 4);  // fine for a larger vocabulary
}

// Shards as llm.c's dev/data/data_common.py writes them, byte by byte: header of 256 int32,
// then uint16 (GPT-2) or uint32 (Llama 3) little-endian ids.
void write_llmc_shard(const std::string& path, int32_t magic, int32_t version, const std::vector<uint32_t>& tokens,
                      int bytes_per_token) {
  std::vector<uint8_t> bytes(1024, 0);
  const auto put = [&](size_t at, uint32_t value, int width) {
    if (bytes.size() < at + width) bytes.resize(at + width);
    for (int k = 0; k < width; ++k) bytes[at + k] = static_cast<uint8_t>(value >> (8 * k));
  };
  put(0, static_cast<uint32_t>(magic), 4);
  put(4, static_cast<uint32_t>(version), 4);
  put(8, static_cast<uint32_t>(tokens.size()), 4);
  for (size_t i = 0; i < tokens.size(); ++i) put(1024 + bytes_per_token * i, tokens[i], bytes_per_token);
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

TEST(TokenShard, ReadsLlmcGpt2AndLlama3Shards) {
  TempDir dir("loom_test_token_shard");
  write_llmc_shard(dir.file("gpt2.bin"), 20240520, 1, {50256, 15496, 995, 0, 65535}, 2);
  EXPECT_EQ(read_token_shard(dir.file("gpt2.bin"), 65536).to_vector(), (std::vector<int32_t>{50256, 15496, 995, 0, 65535}));
  EXPECT_EQ(read_token_shard(dir.file("gpt2.bin"), 65536).bytes_per_token(), 2);
  write_llmc_shard(dir.file("llama3.bin"), 20240801, 7, {128000, 9906, 1917, 70000, 128255, 0}, 4);
  const ShardTokens llama3 = read_token_shard(dir.file("llama3.bin"), 128256);
  EXPECT_EQ(llama3.to_vector(), (std::vector<int32_t>{128000, 9906, 1917, 70000, 128255, 0}));
  EXPECT_EQ(llama3.bytes_per_token(), 4);
  EXPECT_EQ(token_shard_size(dir.file("llama3.bin")), 6);
  EXPECT_EQ(longest_document(dir.file("llama3.bin"), 128000).tokens, 5);  // the end token, then 5 more
  EXPECT_THAT(error_message([&] { read_token_shard(dir.file("llama3.bin"), 128255); }),
              AllOf(HasSubstr("token 128255"), HasSubstr("vocabulary mismatch")));
  // An id above int32 (a uint32 shard can spell it) is never a loom token.
  write_llmc_shard(dir.file("huge.bin"), 20240801, 7, {1, 4000000000u}, 4);
  EXPECT_THAT(error_message([&] { read_token_shard(dir.file("huge.bin"), int64_t{1} << 32); }),
              HasSubstr("token 4000000000"));
  write_llmc_shard(dir.file("v2.bin"), 20240801, 2, {1, 2}, 4);
  EXPECT_THAT(error_message([&] { read_token_shard(dir.file("v2.bin"), 128256); }),
              AllOf(HasSubstr("version 2"), HasSubstr("expected 7"), HasSubstr("uint32")));
  write_llmc_shard(dir.file("short.bin"), 20240801, 7, {1, 2}, 2);  // uint16 body under a uint32 header
  EXPECT_THAT(error_message([&] { token_shard_size(dir.file("short.bin")); }), HasSubstr("truncated"));
}

TEST(TokenShard, WidthFollowsTheVocabulary) {
  TempDir dir("loom_test_token_shard");
  const std::string path = dir.file("shard.bin");
  write_token_shard(path, {0, 65535, 7}, 65536);  // GPT-2-sized vocabularies keep uint16
  EXPECT_EQ(read_file_bytes(path).size(), 1024u + 2 * 3);
  write_token_shard(path, {0, 65535, 7}, 65537);  // one id more: uint32 for every shard
  std::vector<uint8_t> bytes = read_file_bytes(path);
  ASSERT_EQ(bytes.size(), 1024u + 4 * 3);
  EXPECT_EQ(header_int(bytes, 0), 20240801);
  EXPECT_EQ(header_int(bytes, 1), 7);
  const std::vector<int32_t> llama3 = {128000, 0, 65536, 128255, 9906};
  write_token_shard(path, llama3, 128256);
  bytes = read_file_bytes(path);
  ASSERT_EQ(bytes.size(), 1024u + 4 * llama3.size());
  EXPECT_EQ(header_int(bytes, 1024 / 4), 128000);  // little-endian uint32 body
  EXPECT_EQ(read_token_shard(path, 128256).to_vector(), llama3);
  write_token_shard(path, {3, 70000});  // no vocabulary given: as wide as the ids need
  EXPECT_EQ(read_token_shard(path, 70001).to_vector(), (std::vector<int32_t>{3, 70000}));
  EXPECT_EQ(read_token_shard(path, 70001).bytes_per_token(), 4);
}

TEST(TokenShard, RefusesVocabulariesBeyond32BitsBeforeWriting) {
  TempDir dir("loom_test_token_shard");
  const std::string path = dir.file("shard.bin");
  EXPECT_THAT(error_message([&] { write_token_shard(path, {1, 2}, (int64_t{1} << 32) + 1); }),
              AllOf(HasSubstr(path), HasSubstr("4294967297"), HasSubstr("32 bits")));
  EXPECT_THAT(error_message([&] { write_token_shard(path, {1, 128256}, 128256); }),
              AllOf(HasSubstr("128256"), HasSubstr("position 1")));
  EXPECT_FALSE(fs::exists(path));
  EXPECT_FALSE(fs::exists(path + ".tmp"));
}

}  // namespace
}  // namespace loom::test
