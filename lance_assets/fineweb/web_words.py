"""Words as datatrove's filters count them: spaCy's English tokenizer, without spaCy, per batch.

datatrove (and so FineWeb) splits a document into words with ``spacy.blank("en")``: every
punctuation mark is a word (an RST underline ``=====`` is one, ``foo(bar)`` is ``foo(bar`` and
``)``), contractions split (``don't``: ``do``, ``n't``), URLs stay whole. Gopher's word count,
mean word length, alpha and symbol ratios and n-grams all read that split, so FineWeb's exact
rules need it. spaCy's rules (prefix, suffix, infix and URL patterns, 1,343 special cases,
the sentencizer's sentence ends) are data in ``fineweb_rules.json`` (written by
``scripts/fineweb_rules.py``); ``split_chunk`` is spaCy's own pure-Python replay of its
tokenizer (``Tokenizer.explain``) over them. Speed comes from three things: a chunk of letters
only or digits only (most of any text) is one word without a regex; every other distinct chunk
is split once per process (a bounded cache, as spaCy keeps one); and a batch is handled as flat
Arrow arrays (chunks, their words, parent indices), never a Python loop per word.

spaCy's special-case matcher (a special case its affix rules cut, ``):``, made whole again) runs
here within one chunk, not over the whole document: a rare ``''`` or ``:]`` comes out
differently (no decision changed on the benchmark's corpora: docs/curation.md).
Whitespace tokens are not made; datatrove drops them. The rules and the loop of ``split_chunk``
are spaCy's (MIT License, Copyright (c) 2016-2024 ExplosionAI GmbH, 2016 spaCy GmbH, 2015
Matthew Honnibal).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

RULES_FILE = Path(__file__).with_name("fineweb_rules.json")
CACHE_LIMIT = 1_000_000  # distinct chunks kept split (then the cache starts again)


# A prefix is at most 3 characters and looks 1 ahead; a suffix at most 6 (a unit after a
# number: '0km') with 2 looked behind ('AA.'), except runs of dots ('^\\.\\.+', '\\.\\.+$').
# So the first 6 (last 8) characters decide the match, and the searches are cached by them.
PREFIX_KEY = 6
SUFFIX_WINDOW, SUFFIX_KEY = 6, 8


@dataclass(frozen=True)
class Rules:
    prefix: re.Pattern
    suffix: re.Pattern
    infix: re.Pattern
    url: re.Pattern
    special: dict[str, tuple[str, ...]]
    pieces: dict[tuple[str, ...], str]  # a special case cut by the affix rules -> the case
    piece_starts: frozenset[str]
    longest_pieces: int
    prefix_first: frozenset[str]  # the characters a prefix can start with
    suffix_last: frozenset[str]  # ... and a suffix end with
    sentence_end: frozenset[str]


@lru_cache(maxsize=1)
def rules() -> Rules:
    raw = json.loads(RULES_FILE.read_text(encoding="utf-8"))
    return Rules(prefix=re.compile(raw["prefix"]), suffix=re.compile(raw["suffix"]),
                 infix=re.compile(raw["infix"]), url=re.compile(raw["url"]),
                 special={k: tuple(v) for k, v in raw["special_cases"].items()},
                 pieces={tuple(v): k for k, v in raw["special_pieces"].items()},
                 piece_starts=frozenset(v[0] for v in raw["special_pieces"].values()),
                 longest_pieces=max(map(len, raw["special_pieces"].values())),
                 prefix_first=frozenset(raw["prefix_first"]),
                 suffix_last=frozenset(raw["suffix_last"]),
                 sentence_end=frozenset(raw["sentence_end"]))


_prefix_cache: dict[str, int] = {}
_suffix_cache: dict[str, int] = {}


def prefix_length(s: str) -> int:
    """The length of the prefix spaCy splits off ``s``, -1 for none."""
    if not s or s[0] not in rules().prefix_first:
        return -1
    if s.startswith(".."):
        m = rules().prefix.match(s)
        return m.end() if m else -1
    key = s[:PREFIX_KEY]
    got = _prefix_cache.get(key)
    if got is None:
        m = rules().prefix.match(key)
        got = _prefix_cache[key] = m.end() if m else -1
    return got


def suffix_length(s: str) -> int:
    """The length of the suffix spaCy splits off ``s``, -1 for none."""
    if not s or s[-1] not in rules().suffix_last:
        return -1
    if s.endswith(".."):
        m = rules().suffix.search(s)
        return len(s) - m.start() if m else -1
    key = s[-SUFFIX_KEY:]
    got = _suffix_cache.get(key)
    if got is None:
        m = rules().suffix.search(key, max(0, len(key) - SUFFIX_WINDOW))
        got = _suffix_cache[key] = len(key) - m.start() if m else -1
    return got


_cache: dict[str, tuple[str, ...]] = {}


def split_chunk(substring: str) -> tuple[str, ...]:
    """The words spaCy's English tokenizer makes of one whitespace-free chunk (the loop of
    spaCy's ``Tokenizer.explain``, which replays the compiled tokenizer in Python)."""
    got = _cache.get(substring)
    if got is not None:
        return got
    r = rules()
    special = r.special
    key, tokens, suffixes = substring, [], []
    while substring:
        if substring in special:
            tokens.extend(special[substring])
            substring = ""
            continue
        # each search once per string (spaCy's loop asks again for the same string)
        pre = prefix_length(substring)
        suf = -1 if pre >= 0 else suffix_length(substring)
        while pre >= 0 or suf >= 0:
            if substring in special:
                tokens.extend(special[substring])
                substring = ""
                break
            if pre >= 0:
                if pre == 0:
                    break
                tokens.append(substring[:pre])
                substring = substring[pre:]
                if substring in special:
                    pre = prefix_length(substring)
                    suf = -1 if pre >= 0 else suffix_length(substring)
                    continue
                suf = suffix_length(substring)
            if suf >= 0:
                if suf == 0:
                    break
                suffixes.append(substring[len(substring) - suf:])
                substring = substring[:len(substring) - suf]
            pre = prefix_length(substring)
            suf = -1 if pre >= 0 else suffix_length(substring)
        if not substring:
            continue
        # a URL has a dot (its host); letters and digits alone hold no infix
        if "." in substring and r.url.match(substring):
            tokens.append(substring)
        elif substring in special:
            tokens.extend(special[substring])
        elif substring.isalnum():
            tokens.append(substring)
        else:
            offset = 0
            for m in r.infix.finditer(substring):
                if offset == 0 and m.start() == 0:
                    continue
                if substring[offset:m.start()]:
                    tokens.append(substring[offset:m.start()])
                if m.end() > m.start():
                    tokens.append(substring[m.start():m.end()])
                offset = m.end()
            if substring[offset:]:
                tokens.append(substring[offset:])
        substring = ""
    tokens.extend(reversed(suffixes))
    out = _merge_specials(tokens, r) if len(tokens) > 1 else tuple(tokens)
    if len(_cache) >= CACHE_LIMIT:
        _cache.clear()
        _prefix_cache.clear()
        _suffix_cache.clear()
    _cache[key] = out
    return out


