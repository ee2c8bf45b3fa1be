#include "loom/data/tokenize_corpus.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "loom/core/error.hpp"
#include "loom/data/token_shard.hpp"

namespace loom {
namespace {

// Documents encoded per parallel round: enough to keep every thread busy with dynamic
// scheduling, few enough that only this many documents' tokens are held at once.
constexpr size_t kDocumentsPerRound = 256;
// Added tokens' text in a document is ordinary text; no template around documents.
constexpr EncodeOptions kCorpusEncoding{.recognise_added_tokens = false, .add_special_tokens = false};

std::string shard_path(const std::string& prefix, const char* split, int64_t index) {
  char suffix[32];
  std::snprintf(suffix, sizeof(suffix), "_%s_%06lld.bin", split, static_cast<long long>(index));
  return prefix + suffix;
}

// Accumulates one split's tokens and writes a shard each time shard_tokens are gathered.
class ShardSequenceWriter {
 public:
  ShardSequenceWriter(std::string prefix, const char* split, int64_t shard_tokens, int64_t vocab_size)
      : prefix_(std::move(prefix)), split_(split), shard_tokens_(shard_tokens), vocab_size_(vocab_size) {}

  void append(int32_t token, std::vector<std::string>& files_written) {
    buffer_.push_back(token);
    ++total_tokens_;
    if (static_cast<int64_t>(buffer_.size()) == shard_tokens_) flush(files_written);
  }

  void finish(std::vector<std::string>& files_written) {
    if (!buffer_.empty()) flush(files_written);
    // A leftover shard from an earlier, larger run would be globbed as if it were ours.
    const std::string stale = shard_path(prefix_, split_, shards_written_);
    if (std::filesystem::exists(stale)) {
      throw_error("tokenize_corpus: wrote ", shards_written_, " ", split_, " shards, but '", stale,
                  "' also exists from an earlier run; delete it or a loader would read it as data");
    }
  }

  int64_t total_tokens() const { return total_tokens_; }

 private:
  void flush(std::vector<std::string>& files_written) {
    const std::string path = shard_path(prefix_, split_, shards_written_++);
    write_token_shard(path, buffer_, vocab_size_);
    files_written.push_back(path);
    buffer_.clear();
  }

  std::string prefix_;
  const char* split_;
  int64_t shard_tokens_;
  int64_t vocab_size_;
  std::vector<int32_t> buffer_;
  int64_t shards_written_ = 0;
  int64_t total_tokens_ = 0;
};

std::string read_document(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw_error("cannot open document '", path, "': ", std::strerror(errno));
  std::ostringstream contents;
  contents << in.rdbuf();
  if (in.bad()) throw_error("error reading document '", path, "'");
  return contents.str();
}

int64_t validation_document_count(double val_fraction, int64_t documents) {
  if (val_fraction <= 0) return 0;
  // The epsilon keeps e.g. 0.7 * 10 = 7.000000000000001 from rounding up to 8 documents.
  const auto count = static_cast<int64_t>(std::ceil(val_fraction * static_cast<double>(documents) - 1e-9));
  return std::max<int64_t>(1, count);
}

}  // namespace

TokenizeResult tokenize_corpus(const std::vector<std::string>& input_files, const BpeTokenizer& tokenizer,
                               const std::string& output_prefix, double val_fraction, int64_t shard_tokens,
                               std::optional<int32_t> document_token) {
  if (input_files.empty()) throw_error("tokenize_corpus: no input files given");
  if (!(val_fraction >= 0.0 && val_fraction < 1.0)) {
    throw_error("tokenize_corpus: val_fraction must be in [0, 1), got ", val_fraction);
  }
  if (shard_tokens <= 0 || shard_tokens > std::numeric_limits<int32_t>::max()) {
    throw_error("tokenize_corpus: shard_tokens must be in [1, ", std::numeric_limits<int32_t>::max(),
                "], got ", shard_tokens);
  }
  // Everything that could refuse the output is checked before the first shard is written.
  const int64_t vocab_size = tokenizer.vocab_size();
  if (vocab_size > kMaxWideShardVocab) {
    throw_error("tokenize_corpus: the vocabulary of '", tokenizer.source(), "' has ", vocab_size,
                " ids, more than llm.c's shard formats hold (", kMaxWideShardVocab, ", 32-bit ids)");
  }
  const int32_t separator = document_token ? *document_token : tokenizer.document_token();
  if (separator < 0 || separator >= vocab_size) {
    throw_error("tokenize_corpus: document token ", separator, " is outside the vocabulary [0, ", vocab_size,
                ") of '", tokenizer.source(), "'");
  }
  const auto documents = static_cast<int64_t>(input_files.size());
  const int64_t val_documents = validation_document_count(val_fraction, documents);
  if (val_documents >= documents) {
    throw_error("tokenize_corpus: val_fraction ", val_fraction, " puts all ", documents,
                " documents in the validation split, leaving none for training");
  }
  const int64_t first_val_document = documents - val_documents;

  TokenizeResult result;
  result.documents = documents;
  ShardSequenceWriter train(output_prefix, "train", shard_tokens, vocab_size);
  ShardSequenceWriter val(output_prefix, "val", shard_tokens, vocab_size);
  for (size_t round_begin = 0; round_begin < input_files.size(); round_begin += kDocumentsPerRound) {
    const size_t round_size = std::min(kDocumentsPerRound, input_files.size() - round_begin);
    std::vector<std::vector<int32_t>> encoded(round_size);
    std::vector<std::string> failures(round_size);
    // Exceptions must not leave an OpenMP region; each document records its own failure.
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t k = 0; k < static_cast<int64_t>(round_size); ++k) {
      try {
        encoded[k] = tokenizer.encode(read_document(input_files[round_begin + k]), kCorpusEncoding);
      } catch (const std::exception& e) {
        failures[k] = e.what();
      }
    }
    for (size_t k = 0; k < round_size; ++k) {
      const size_t document = round_begin + k;
      if (!failures[k].empty()) {
        throw_error("tokenize_corpus: document ", document, " ('", input_files[document],
                    "'): ", failures[k]);
      }
      if (static_cast<int64_t>(document) == first_val_document) train.finish(result.files_written);
      ShardSequenceWriter& split = static_cast<int64_t>(document) < first_val_document ? train : val;
      split.append(separator, result.files_written);
      for (const int32_t token : encoded[k]) split.append(token, result.files_written);
    }
  }
  if (val_documents == 0) train.finish(result.files_written);
  val.finish(result.files_written);
  result.train_tokens = train.total_tokens();
  result.val_tokens = val.total_tokens();
  return result;
}

}  // namespace loom
