#include "data/bpe_pipeline.h"

#include <unicode/locid.h>
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>

#include <algorithm>

#include "data/byte_text.h"

namespace meshtrain::data {

namespace {

bool is_ascii(std::string_view s) {
  for (char c : s) {
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  }
  return true;
}

// Calls fn(run) on each maximal stretch of valid UTF-8 and appends every invalid byte to
// `out` unchanged: ICU only takes valid text, and the bytes must survive for decode.
template <typename Fn>
void for_each_valid_run(std::string_view in, std::string* out, Fn&& fn) {
  size_t start = 0, i = 0;
  while (i < in.size()) {
    char32_t cp = 0;
    const size_t n = decode_utf8(in, i, &cp);
    if (n > 0) {
      i += n;
      continue;
    }
    if (i > start) fn(in.substr(start, i - start));
    out->push_back(in[i]);
    start = ++i;
  }
  if (i > start) fn(in.substr(start, i - start));
}

const icu::Normalizer2* icu_normalizer(NormalizerStep::Kind kind) {
  UErrorCode err = U_ZERO_ERROR;
  switch (kind) {
    case NormalizerStep::Kind::kNfc: return icu::Normalizer2::getNFCInstance(err);
    case NormalizerStep::Kind::kNfd: return icu::Normalizer2::getNFDInstance(err);
    case NormalizerStep::Kind::kNfkc: return icu::Normalizer2::getNFKCInstance(err);
    case NormalizerStep::Kind::kNfkd: return icu::Normalizer2::getNFKDInstance(err);
    default: return nullptr;
  }
}

void unicode_normalize(const icu::Normalizer2* norm, std::string_view in, std::string* out) {
  for_each_valid_run(in, out, [&](std::string_view run) {
    if (is_ascii(run) || norm == nullptr) {  // every normal form leaves ASCII alone
      out->append(run);
      return;
    }
    const icu::UnicodeString u = icu::UnicodeString::fromUTF8(icu::StringPiece(run.data(), int32_t(run.size())));
    UErrorCode err = U_ZERO_ERROR;
    if (norm->isNormalized(u, err) && U_SUCCESS(err)) {
      out->append(run);
      return;
    }
    err = U_ZERO_ERROR;
    const icu::UnicodeString normalized = norm->normalize(u, err);
    if (U_FAILURE(err)) {
      out->append(run);
    } else {
      normalized.toUTF8String(*out);
    }
  });
}

void lowercase(std::string_view in, std::string* out) {
  for_each_valid_run(in, out, [&](std::string_view run) {
    if (is_ascii(run)) {
      for (char c : run) out->push_back(c >= 'A' && c <= 'Z' ? char(c + 32) : c);
      return;
    }
    icu::UnicodeString u = icu::UnicodeString::fromUTF8(icu::StringPiece(run.data(), int32_t(run.size())));
    u.toLower(icu::Locale::getRoot());
    u.toUTF8String(*out);
  });
}

bool space_at(std::string_view s, size_t i, size_t* length) {
  char32_t cp = 0;
  const size_t n = decode_utf8(s, i, &cp);
  *length = n;
  return n > 0 && u_isUWhiteSpace(UChar32(cp));
}

void strip(std::string_view in, bool left, bool right, std::string* out) {
  size_t begin = 0, end = in.size(), n = 0;
  if (left) {
    while (begin < end && space_at(in, begin, &n)) begin += n;
  }
  if (right) {
    while (end > begin) {
      size_t start = end - 1;
      while (start > begin && end - start < 4 && is_utf8_continuation(static_cast<unsigned char>(in[start]))) --start;
      if (!space_at(in, start, &n) || start + n != end) break;
      end = start;
    }
  }
  out->append(in.substr(begin, end - begin));
}

// Appends `in` with every match (literal `pattern`, or `regex`) replaced by `content`.
void replace(std::string_view in, const NormalizerStep& step, std::string* out) {
  size_t copied = 0;
  const auto on_match = [&](size_t begin, size_t end) {
    out->append(in.substr(copied, begin - copied));
    out->append(step.content);
    copied = end;
  };
  if (step.regex) {
    step.regex->for_each_match(in, on_match);
  } else if (!step.text.empty()) {
    for (size_t hit = in.find(step.text); hit != std::string_view::npos; hit = in.find(step.text, copied)) {
      on_match(hit, hit + step.text.size());
    }
  }
  out->append(in.substr(copied));
}

struct Range {
  size_t begin, end;
  bool match;
};

struct Piece {
  size_t begin, end;  // in the scratch arena
  bool at_start;      // begins the whole text (Metaspace's "first" scheme)
};

}  // namespace

struct BpePipeline::Scratch {
  std::string normalized, swap;
  std::string arena;
  std::vector<Piece> pieces, next;
  std::vector<Range> ranges;
  std::vector<int> symbols;
};

void BpePipeline::normalize(std::string_view in, std::string* out) const {
  std::string current(in), next;
  for (const NormalizerStep& step : normalizers) {
    next.clear();
    switch (step.kind) {
      case NormalizerStep::Kind::kNfc:
      case NormalizerStep::Kind::kNfd:
      case NormalizerStep::Kind::kNfkc:
      case NormalizerStep::Kind::kNfkd: unicode_normalize(icu_normalizer(step.kind), current, &next); break;
      case NormalizerStep::Kind::kLowercase: lowercase(current, &next); break;
      case NormalizerStep::Kind::kPrepend:
        if (!current.empty()) next = step.text + current;
        break;
      case NormalizerStep::Kind::kReplace: replace(current, step, &next); break;
      case NormalizerStep::Kind::kStrip: strip(current, step.left, step.right, &next); break;
    }
    current.swap(next);
  }
  *out = std::move(current);
}

// ---------------------------------------------------------------------------------------
// Pre-tokenization: each step turns the current pieces (ranges of the arena) into new ones.
// Steps that rewrite text (Metaspace, ByteLevel's prefix space) append the new text to the
// arena, so pieces stay offsets and the arena one buffer.

namespace {

// Turns the match/gap ranges of one piece into pieces, as Hugging Face's
// NormalizedString::split does for each delimiter behavior (a "match" is a delimiter).
void apply_behavior(const std::vector<Range>& ranges, SplitBehavior behavior, bool at_start, size_t piece_begin,
                    std::vector<Piece>* out) {
  const size_t first = out->size();
  const auto push = [&](size_t b, size_t e) { out->push_back(Piece{b, e, at_start && b == piece_begin}); };
  bool previous = false;
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (const Range& r : ranges) push(r.begin, r.end);
      break;
    case SplitBehavior::kRemoved:
      for (const Range& r : ranges) {
        if (!r.match) push(r.begin, r.end);
      }
      break;
    case SplitBehavior::kContiguous:
      for (const Range& r : ranges) {
        if (r.match == previous && out->size() > first) {
          out->back().end = r.end;
        } else {
          push(r.begin, r.end);
        }
        previous = r.match;
      }
      break;
    case SplitBehavior::kMergedWithPrevious:
      for (const Range& r : ranges) {
        if (r.match && !previous && out->size() > first) {
          out->back().end = r.end;
        } else {
          push(r.begin, r.end);
        }
        previous = r.match;
      }
      break;
    case SplitBehavior::kMergedWithNext:
      for (auto r = ranges.rbegin(); r != ranges.rend(); ++r) {
        if (r->match && !previous && out->size() > first) {
          out->back().begin = r->begin;
          out->back().at_start = at_start && r->begin == piece_begin;
        } else {
          push(r->begin, r->end);
        }
        previous = r->match;
      }
      std::reverse(out->begin() + std::ptrdiff_t(first), out->end());
      break;
  }
  // Empty pieces carry nothing; drop them (a regex may match the empty string).
  out->erase(std::remove_if(out->begin() + std::ptrdiff_t(first), out->end(),
                            [](const Piece& p) { return p.begin == p.end; }),
             out->end());
}

// The delimiter matches of `step` in arena[p], as ranges covering the whole piece.
void find_delimiters(const PreTokenizerStep& step, std::string_view arena, const Piece& p, std::vector<Range>* ranges) {
  ranges->clear();
  const std::string_view text = arena.substr(p.begin, p.end - p.begin);
  size_t last = 0;
  const auto on_match = [&](size_t b, size_t e) {
    if (b > last) ranges->push_back(Range{p.begin + last, p.begin + b, false});
    ranges->push_back(Range{p.begin + b, p.begin + e, true});
    last = e;
  };
  if (step.kind == PreTokenizerStep::Kind::kDigits) {
    for (size_t i = 0; i < text.size(); ++i) {
      if (text[i] >= '0' && text[i] <= '9') on_match(i, i + 1);
    }
  } else if (step.regex) {
    step.regex->for_each_match(text, on_match);
  } else {
    const std::string& lit = step.kind == PreTokenizerStep::Kind::kMetaspace ? step.replacement : step.literal;
    if (!lit.empty()) {
      for (size_t hit = text.find(lit); hit != std::string_view::npos; hit = text.find(lit, last)) {
        on_match(hit, hit + lit.size());
      }
    }
  }
  if (last < text.size()) ranges->push_back(Range{p.begin + last, p.end, false});
  if (step.invert) {
    for (Range& r : *ranges) r.match = !r.match;
  }
}

// Appends `bytes` (which may live in the arena itself) to the arena; returns its offset.
size_t arena_append(std::string* arena, size_t from, size_t length, std::string_view prefix) {
  arena->reserve(arena->size() + prefix.size() + length);  // no reallocation below
  const size_t at = arena->size();
  arena->append(prefix);
  arena->append(arena->data() + from, length);
  return at;
}

}  // namespace