def _merge_specials(tokens: list[str], r: Rules) -> tuple[str, ...]:
    """spaCy's special matcher: runs of words that are a special case cut by the affix rules
    (``):`` cut into ``)`` ``:``) become the case's words again, longest runs first, then the
    earliest (``spacy.util.filter_spans``)."""
    spans = [(i, j) for i, t in enumerate(tokens) if t in r.piece_starts
             for j in range(i + 2, min(len(tokens), i + r.longest_pieces) + 1)
             if tuple(tokens[i:j]) in r.pieces]
    if not spans:
        return tuple(tokens)
    taken: list[tuple[int, int]] = []
    for i, j in sorted(spans, key=lambda s: (s[0] - s[1], s[0])):
        if all(j <= a or i >= b for a, b in taken):
            taken.append((i, j))
    out, at = [], 0
    for i, j in sorted(taken):
        out.extend(tokens[at:i])
        out.extend(r.special[r.pieces[tuple(tokens[i:j])]])
        at = j
    out.extend(tokens[at:])
    return tuple(out)


def split_words(text: str) -> list[str]:
    """One text's words (datatrove's ``split_into_words`` for English), for tests and checks."""
    return [w for chunk in text.split() for w in split_chunk(chunk)]


@lru_cache(maxsize=1)
def _special_keys() -> pa.Array:
    return pa.array(sorted(rules().special), pa.string())


@dataclass
class Words:
    """The words of a batch of strings, flat: ``words[i]`` belongs to string ``parents[i]``."""

    words: pa.Array
    parents: np.ndarray


# A chunk that is letters (underscores inside) with at most one opening and one closing mark
# that spaCy always splits off: those marks and the letters, unless a special case is met.
AFFIXED = r"^(?P<pre>[(\[{\"']?)(?P<core>\pL(?:[\pL_]*\pL)?)(?P<post>[,;:!?)\]}\"']?)$"


