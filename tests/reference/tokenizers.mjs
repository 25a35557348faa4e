#!/usr/bin/env node
// The JavaScript reference tokenizers that tests/unit/test_tokenizer_reference.cc and
// bench/tokenize_speed.sh compare meshtrain's tokenizers against.
//
//   node tokenizers.mjs FAMILY INPUT OUTPUT   encode each document of INPUT, write OUTPUT
//   node tokenizers.mjs --bench FAMILY INPUT  time encode over INPUT, print MB/s
//
// INPUT is a JSON array of strings (the documents). OUTPUT gets one line per document: the
// JSON array of its ids. FAMILY names the package and how it is called (never with BOS/EOS):
//
//   llama3        llama3-tokenizer-js        encode(text, {bos: false, eos: false})
//   llama2        llama-tokenizer-js         encode(text, false): no BOS, "▁" prepended
//   mistral       mistral-tokenizer-js       encode(text, false): no BOS, "▁" prepended
//   cl100k_base   js-tiktoken                getEncoding(name).encode(text, "all")
//   o200k_base    js-tiktoken                (allowed_special "all")
//   hf:PATH       @huggingface/tokenizers    new Tokenizer(PATH/tokenizer.json,
//                                            PATH/tokenizer_config.json or {}).encode(text,
//                                            {add_special_tokens: false}).ids
//
// The packages are read from data/npm/node_modules beside this checkout (what
// scripts/setup.sh installs), or from $MESHTRAIN_NPM_MODULES.
//
// --bench loads the tokenizer, encodes the first tenth of the documents once to warm the JIT
// (and whatever caches the package keeps, as a long-running process would have), then times
// one encode of every document and prints one line:
//   FAMILY: N documents, B bytes, T tokens, S s, R MB/s (load L s)
// MB is 10^6 bytes of UTF-8 text.
import fs from 'node:fs';
import path from 'node:path';
import { pathToFileURL } from 'node:url';

const modules = process.env.MESHTRAIN_NPM_MODULES ??
  path.join(import.meta.dirname, '..', '..', 'data', 'npm', 'node_modules');

function usage(message) {
  if (message) console.error(`tokenizers.mjs: ${message}`);
  console.error('usage: node tokenizers.mjs FAMILY INPUT OUTPUT | node tokenizers.mjs --bench FAMILY INPUT\n' +
    'FAMILY: llama3, llama2, mistral, cl100k_base, o200k_base, hf:PATH');
  process.exit(2);
}

async function importPackage(name, subpath) {
  const dir = path.join(modules, name);
  const pkgFile = path.join(dir, 'package.json');
  if (!fs.existsSync(pkgFile)) {
    console.error(`tokenizers.mjs: npm package ${name} is not under ${modules} (run scripts/setup.sh)`);
    process.exit(1);
  }
  if (subpath) return import(pathToFileURL(path.join(dir, subpath)).href);
  const pkg = JSON.parse(fs.readFileSync(pkgFile, 'utf8'));
  let entry = pkg.main ?? 'index.js';
  const exp = pkg.exports?.['.'];
  if (exp?.import) entry = typeof exp.import === 'string' ? exp.import : exp.import.default;
  return import(pathToFileURL(path.join(dir, entry)).href);
}

// Returns text => ids for FAMILY.
async function loadEncoder(family) {
  switch (family) {
    case 'llama3': {
      const tok = (await importPackage('llama3-tokenizer-js')).default;
      return (text) => tok.encode(text, { bos: false, eos: false });
    }
    case 'llama2': {
      const tok = (await importPackage('llama-tokenizer-js')).default;
      return (text) => tok.encode(text, false, true);
    }
    case 'mistral': {
      const tok = (await importPackage('mistral-tokenizer-js')).default;
      return (text) => tok.encode(text, false, true);
    }
    case 'cl100k_base':
    case 'o200k_base': {
      const { Tiktoken } = await importPackage('js-tiktoken', 'dist/lite.js');
      const ranks = (await importPackage('js-tiktoken', `dist/ranks/${family}.js`)).default;
      const enc = new Tiktoken(ranks);
      return (text) => enc.encode(text, 'all');
    }
    default: {
      if (!family.startsWith('hf:')) usage(`unknown FAMILY ${family}`);
      const dir = family.slice(3);
      const { Tokenizer } = await importPackage('@huggingface/tokenizers');
      const read = (name, fallback) => {
        const file = path.join(dir, name);
        if (!fs.existsSync(file) && fallback !== undefined) return fallback;
        return JSON.parse(fs.readFileSync(file, 'utf8'));
      };
      const tok = new Tokenizer(read('tokenizer.json'), read('tokenizer_config.json', {}));
      return (text) => tok.encode(text, { add_special_tokens: false }).ids;
    }
  }
}

function readDocuments(file) {
  const docs = JSON.parse(fs.readFileSync(file, 'utf8'));
  if (!Array.isArray(docs) || docs.some((d) => typeof d !== 'string')) usage(`${file} is not a JSON array of strings`);
  return docs;
}

const args = process.argv.slice(2);
if (args[0] === '--bench') {
  if (args.length !== 3) usage();
  const [, family, input] = args;
  const docs = readDocuments(input);
  const loadStart = performance.now();
  const encode = await loadEncoder(family);
  const loadSeconds = (performance.now() - loadStart) / 1000;
  for (let i = 0; i < Math.ceil(docs.length / 10); ++i) encode(docs[i]);
  let tokens = 0;
  const start = performance.now();
  for (const d of docs) tokens += encode(d).length;
  const seconds = (performance.now() - start) / 1000;
  const bytes = docs.reduce((n, d) => n + Buffer.byteLength(d, 'utf8'), 0);
  console.log(`${family}: ${docs.length} documents, ${bytes} bytes, ${tokens} tokens, ` +
    `${seconds.toFixed(3)} s, ${(bytes / 1e6 / seconds).toFixed(2)} MB/s (load ${loadSeconds.toFixed(2)} s)`);
} else {
  if (args.length !== 3) usage();
  const [family, input, output] = args;
  const docs = readDocuments(input);
  const encode = await loadEncoder(family);
  const lines = docs.map((d) => JSON.stringify(encode(d)));
  fs.writeFileSync(output, lines.length ? lines.join('\n') + '\n' : '');
}