void BpePipeline::pre_tokenize_and_encode(std::string_view text, bool at_start, std::vector<int>* ids,
                                          Scratch& s) const {
  if (pre_tokenizers.empty()) {
    encode_piece(text, ids, &s.symbols);
    return;
  }
  s.arena.assign(text);
  s.pieces.assign(1, Piece{0, text.size(), at_start});
  for (const PreTokenizerStep& step : pre_tokenizers) {
    s.next.clear();
    for (Piece p : s.pieces) {
      switch (step.kind) {
        case PreTokenizerStep::Kind::kByteLevel:
          if (step.add_prefix_space && s.arena[p.begin] != ' ') {
            const size_t at = arena_append(&s.arena, p.begin, p.end - p.begin, " ");
            p = Piece{at, s.arena.size(), p.at_start};
          }
          if (!step.regex) {
            s.next.push_back(p);
            continue;
          }
          break;
        case PreTokenizerStep::Kind::kMetaspace: {
          std::string rewritten;
          const std::string_view piece(s.arena.data() + p.begin, p.end - p.begin);
          for (char c : piece) {
            if (c == ' ') {
              rewritten += step.replacement;
            } else {
              rewritten.push_back(c);
            }
          }
          const bool prepend = step.prepend == PrependScheme::kAlways ||
                               (step.prepend == PrependScheme::kFirst && p.at_start);
          if (prepend && !rewritten.starts_with(step.replacement)) rewritten.insert(0, step.replacement);
          const size_t at = s.arena.size();
          s.arena += rewritten;
          p = Piece{at, s.arena.size(), p.at_start};
          if (!step.split) {
            s.next.push_back(p);
            continue;
          }
          break;
        }
        default: break;
      }
      find_delimiters(step, s.arena, p, &s.ranges);
      SplitBehavior behavior = step.behavior;
      if (step.kind == PreTokenizerStep::Kind::kByteLevel) behavior = SplitBehavior::kIsolated;
      if (step.kind == PreTokenizerStep::Kind::kMetaspace) behavior = SplitBehavior::kMergedWithNext;
      if (step.kind == PreTokenizerStep::Kind::kDigits) {
        behavior = step.individual_digits ? SplitBehavior::kIsolated : SplitBehavior::kContiguous;
      }
      apply_behavior(s.ranges, behavior, p.at_start, p.begin, &s.next);
    }
    s.pieces.swap(s.next);
  }
  for (const Piece& p : s.pieces) {
    encode_piece(std::string_view(s.arena.data() + p.begin, p.end - p.begin), ids, &s.symbols);
  }
}

