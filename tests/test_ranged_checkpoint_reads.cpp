// A sharded checkpoint read by byte ranges: a loading rank reads the entries holding its
// pieces, not every shard file in full, and a truncated or corrupt file is a named error.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <numeric>

#include "loom/ckpt/atomic_file.hpp"
#include "loom/ckpt/checkpoint_files.hpp"
#include "loom/ckpt/safetensors_writer.hpp"
#include "loom/ckpt/sharded_checkpoint.hpp"
#include "model_fixtures.hpp"
#include "test_support.hpp"

namespace loom::test {
namespace {

namespace fs = std::filesystem;

// Two ranks' shards of two tensors, by hand: "a" [4, 6] is split at element 10, rank 0 holding
// [0, 10) and rank 1 [10, 24); "b" [8] at element 3. Element k of "a" is k, of "b" 100 + k.
class RangedReads : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("loom_ranged_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    std::iota(a_.begin(), a_.end(), 0.0f);
    std::iota(b_.begin(), b_.end(), 100.0f);
    const fs::path temp = ckpt_files::create_temp_dir(root_, 1, "test", "test");
    write_checkpoint_shard(temp, 0, 2,
                           {{"a", {4, 6}, 0, 10, a_.data()}, {"b", {8}, 0, 3, b_.data()}});
    write_checkpoint_shard(
        temp, 1, 2, {{"a", {4, 6}, 10, 14, a_.data() + 10}, {"b", {8}, 3, 5, b_.data() + 3}});
    dir_ =
        finish_sharded_checkpoint(temp, root_, 1, 2, tiny_gpt2(), nlohmann::json{{"step", 1}}, 0);
  }
  void TearDown() override { fs::remove_all(root_); }
  std::string shard(int rank) const { return dir_ + "/" + shard_file_name(rank, 2); }

  fs::path root_;
  std::string dir_;
  std::vector<float> a_ = std::vector<float>(24), b_ = std::vector<float>(8);
};

TEST_F(RangedReads, ARankReadsItsPiecesBytesNotTheFiles) {
  const CheckpointReader reader(dir_);
  EXPECT_EQ(reader.tensor_bytes_read(), 0u);  // opening reads headers only
  std::vector<float> a(10), b(3);
  reader.read({"a", {4, 6}}, 0, 10, a.data());
  reader.read({"b", {8}}, 0, 3, b.data());
  EXPECT_EQ(a, std::vector<float>(a_.begin(), a_.begin() + 10));
  EXPECT_EQ(b, std::vector<float>(b_.begin(), b_.begin() + 3));
  // Rank 0's pieces: 10 + 3 floats of 4 bytes, against two files of more than that each.
  EXPECT_EQ(reader.tensor_bytes_read(), (10u + 3u) * 4u);
  EXPECT_GT(fs::file_size(shard(0)) + fs::file_size(shard(1)), 2 * (24u + 8u) * 4u);
  // A range across both ranks' pieces of "a" reads rank 1's entry too (14 floats), once.
  std::vector<float> middle(10);
  reader.read({"a", {4, 6}}, 5, 10, middle.data());
  reader.read({"a", {4, 6}}, 5, 10, middle.data());
  EXPECT_EQ(middle, std::vector<float>(a_.begin() + 5, a_.begin() + 15));
  EXPECT_EQ(reader.tensor_bytes_read(), (10u + 3u + 14u) * 4u);
}

TEST_F(RangedReads, ATruncatedShardIsANamedErrorOnOpening) {
  fs::resize_file(shard(1), fs::file_size(shard(1)) - 4);
  expect_contains(error_message([&] { CheckpointReader reader(dir_); }),
                  {shard(1), "truncated", "the manifest records"});
}

TEST_F(RangedReads, ACorruptEntryIsANamedErrorWhenRead) {
  // Flip the last byte of rank 1's file: the data of its last entry ("b", sorted by name).
  {
    std::fstream file(shard(1), std::ios::in | std::ios::out | std::ios::binary);
    file.seekg(-1, std::ios::end);
    const char last = static_cast<char>(file.get());
    file.seekp(-1, std::ios::end);
    file.put(static_cast<char>(last ^ 0x01));
  }
  const CheckpointReader reader(dir_);
  std::vector<float> out(5);
  reader.read({"a", {4, 6}}, 0, 5, out.data());  // rank 0's piece: intact
  expect_contains(error_message([&] {
                    reader.read({"b", {8}}, 3, 5, out.data());
                  }),
                  {shard(1), "tensor 'b'", "CRC32", "corrupt"});
}

// The spans writer (what shards and asynchronous single files are written with) against the
// in-memory serializer, an independent path: the same bytes, and the CRC32 of the whole file.
TEST(SafetensorsSpans, WritesWhatSerializeSafetensorsMakes) {
  const fs::path path =
      fs::temp_directory_path() / ("loom_spans_" + std::to_string(::getpid()) + ".safetensors");
  const std::vector<float> a = {1, 2, 3, 4, 5, 6}, b = {7, 8, 9};
  std::vector<SafetensorsEntry> entries(2);
  entries[0] = {"b",
                "F32",
                {3},
                std::vector<uint8_t>(reinterpret_cast<const uint8_t*>(b.data()),
                                     reinterpret_cast<const uint8_t*>(b.data() + 3))};
  entries[1] = {"a",
                "F32",
                {2, 3},
                std::vector<uint8_t>(reinterpret_cast<const uint8_t*>(a.data()),
                                     reinterpret_cast<const uint8_t*>(a.data() + 6))};
  const std::vector<uint8_t> expected = serialize_safetensors(entries, {{"format", "pt"}});
  // "a" in two spans, and the tensors out of name order: the writer sorts them as the format does.
  const WrittenFile written =
      write_safetensors_spans(path.string(),
                              {{"b", "F32", {3}, {{b.data(), 12}}},
                               {"a", "F32", {2, 3}, {{a.data(), 8}, {a.data() + 2, 16}}}},
                              {{"format", "pt"}});
  EXPECT_EQ(read_file_bytes(path.string()), expected);
  EXPECT_EQ(written.bytes, expected.size());
  EXPECT_EQ(written.crc32, crc32_of(expected.data(), expected.size()));
  expect_contains(error_message([&] {
                    write_safetensors_spans(path.string(), {{"a", "F32", {2, 3}, {{a.data(), 8}}}});
                  }),
                  {"tensor 'a' has 8 bytes", "needs 24"});
  fs::remove(path);
}

}  // namespace
}  // namespace loom::test
