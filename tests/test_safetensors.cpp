// safetensors reader/writer: bit-exact round trips, the reference layout, and a clear error
// for each kind of damaged file.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "loom/ckpt/atomic_file.hpp"
#include "loom/ckpt/safetensors.hpp"
#include "loom/core/error.hpp"
#include "test_support.hpp"

namespace loom::test {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// A fresh directory per test, removed afterwards.
class SafetensorsTest : public ::testing::Test {
 protected:
  std::string path(const std::string& name) const { return dir_.file(name); }
  TempDir dir_{"loom_safetensors_test"};
};

template <typename T>
SafetensorsEntry make_entry(const std::string& name, const std::string& dtype, std::vector<int64_t> shape,
                            const std::vector<T>& values) {
  SafetensorsEntry entry{name, dtype, std::move(shape), std::vector<uint8_t>(values.size() * sizeof(T))};
  if (!values.empty()) std::memcpy(entry.bytes.data(), values.data(), entry.bytes.size());
  return entry;
}

// Covers every dtype plus a scalar and an empty tensor; float payloads include bit patterns a
// value-based comparison would miss (NaN payload, -0, denormal).
std::vector<SafetensorsEntry> sample_entries() {
  uint32_t nan_bits = 0x7fc01234u;
  float nan_with_payload;
  std::memcpy(&nan_with_payload, &nan_bits, sizeof nan_bits);
  return {
      make_entry<float>("weight", "F32", {2, 3},
                        {1.5f, -0.0f, nan_with_payload, std::numeric_limits<float>::infinity(),
                         std::numeric_limits<float>::denorm_min(), 3.14159265f}),
      make_entry<uint16_t>("half", "BF16", {4}, {0x3f80, 0x8000, 0x7fc1, 0x0001}),
      make_entry<int32_t>("index", "I32", {3}, {-7, 0, std::numeric_limits<int32_t>::max()}),
      make_entry<int64_t>("big", "I64", {1, 2}, {std::numeric_limits<int64_t>::min(), 1234567890123LL}),
      make_entry<float>("scalar", "F32", {}, {42.0f}),
      make_entry<float>("empty", "F32", {0, 5}, {}),
  };
}

void expect_same_entries(const std::vector<SafetensorsEntry>& expected, const SafetensorsFile& file) {
  ASSERT_EQ(file.entries.size(), expected.size());
  for (const SafetensorsEntry& want : expected) {
    const SafetensorsEntry& got = file.at(want.name);
    EXPECT_EQ(got.dtype, want.dtype) << want.name;
    EXPECT_EQ(got.shape, want.shape) << want.name;
    EXPECT_EQ(got.bytes, want.bytes) << want.name;
  }
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  atomic_write_file(path, bytes.data(), bytes.size());
}

// A file assembled by hand, the way another writer might lay it out.
std::vector<uint8_t> raw_file(const std::string& header, const std::vector<uint8_t>& data) {
  std::vector<uint8_t> out;
  const uint64_t length = header.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(length >> (8 * i)));
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

TEST_F(SafetensorsTest, RoundTripIsBitExactForEveryDtype) {
  const std::vector<SafetensorsEntry> entries = sample_entries();
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"note", "ünïcode ok"}};
  write_safetensors(path("a.safetensors"), entries, metadata);
  const SafetensorsFile file = read_safetensors(path("a.safetensors"));
  expect_same_entries(entries, file);
  EXPECT_EQ(file.metadata, metadata) << "crc keys must not leak into the caller's metadata";
  EXPECT_EQ(file.path, path("a.safetensors"));
}

