#pragma once
// Turns a set of text files into llm.c token shards, as llm.c's dev/data scripts do: every
// document is preceded by the document token (GPT-2: <|endoftext|>; llm.c's Llama 3 data:
// <|begin_of_text|>), documents are concatenated in the given order and cut into shards of a
// fixed size (a document may straddle two shards), and the last documents form the validation
// split. Shards hold uint16 tokens when the vocabulary fits 65,536 ids, else uint32 (llm.c's
// Llama 3 format). Text that spells an added token ("<|end_of_text|>") is encoded as ordinary
// characters, as llm.c does (split_special_tokens): only the document tokens are control tokens.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "loom/data/bpe_tokenizer.hpp"

namespace loom {

struct TokenizeResult {
  int64_t train_tokens = 0;
  int64_t val_tokens = 0;
  int64_t documents = 0;
  std::vector<std::string> files_written;  // in write order: train shards, then val shards
};

// Each input file is one UTF-8 document. The last ceil(val_fraction * documents) documents (at
// least one when val_fraction > 0) go to <prefix>_val_000000.bin, ...; the others to
// <prefix>_train_000000.bin, ...; each shard holds at most shard_tokens tokens. Documents are
// encoded in parallel with OpenMP; the output does not depend on the thread count.
// document_token: the id before each document; by default the tokenizer's document_token().
TokenizeResult tokenize_corpus(const std::vector<std::string>& input_files, const BpeTokenizer& tokenizer,
                               const std::string& output_prefix, double val_fraction, int64_t shard_tokens,
                               std::optional<int32_t> document_token = std::nullopt);

}  // namespace loom
