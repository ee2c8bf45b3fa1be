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
  const std::vector<uint16_t> read = read_token_shard(path, 65536);
  EXPECT_EQ(std::vector<int32_t>(read.begin(), read.end()), tokens);
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

TEST(TokenShard, WriteRejectsTokensThatDoNotFitUint16) {
  TempDir dir("loom_test_token_shard");
  const std::string path = dir.file("shard.bin");
  EXPECT_THAT(
      error_message([&] {
        write_token_shard(path, {1, 65536});
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
  EXPECT_EQ(read_token_shard(path, 50258).size(), 4u);  // fine for a larger vocabulary
}

}  // namespace
}  // namespace loom::test
