// BpeTokenizer's tokenizer.json reader on files it must refuse (features it cannot encode
// exactly, vocabularies too large for token shards, unreadable files), each refusal naming the
// file and the problem, and a tiny byte-level file that loads and merges. The files of real
// models are tests/test_tokenizer_json.cpp's.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/data/bpe_tokenizer.hpp"
#include "test_support.hpp"
#include "tokenizer_json_support.hpp"

namespace loom::test {
namespace {

using nlohmann::json;
using ::testing::AllOf;
using ::testing::HasSubstr;

// --- Files loom cannot encode exactly: refused at load, naming the file and the feature.

std::string load_error(const TempDir& dir, const std::string& name, const json& file) {
  write_text_file(dir.file(name), file.dump());
  return error_message([&] { BpeTokenizer::load_tokenizer_json(dir.file(name)); });
}

TEST(TokenizerJson, TinyByteLevelFileLoadsAndMerges) {
  TempDir dir("loom_test_tokenizer_json");
  write_text_file(dir.file("tiny.json"), tiny_byte_level_file().dump());
  const BpeTokenizer tiny = BpeTokenizer::load_tokenizer_json(dir.file("tiny.json"));
  EXPECT_EQ(tiny.encode("abc ab"),
            (std::vector<int32_t>{256, 'c', ' ', 256}));  // pieces "abc", " ab"
  EXPECT_FALSE(tiny.has_document_token());
}

// What fuzz_tokenizer_json found (2026-11-27): a TemplateProcessing piece whose "id" is not a
// string escaped as nlohmann's type_error; now an error naming the file and the piece, as are a
// piece that is not an object and special_tokens that is not one.
TEST(TokenizerJson, TemplatePiecesOfTheWrongTypeAreErrors) {
  TempDir dir("loom_test_tokenizer_json");
  json file = tiny_byte_level_file();
  file["post_processor"] = {{"type", "TemplateProcessing"},
                            {"single", json::parse(R"([{"SpecialToken": {"id": 7}}])")},
                            {"special_tokens", json::object()}};
  EXPECT_THAT(load_error(dir, "numeric_id.json", file),
              AllOf(HasSubstr(dir.file("numeric_id.json")), HasSubstr("its id is not a string")));
  file["post_processor"]["single"] = json::parse(R"([{"Sequence": {"id": ["A"]}}])");
  EXPECT_THAT(load_error(dir, "sequence_id.json", file), HasSubstr("its id is not a string"));
  file["post_processor"]["single"] = json::parse("[3]");
  EXPECT_THAT(load_error(dir, "scalar_piece.json", file), HasSubstr("is not an object"));
  file["post_processor"]["single"] = json::parse(R"([{"Sequence": {"id": "A"}}])");
  file["post_processor"]["special_tokens"] = json::array();
  EXPECT_THAT(load_error(dir, "special_list.json", file),
              HasSubstr("'special_tokens' is not an object"));
}

TEST(TokenizerJson, RefusesWhatItCannotEncodeExactly) {
  TempDir dir("loom_test_tokenizer_json");
  const auto refused = [&](const std::string& name, const json& file, const std::string& feature) {
    const std::string message = load_error(dir, name, file);
    EXPECT_THAT(message, AllOf(HasSubstr(dir.file(name)), HasSubstr(feature))) << name;
  };
  json wordpiece = {
      {"model",
       {{"type", "WordPiece"}, {"unk_token", "[UNK]"}, {"vocab", {{"[UNK]", 0}, {"a", 1}}}}},
      {"normalizer", {{"type", "BertNormalizer"}}},
      {"pre_tokenizer", {{"type", "BertPreTokenizer"}}}};
  refused("wordpiece.json", wordpiece, "normalizer 'BertNormalizer' is not supported");
  wordpiece["normalizer"] = nullptr;
  refused("wordpiece.json", wordpiece, "model type 'WordPiece' is not supported");
  refused("unigram.json", {{"model", {{"type", "Unigram"}, {"vocab", {{"<unk>", 0.0}}}}}},
          "model type 'Unigram'");

  // Llama 2 style: SentencePiece BPE with byte fallback and "▁" for spaces.
  json llama2 = tiny_byte_level_file();
  llama2["model"]["byte_fallback"] = true;
  refused("llama2.json", llama2, "byte_fallback is not supported");
  llama2["model"]["byte_fallback"] = false;
  llama2["model"]["vocab"]["\u2581the"] = 257;
  refused("llama2.json", llama2, "not spelled in the byte-level alphabet");

  json file = tiny_byte_level_file();
  file["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "\u2581"}};
  refused("metaspace.json", file, "pre-tokenizer 'Metaspace' is not supported");
  file["pre_tokenizer"] = {{"type", "Split"},
                           {"pattern", {{"Regex", "\\s+"}}},
                           {"behavior", "Isolated"},
                           {"invert", false}};
  refused("no_byte_level.json", file, "pre_tokenizer without ByteLevel");
  file = tiny_byte_level_file();
  file["pre_tokenizer"]["add_prefix_space"] = true;
  refused("prefix_space.json", file, "add_prefix_space = true");
  file = tiny_byte_level_file();
  file["added_tokens"] = {
      {{"id", 257}, {"content", "<mask>"}, {"lstrip", true}, {"special", true}}};
  refused("lstrip.json", file, "'<mask>' with lstrip = true");
  file = tiny_byte_level_file();
  file["post_processor"] = {{"type", "RobertaProcessing"}};
  refused("roberta.json", file, "post-processor 'RobertaProcessing'");
  file = tiny_byte_level_file();
  file["model"]["dropout"] = 0.1;
  refused("dropout.json", file, "dropout");
  file = tiny_byte_level_file();
  file["truncation"] = {{"max_length", 512}};
  refused("truncation.json", file, "'truncation' is set");
  file = tiny_byte_level_file();
  file["model"]["merges"] = {"a zz"};
  refused("bad_merge.json", file, "'zz' is not in the vocabulary");
  file["model"]["vocab"].erase("\u0120");  // the byte-level spelling of the space byte
  file["model"]["merges"] = json::array();
  refused("no_space_byte.json", file, "no token for byte 32");
  EXPECT_THAT(error_message([&] { BpeTokenizer::load_tokenizer_json(dir.file("absent.json")); }),
              AllOf(HasSubstr(dir.file("absent.json")), HasSubstr("cannot open")));
  write_text_file(dir.file("broken.json"), "{\"model\": ");
  EXPECT_THAT(error_message([&] { BpeTokenizer::load_tokenizer_json(dir.file("broken.json")); }),
              AllOf(HasSubstr(dir.file("broken.json")), HasSubstr("not valid JSON")));
}

// Ids beyond what loom (int32) and shards (at most uint32) hold: refused at load, before any
// shard could be written.
TEST(TokenizerJson, RefusesVocabulariesTooLargeForShards) {
  TempDir dir("loom_test_tokenizer_json");
  json file = tiny_byte_level_file();
  file["added_tokens"] = {{{"id", 4294967296LL}, {"content", "<|huge|>"}, {"special", true}}};
  EXPECT_THAT(load_error(dir, "huge_added.json", file),
              AllOf(HasSubstr(dir.file("huge_added.json")), HasSubstr("4294967296"),
                    HasSubstr("too large")));
  file = tiny_byte_level_file();
  file["model"]["vocab"]["zzz"] = 3000000000LL;
  EXPECT_THAT(load_error(dir, "huge_vocab.json", file),
              AllOf(HasSubstr("3000000000"), HasSubstr("too large")));
  file["model"]["vocab"]["zzz"] = 50'000'000;  // fits int32, but 50M ids for 258 tokens
  EXPECT_THAT(load_error(dir, "sparse.json", file), HasSubstr("too sparse"));
}

}  // namespace
}  // namespace loom::test