TEST_F(SafetensorsTest, LayoutMatchesTheReferenceFormat) {
  const std::vector<SafetensorsEntry> entries = sample_entries();
  write_safetensors(path("a.safetensors"), entries, {{"format", "pt"}});
  const std::vector<uint8_t> bytes = read_file_bytes(path("a.safetensors"));

  ASSERT_GE(bytes.size(), 8u);
  uint64_t header_bytes = 0;
  for (int i = 0; i < 8; ++i) header_bytes |= static_cast<uint64_t>(bytes[static_cast<size_t>(i)]) << (8 * i);
  EXPECT_EQ(header_bytes % 8, 0u) << "the reference writer pads the header to 8 bytes";
  ASSERT_LE(8 + header_bytes, bytes.size());
  const std::string header_text(bytes.begin() + 8, bytes.begin() + 8 + static_cast<std::ptrdiff_t>(header_bytes));
  EXPECT_EQ(header_text.front(), '{');
  const json header = json::parse(header_text);
  ASSERT_TRUE(header.is_object());

  ASSERT_TRUE(header.contains("__metadata__"));
  for (const auto& [key, value] : header["__metadata__"].items()) EXPECT_TRUE(value.is_string()) << key;
  EXPECT_EQ(header["__metadata__"]["format"], "pt");

  // Sorted by name and packed: each tensor starts where the previous one ended.
  std::vector<std::string> names;
  for (const SafetensorsEntry& e : entries) names.push_back(e.name);
  std::sort(names.begin(), names.end());
  EXPECT_EQ(header.size(), names.size() + 1);
  uint64_t expected_begin = 0;
  const size_t data_start = 8 + header_bytes;
  for (const std::string& name : names) {
    SCOPED_TRACE(name);
    const SafetensorsEntry& want =
        *std::find_if(entries.begin(), entries.end(), [&](const SafetensorsEntry& e) { return e.name == name; });
    const json& info = header.at(name);
    EXPECT_EQ(info.at("dtype"), want.dtype);
    EXPECT_EQ(info.at("shape").get<std::vector<int64_t>>(), want.shape);
    const auto offsets = info.at("data_offsets").get<std::vector<uint64_t>>();
    ASSERT_EQ(offsets.size(), 2u);
    EXPECT_EQ(offsets[0], expected_begin);
    EXPECT_EQ(offsets[1] - offsets[0], want.bytes.size());
    EXPECT_TRUE(std::equal(want.bytes.begin(), want.bytes.end(), bytes.begin() + static_cast<std::ptrdiff_t>(data_start + offsets[0])));
    EXPECT_EQ(header["__metadata__"].at(kSafetensorsCrcKeyPrefix + name),
              crc32_hex(crc32_of(want.bytes.data(), want.bytes.size())));
    expected_begin = offsets[1];
  }
  EXPECT_EQ(data_start + expected_begin, bytes.size()) << "no bytes after the last tensor";
}

TEST_F(SafetensorsTest, LoadsFilesFromOtherWritersWithoutChecksums) {
  // The reference writer orders data by dtype, then name, and may leave the header unpadded.
  const std::vector<int64_t> ids = {5, -6};
  const std::vector<float> values = {1.0f, 2.0f};
  std::vector<uint8_t> data(16 + 8);
  std::memcpy(data.data(), ids.data(), 16);
  std::memcpy(data.data() + 16, values.data(), 8);
  const std::string header =
      R"({"__metadata__":{"format":"pt"},"z_ids":{"dtype":"I64","shape":[2],"data_offsets":[0,16]},)"
      R"("a_values":{"dtype":"F32","shape":[2],"data_offsets":[16,24]}})";
  write_bytes(path("other.safetensors"), raw_file(header, data));

  const SafetensorsFile file = read_safetensors(path("other.safetensors"));
  ASSERT_EQ(file.entries.size(), 2u);
  EXPECT_EQ(file.entries[0].name, "z_ids") << "entries come back in data order";
  EXPECT_EQ(file.at("z_ids").bytes, std::vector<uint8_t>(data.begin(), data.begin() + 16));
  EXPECT_EQ(file.at("a_values").bytes, std::vector<uint8_t>(data.begin() + 16, data.end()));
  EXPECT_EQ(file.metadata.at("format"), "pt");
}

TEST_F(SafetensorsTest, FlippedDataByteFailsTheChecksumNamingTheTensor) {
  const std::vector<SafetensorsEntry> entries = sample_entries();
  write_safetensors(path("a.safetensors"), entries);
  std::vector<uint8_t> bytes = read_file_bytes(path("a.safetensors"));
  // "weight" sorts last, so its data is the file's final 24 bytes.
  bytes[bytes.size() - 10] ^= 0x01;
  write_bytes(path("a.safetensors"), bytes);
  const std::string message = error_message([&] { read_safetensors(path("a.safetensors")); });
  expect_contains(message, {path("a.safetensors"), "'weight'", "CRC32", "corrupt"});
}

TEST_F(SafetensorsTest, TruncatedFileIsReportedAsTruncated) {
  write_safetensors(path("a.safetensors"), sample_entries());
  std::vector<uint8_t> bytes = read_file_bytes(path("a.safetensors"));
  bytes.erase(bytes.end() - 5, bytes.end());  // erase, not resize: GCC 12 misreads a shrinking resize as a huge memset
  write_bytes(path("a.safetensors"), bytes);
  expect_contains(error_message([&] { read_safetensors(path("a.safetensors")); }),
                  {path("a.safetensors"), "truncated", "'weight'"});
}

