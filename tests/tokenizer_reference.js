// Reference GPT-2 encoder for tests/test_tokenizer.cpp: prints the token ids of a UTF-8 text
// file as a JSON array, computed by the npm package gpt-3-encoder (a port of openai/gpt-2's
// encoder.py that this project did not write).
// Usage: LOOM_NPM_DIR=<node_modules dir> node tokenizer_reference.js <textfile>
'use strict';
const fs = require('fs');
const path = require('path');

const npmDir = process.env.LOOM_NPM_DIR;
if (!npmDir || process.argv.length !== 3) {
  console.error('usage: LOOM_NPM_DIR=<node_modules dir> node tokenizer_reference.js <textfile>');
  process.exit(2);
}
const { encode } = require(path.join(npmDir, 'gpt-3-encoder'));
const text = fs.readFileSync(process.argv[2], 'utf-8');
process.stdout.write(JSON.stringify(encode(text)) + '\n');