def _ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``starts[i], starts[i] + 1, ... (counts[i] of them)`` for every i, concatenated."""
    within = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(np.cumsum(counts) - counts,
                                                                      counts)
    return np.repeat(starts, counts) + within


def words_of(strings: pa.Array) -> Words:
    """Every word of every string of ``strings`` (a string array without nulls), in order."""
    strings = pc.cast(strings, pa.string())
    chunks_list = pc.utf8_split_whitespace(strings)
    chunk_parent = pc.list_parent_indices(chunks_list).to_numpy(zero_copy_only=False)
    chunks = chunks_list.flatten()
    n_chunks = len(chunks)
    if n_chunks == 0:
        return Words(pa.array([], pa.string()), np.zeros(0, dtype=np.int64))
    specials = _special_keys()
    # a chunk of letters only, or of digits only, is one word unless it is a special case
    simple = pc.and_(pc.or_(pc.utf8_is_alpha(chunks), pc.utf8_is_digit(chunks)),
                     pc.invert(pc.is_in(chunks, value_set=specials)))
    simple = simple.to_numpy(zero_copy_only=False)
    rest = np.flatnonzero(~simple)
    counts = np.ones(n_chunks, dtype=np.int64)
    pools = [chunks]
    size = n_chunks
    fast = np.zeros(0, dtype=np.int64)
    if len(rest):
        parts = pc.extract_regex(chunks.take(pa.array(rest)), AFFIXED)
        pre, core, post = (parts.field(i) for i in range(3))
        ok = pc.fill_null(pc.invert(pc.or_(
            pc.or_(pc.is_in(pc.binary_join_element_wise(pre, core, post, ""), value_set=specials),
                   pc.is_in(core, value_set=specials)),
            pc.or_(pc.is_in(pc.binary_join_element_wise(pre, core, ""), value_set=specials),
                   pc.is_in(pc.binary_join_element_wise(core, post, ""), value_set=specials)))),
            False).to_numpy(zero_copy_only=False) & parts.is_valid().to_numpy(zero_copy_only=False)
        fast, rest = rest[ok], rest[~ok]
        if len(fast):
            sel = pa.array(np.flatnonzero(ok))
            pre, core, post = pre.take(sel), core.take(sel), post.take(sel)
            has_pre = pc.not_equal(pc.utf8_length(pre), 0).to_numpy(zero_copy_only=False)
            has_post = pc.not_equal(pc.utf8_length(post), 0).to_numpy(zero_copy_only=False)
            counts[fast] = 1 + has_pre + has_post
            idx = np.arange(len(fast), dtype=np.int64)
            pools += [pre, core, post]
            base = size
            size += 3 * len(fast)
            fast_slots = (idx, has_pre, has_post, base)
    if len(rest):
        encoded = pc.dictionary_encode(chunks.take(pa.array(rest)))
        if isinstance(encoded, pa.ChunkedArray):
            encoded = encoded.combine_chunks()
        split = [split_chunk(s) for s in encoded.dictionary.to_pylist()]
        ucount = np.fromiter((len(t) for t in split), dtype=np.int64, count=len(split))
        uoff = np.cumsum(ucount) - ucount
        which = encoded.indices.to_numpy(zero_copy_only=False)
        counts[rest] = ucount[which]
        pools.append(pa.array([w for t in split for w in t], pa.string()))
        rest_src = size + uoff[which]
        size += int(ucount.sum())
    out_start = np.cumsum(counts) - counts
    take = np.empty(int(counts.sum()), dtype=np.int64)
    plain = np.flatnonzero(simple)
    take[out_start[plain]] = plain
    if len(fast):
        idx, has_pre, has_post, base = fast_slots
        at = out_start[fast]
        take[at[has_pre]] = base + idx[has_pre]
        take[at + has_pre] = base + len(fast) + idx
        take[(at + has_pre + 1)[has_post]] = base + 2 * len(fast) + idx[has_post]
    if len(rest):
        take[_ranges(out_start[rest], counts[rest])] = _ranges(rest_src, counts[rest])
    pool = pa.concat_arrays(pools) if len(pools) > 1 else chunks
    return Words(pool.take(pa.array(take)), np.repeat(chunk_parent, counts))


def sentence_flags(words: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Per word: does it end a sentence (the sentencizer's characters), is it punctuation only
    (spaCy's ``is_punct``: every character of a Unicode P category)."""
    ends = pc.is_in(words, value_set=pa.array(sorted(rules().sentence_end)))
    punct = pc.match_substring_regex(words, r"^\p{P}+$")
    return ends.to_numpy(zero_copy_only=False), punct.to_numpy(zero_copy_only=False)


def sentence_counts(parents: np.ndarray, ends: np.ndarray, punct: np.ndarray, n: int
                    ) -> np.ndarray:
    """Per string, the sentences spaCy's sentencizer finds in its words (``parents``: each
    word's string; ``sentence_flags``): 1 + the words that are not punctuation and follow a
    sentence end with only other punctuation between, as datatrove's
    ``split_into_sentences`` counts them; 0 for a string without words."""
    plain = ~punct & ~ends
    idx = np.flatnonzero(ends | plain)  # other punctuation neither ends nor starts a sentence
    par = parents[idx]
    prev_end = np.zeros(len(idx), dtype=bool)
    prev_end[1:] = ends[idx[:-1]] & (par[1:] == par[:-1])
    starts = plain[idx] & prev_end
    has_words = np.bincount(parents, minlength=n)[:n] > 0
    return has_words.astype(np.int64) + np.bincount(par[starts], minlength=n)[:n]