TEST_F(SafetensorsTest, GarbageHeaderIsReportedAsInvalidJson) {
  write_safetensors(path("a.safetensors"), sample_entries());
  std::vector<uint8_t> bytes = read_file_bytes(path("a.safetensors"));
  const std::string garbage = "{not json at all";
  std::copy(garbage.begin(), garbage.end(), bytes.begin() + 8);
  write_bytes(path("a.safetensors"), bytes);
  expect_contains(error_message([&] { read_safetensors(path("a.safetensors")); }),
                  {path("a.safetensors"), "not valid JSON"});
}

TEST_F(SafetensorsTest, HeaderLengthBeyondTheFileIsRejected) {
  write_safetensors(path("a.safetensors"), sample_entries());
  std::vector<uint8_t> bytes = read_file_bytes(path("a.safetensors"));
  const uint64_t too_long = bytes.size();
  for (int i = 0; i < 8; ++i) bytes[static_cast<size_t>(i)] = static_cast<uint8_t>(too_long >> (8 * i));
  write_bytes(path("a.safetensors"), bytes);
  expect_contains(error_message([&] { read_safetensors(path("a.safetensors")); }),
                  {path("a.safetensors"), "header length " + std::to_string(too_long), "exceeds the file size"});

  for (int i = 0; i < 8; ++i) bytes[static_cast<size_t>(i)] = 0xff;  // 2^64 - 1, an absurd length
  write_bytes(path("a.safetensors"), bytes);
  expect_contains(error_message([&] { read_safetensors(path("a.safetensors")); }), {"header length"});
}

TEST_F(SafetensorsTest, FileShorterThanTheLengthPrefixIsRejected) {
  write_bytes(path("tiny.safetensors"), {1, 2, 3});
  expect_contains(error_message([&] { read_safetensors(path("tiny.safetensors")); }),
                  {path("tiny.safetensors"), "3 bytes", "shorter than the 8-byte header length"});
}

TEST_F(SafetensorsTest, MissingFileNamesThePath) {
  expect_contains(error_message([&] { read_safetensors(path("absent.safetensors")); }),
                  {path("absent.safetensors"), "No such file"});
}

TEST_F(SafetensorsTest, InconsistentOffsetsAreRejectedNamingTheTensor) {
  const std::vector<uint8_t> data(16, 0);
  struct Case {
    std::string header;
    std::vector<std::string> fragments;
  };
  const std::vector<Case> cases = {
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
       {"'b'", "overlaps tensor 'a'"}},
      {R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})", {"'a'", "span 16 bytes", "needs 12"}},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", {"'a'", "gap"}},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", {"8 unexpected bytes after the last tensor"}},
      {R"({"a":{"dtype":"F16","shape":[8],"data_offsets":[0,16]}})", {"'a'", "unsupported safetensors dtype 'F16'"}},
      {R"({"a":{"dtype":"F32","shape":[-4],"data_offsets":[0,16]}})", {"'a'", "non-negative"}},
      {R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[16,0]}})", {"'a'", "end before they begin"}},
      {R"({"a":{"dtype":"F32","shape":[4]}})", {"'a'", "data_offsets"}},
      {R"({"__metadata__":{"step":3},"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})",
       {"'__metadata__' key 'step'", "expected a string"}},
      {R"([1, 2, 3])", {"expected a JSON object"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.header);
    write_bytes(path("bad.safetensors"), raw_file(c.header, data));
    std::vector<std::string> fragments = c.fragments;
    fragments.push_back(path("bad.safetensors"));
    expect_contains(error_message([&] { read_safetensors(path("bad.safetensors")); }), fragments);
  }
}

TEST_F(SafetensorsTest, WriterRejectsInconsistentEntriesAndKeepsTheOldFile) {
  const std::vector<SafetensorsEntry> good = sample_entries();
  write_safetensors(path("a.safetensors"), good);

  std::vector<SafetensorsEntry> bad = good;
  bad[0].bytes.pop_back();
  expect_contains(error_message([&] { write_safetensors(path("a.safetensors"), bad); }),
                  {path("a.safetensors"), "'weight'", "23 bytes", "needs 24"});
  bad = good;
  bad.push_back(good[1]);
  expect_contains(error_message([&] { write_safetensors(path("a.safetensors"), bad); }), {"'half'", "twice"});
  expect_contains(error_message([&] { write_safetensors(path("a.safetensors"), good, {{"loom.crc32.x", "0"}}); }),
                  {"reserves"});

  expect_same_entries(good, read_safetensors(path("a.safetensors")));
  for (const fs::directory_entry& entry : fs::directory_iterator(dir_.path()))
    EXPECT_EQ(entry.path().filename(), "a.safetensors") << "stray file left behind";
}

