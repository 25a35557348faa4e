// Byte and UTF-8 helpers shared by the byte-level BPE tokenizers (GPT-2, Hugging Face,
// tiktoken). They live here, not in each tokenizer, because all three must agree exactly
// on what a character is and how GPT-2's byte alphabet spells a byte: a token spelt one way
// by one loader and another way by the next would silently change ids.
#pragma once
#include <array>
#include <cstddef>
#include <string>
#include <string_view>

namespace meshtrain::data {

// GPT-2's byte <-> unicode table: printable Latin-1 bytes map to themselves, the rest to
// code points from U+0100 up, so every byte has a visible, non-space character. Byte-level
// vocabularies (GPT-2, RoBERTa, Llama 3, Qwen2 ...) spell their tokens in this alphabet.
std::array<char32_t, 256> bytes_to_unicode();
// The inverse: mapped code point (0..323) -> raw byte.
constexpr size_t kByteAlphabetEnd = 324;
std::array<int, kByteAlphabetEnd> unicode_to_bytes();

void append_utf8(char32_t cp, std::string* out);
inline size_t utf8_length(char32_t cp) { return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; }

inline bool is_utf8_continuation(unsigned char c) { return (c & 0xC0) == 0x80; }

// Decodes one well-formed UTF-8 sequence at s[i]. Returns its byte length, or 0 for an
// invalid byte (bad lead, truncated, overlong, surrogate or > U+10FFFF); callers then treat
// that single byte as a character of its own.
size_t decode_utf8(std::string_view s, size_t i, char32_t* cp);

// Maps a byte-alphabet token string back to raw bytes; false if it holds a character
// outside the 256-symbol alphabet.
bool unmap_byte_alphabet(std::string_view token, const std::array<int, kByteAlphabetEnd>& byte_of,
                         std::string* out);

}  // namespace meshtrain::data