// ---------------------------------------------------------------------------------------
// The model

void BpePipeline::initial_symbols(std::string_view piece, std::vector<int>* symbols) const {
  symbols->clear();
  bool pending_unk = false;
  const auto flush_unk = [&] {
    if (pending_unk) symbols->push_back(unk_id);
    pending_unk = false;
  };
  for (size_t i = 0; i < piece.size();) {
    const auto b0 = static_cast<unsigned char>(piece[i]);
    int id = -1;
    size_t length = 1;
    if (byte_level) {
      id = byte_symbols_[b0];
    } else if (b0 < 0x80) {
      id = ascii_ids_[b0];
    } else {
      char32_t cp = 0;
      length = std::max<size_t>(1, decode_utf8(piece, i, &cp));
      if (length > 1) {
        const auto it = vocab.find(piece.substr(i, length));
        if (it != vocab.end()) id = it->second.id;
      }
    }
    if (id >= 0) {
      flush_unk();
      symbols->push_back(id);
    } else if (byte_fallback && std::all_of(piece.begin() + ptrdiff_t(i), piece.begin() + ptrdiff_t(i + length),
                                            [&](char c) { return byte_fallback_ids[static_cast<unsigned char>(c)] >= 0; })) {
      flush_unk();
      for (size_t k = i; k < i + length; ++k) symbols->push_back(byte_fallback_ids[static_cast<unsigned char>(piece[k])]);
    } else if (unk_id >= 0) {
      if (!fuse_unk) flush_unk();
      pending_unk = true;
    }  // else dropped, as Hugging Face's BPE does without an unk_token
    i += length;
  }
  flush_unk();
}

