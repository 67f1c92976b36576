"""The layout-free view of a text that verbatim attribution matches on: its words, case-folded,
with whitespace and punctuation dropped, each kept with its character range in the original.

Why words and not token ids: tokenizers encode ``"\\n"``, ``" "`` and ``"  "`` differently, so
a passage whose lines were re-flowed or re-wrapped shares few token n-grams with its source
although its words are identical. On this view ``"Foo  bar,\\nBaz"`` and ``"foo bar baz"`` are
the same three words; a span found on it is reported back as character ranges of the original
text through the offsets kept for every word.

A *word* is a maximal run of ASCII letters and digits and non-ASCII characters (so "café" and
"naïve" stay whole), where no-break and typographic spaces, dashes, quotes and other Unicode
punctuation separate words like their ASCII counterparts. Only ASCII letters are case-folded:
that keeps the byte length of every character, which is what lets the whole corpus be cut into
words with a few numpy passes over its UTF-8 bytes (no Python loop per word). Each word becomes
a 32-bit fingerprint: a sum of per-(position, byte) values from a fixed table (tabulation
hashing) mixed with the length, the same in every process. Two different words share a
fingerprint with probability 2^-32; a shared span of ``min_span`` words needs every one of its
words to agree, so a false span is out of reach.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

_POSITIONS = 32  # tabulation rows: byte i of a word uses row i % 32


def _splitmix64(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x


# A fixed table, computed (not drawn from a random generator) so it is the same everywhere.
_TABLE = _splitmix64(np.arange(_POSITIONS * 256, dtype=np.uint64)).reshape(_POSITIONS, 256)


@dataclass
class Words:
    """The words of a batch of texts: ``values[offsets[i]:offsets[i + 1]]`` are text i's word
    fingerprints; ``starts``/``ends`` (when asked for) their character ranges in text i."""

    values: np.ndarray  # uint32 fingerprints
    offsets: np.ndarray  # int64, one more than texts
    starts: np.ndarray | None = None  # int64 character offsets in their own text
    ends: np.ndarray | None = None

    def of(self, i: int) -> np.ndarray:
        return self.values[self.offsets[i]:self.offsets[i + 1]]


def _utf8(texts: pa.Array | list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(UTF-8 bytes of all texts, byte offsets of each) without a copy per text."""
    arr = pa.array(texts, pa.large_string()) if isinstance(texts, list) else texts
    if not pa.types.is_large_string(arr.type):
        arr = arr.cast(pa.large_string())
    if arr.null_count:
        arr = arr.fill_null("")
    _, offsets_buf, data = arr.buffers()
    offsets = np.frombuffer(offsets_buf, np.int64)[arr.offset:arr.offset + len(arr) + 1]
    raw = np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8)
    raw = raw[offsets[0]:offsets[-1]]
    return raw, offsets - offsets[0]


def _unicode_separators(raw: np.ndarray) -> np.ndarray:
    """Bytes of the non-ASCII characters that separate words like a space or punctuation:
    U+00A0-U+00BF (no-break space, guillemets, ...), U+2000-U+206F (typographic spaces, dashes,
    quotes, bullets, ellipsis), U+3000-U+303F (CJK spaces and punctuation), U+FEFF."""
    sep = np.zeros(len(raw), bool)
    a, b, c = raw[:-2], raw[1:-1], raw[2:]
    two = np.flatnonzero((raw[:-1] == 0xC2) & (raw[1:] >= 0xA0) & (raw[1:] <= 0xBF))
    three = np.flatnonzero(((a == 0xE2) & ((b == 0x80) | (b == 0x81)))
                           | ((a == 0xE3) & (b == 0x80))
                           | ((a == 0xEF) & (b == 0xBB) & (c == 0xBF)))
    for lead, width in ((two, 2), (three, 3)):
        for k in range(width):
            sep[lead + k] = True
    return sep


def words(texts: pa.Array | list[str], with_offsets: bool = False) -> Words:
    """Cut every text into normalised words (see the module docstring), vectorised over the batch.
    ``with_offsets``: also each word's character range in its own text."""
    raw, text_offsets = _utf8(texts)
    n_texts = len(text_offsets) - 1
    lower = np.where((raw >= 65) & (raw <= 90), raw | 32, raw)
    is_word = ((lower >= 97) & (lower <= 122)) | ((raw >= 48) & (raw <= 57)) | (raw >= 128)
    if len(raw) and raw.max() >= 128:
        is_word &= ~_unicode_separators(raw)
    text_start = np.zeros(len(raw) + 1, bool)
    text_start[text_offsets[:-1]] = True  # a word never runs from one text into the next
    prev = np.concatenate([[False], is_word[:-1]])
    begins = is_word & (~prev | text_start[:-1])
    starts = np.flatnonzero(begins)
    nxt = np.concatenate([is_word[1:], [False]])
    ends = np.flatnonzero(is_word & (~nxt | text_start[1:])) + 1  # exclusive
    # per word: sum of TABLE[position in word % 32, byte], mixed with the word's length
    inside = np.flatnonzero(is_word)
    word_of = np.cumsum(begins)[inside] - 1
    pos = (inside - starts[word_of]) % _POSITIONS
    contrib = _TABLE[pos, lower[inside]]
    cuts = np.searchsorted(inside, starts)
    sums = np.add.reduceat(contrib, cuts) if len(inside) else np.zeros(0, np.uint64)
    lengths = (ends - starts).astype(np.uint64)
    values = (_splitmix64(sums ^ (lengths * np.uint64(0x2545F4914F6CDD1D))) >> np.uint64(32)
              ).astype(np.uint32)
    word_offsets = np.searchsorted(starts, text_offsets).astype(np.int64)
    out = Words(values, word_offsets)
    if with_offsets:
        # character index of a byte = bytes before it that start a UTF-8 character
        char_start = np.concatenate([[0], np.cumsum((raw & 0xC0) != 0x80)])
        text_of = np.repeat(np.arange(n_texts), np.diff(word_offsets))
        first_char = char_start[text_offsets[:-1]]
        out.starts = char_start[starts] - first_char[text_of]
        out.ends = char_start[ends] - first_char[text_of]
    return out


@dataclass
class TextWords:
    """One text's words with their character ranges: the offset map from the normalised view
    back to the original."""

    text: str
    values: np.ndarray
    starts: np.ndarray
    ends: np.ndarray

    def __len__(self) -> int:
        return len(self.values)

    def chars(self, first: int, last: int) -> tuple[int, int]:
        """Character range [start, end) of words ``first`` to ``last`` (inclusive)."""
        return int(self.starts[first]), int(self.ends[last])

    def excerpt(self, first: int, last: int) -> str:
        start, end = self.chars(first, last)
        return self.text[start:end]


def text_words(text: str) -> TextWords:
    w = words([text], with_offsets=True)
    return TextWords(text, w.values, w.starts, w.ends)