TEST_F(SafetensorsTest, ChecksumKeyForAnAbsentTensorIsRejected) {
  const std::string header = R"({"__metadata__":{"loom.crc32.ghost":"00000000"}})";
  write_bytes(path("a.safetensors"), raw_file(header, {}));
  expect_contains(error_message([&] { read_safetensors(path("a.safetensors")); }), {"'loom.crc32.ghost'"});
}

TEST_F(SafetensorsTest, EmptyFileRoundTrips) {
  write_safetensors(path("empty.safetensors"), {});
  const SafetensorsFile file = read_safetensors(path("empty.safetensors"));
  EXPECT_TRUE(file.entries.empty());
  EXPECT_TRUE(file.metadata.empty());
}

TEST_F(SafetensorsTest, AtNamesTheMissingTensorAndTheFile) {
  write_safetensors(path("a.safetensors"), sample_entries());
  const SafetensorsFile file = read_safetensors(path("a.safetensors"));
  expect_contains(error_message([&] { file.at("nope"); }), {"'nope'", path("a.safetensors")});
  EXPECT_EQ(file.find("nope"), nullptr);
}

TEST_F(SafetensorsTest, TensorBridgeRoundTripsF32AndBf16) {
  Tensor f32 = Tensor::empty({2, 2}, DType::F32, MemCategory::Workspace);
  for (int i = 0; i < 4; ++i) f32.f32()[i] = 0.1f * static_cast<float>(i) - 0.15f;
  Tensor bf16 = Tensor::empty({3}, DType::BF16, MemCategory::Workspace);
  for (int i = 0; i < 3; ++i) bf16.bf16()[i] = static_cast<uint16_t>(0x3f80 + i);

  write_safetensors(path("t.safetensors"), {entry_from_tensor("f", f32), entry_from_tensor("b", bf16)});
  const SafetensorsFile file = read_safetensors(path("t.safetensors"));
  EXPECT_EQ(file.at("f").dtype, "F32");
  EXPECT_EQ(file.at("b").dtype, "BF16");

  const Tensor f32_back = tensor_from_entry(file.at("f"), MemCategory::Parameters);
  const Tensor bf16_back = tensor_from_entry(file.at("b"), MemCategory::Parameters);
  EXPECT_EQ(f32_back.shape(), f32.shape());
  EXPECT_EQ(f32_back.dtype(), DType::F32);
  EXPECT_EQ(f32_back.category(), MemCategory::Parameters);
  EXPECT_EQ(std::memcmp(f32_back.raw(), f32.raw(), f32.nbytes()), 0);
  EXPECT_EQ(bf16_back.dtype(), DType::BF16);
  EXPECT_EQ(std::memcmp(bf16_back.raw(), bf16.raw(), bf16.nbytes()), 0);

  const SafetensorsEntry ints = make_entry<int32_t>("ints", "I32", {1}, {3});
  expect_contains(error_message([&] { tensor_from_entry(ints, MemCategory::Workspace); }), {"'ints'", "I32"});
}

TEST_F(SafetensorsTest, AtomicWriteReplacesWholeFilesAndNamesBadPaths) {
  atomic_write_file(path("f.txt"), std::string("first version, longer"));
  atomic_write_file(path("f.txt"), std::string("second"));
  const std::vector<uint8_t> bytes = read_file_bytes(path("f.txt"));
  EXPECT_EQ(std::string(bytes.begin(), bytes.end()), "second");
  size_t files = 0;
  for ([[maybe_unused]] const auto& entry : fs::directory_iterator(dir_.path())) ++files;
  EXPECT_EQ(files, 1u) << "the temp file must be renamed away";

  const std::string bad = path("no_such_dir/f.txt");
  expect_contains(error_message([&] { atomic_write_file(bad, std::string("x")); }), {bad, "No such file"});
}

TEST(Crc32, MatchesTheStandardCheckValue) {
  // CRC-32/ISO-HDLC check value for "123456789" (the catalogue value zlib implements).
  const std::string text = "123456789";
  EXPECT_EQ(crc32_hex(crc32_of(text.data(), text.size())), "cbf43926");
}

}  // namespace
}  // namespace loom::test