void BpePipeline::encode_piece(std::string_view piece, std::vector<int>* ids, std::vector<int>* symbols) const {
  if (piece.empty()) return;
  const auto it = vocab.find(piece);
  if (it != vocab.end() && (ignore_merges || it->second.whole)) {
    ids->push_back(it->second.id);
    return;
  }
  initial_symbols(piece, symbols);
  apply_merges(symbols, merges, MergeOrder::kOneAtATime);
  ids->insert(ids->end(), symbols->begin(), symbols->end());
}

void BpePipeline::finish() {
  const auto id_of = [&](std::string_view key) {
    const auto it = vocab.find(key);
    return it == vocab.end() ? -1 : it->second.id;
  };
  for (int b = 0; b < 256; ++b) byte_symbols_[b] = id_of(std::string(1, char(b)));
  for (int c = 0; c < 128; ++c) ascii_ids_[c] = id_of(std::string(1, char(c)));
  // A piece spelling a token whose own merges rebuild it is that token: known here once, so
  // encode answers most words with one hash lookup. (ignore_merges needs no such proof.)
  if (ignore_merges) return;
  std::vector<int> symbols;
  for (auto& [key, entry] : vocab) {
    initial_symbols(key, &symbols);
    apply_merges(&symbols, merges, MergeOrder::kOneAtATime);
    entry.whole = symbols.size() == 1 && symbols[0] == entry.id;
  }
}

// ---------------------------------------------------------------------------------------
// Encoding

void BpePipeline::encode_stretch(std::string_view text, bool at_start, std::vector<int>* ids, Scratch& s) const {
  if (!normalizers.empty()) {
    normalize(text, &s.normalized);
    text = s.normalized;
  }
  if (normalized_specials.empty()) {
    pre_tokenize_and_encode(text, at_start, ids, s);
    return;
  }
  const std::string owned(text);  // s.normalized is reused below
  for (size_t pos = 0; pos < owned.size();) {
    SpecialTokenMatcher::Match m{};
    const bool found = normalized_specials.find(owned, pos, &m);
    const size_t stop = found ? m.begin : owned.size();
    if (stop > pos) pre_tokenize_and_encode(std::string_view(owned).substr(pos, stop - pos), at_start && pos == 0, ids, s);
    if (!found) break;
    ids->push_back(m.id);
    pos = m.end;
  }
}

void BpePipeline::encode(std::string_view text, std::vector<int>* ids) const {
  thread_local Scratch scratch;
  for (size_t pos = 0; pos < text.size();) {
    SpecialTokenMatcher::Match m{};
    const bool found = raw_specials.find(text, pos, &m);
    const size_t stop = found ? m.begin : text.size();
    if (stop > pos) encode_stretch(text.substr(pos, stop - pos), pos == 0, ids, scratch);
    if (!found) break;
    ids->push_back(m.id);
    pos = m.end;
  }
}

}  // namespace meshtrain::data
