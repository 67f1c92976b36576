"""The MinHash kernel's two versions: version 1 bit for bit as first defined (tables hold its band
keys), version 2 stable across processes and batches, and both finding what MinHash should."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import unicodedata

import numpy as np
import pyarrow as pa
import pytest

from lance_assets.curation import minhash

M64 = (1 << 64) - 1
V1 = minhash.MinHashSettings(version=1)
V2 = minhash.MinHashSettings(version=2)


# ---------------------------------------------------------------------------- version 1, by hand

def simplify_by_hand(text: str) -> str:
    """FineWeb's simplify_text with the standard library: lowercase, drop Unicode punctuation
    and symbols, fold each run of decimal digits to 0."""
    out, in_digits = [], False
    for ch in text.lower():
        cat = unicodedata.category(ch)
        if cat[0] in "PS":
            continue
        if cat == "Nd":
            if not in_digits:
                out.append("0")
            in_digits = True
            continue
        in_digits = False
        out.append(ch)
    return "".join(out)


def v1_word_hash(word: str) -> int:
    return int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "little")


def v2_word_hash(word: str) -> int:
    """Version 2's word hash as documented: the length, then per 8-byte little-endian chunk
    (zero-padded) h = (h ^ chunk) * M; h ^= h >> 32; then MurmurHash3's 64-bit finaliser."""
    data = word.encode()
    h = len(data)
    for k in range(0, len(data), 8):
        chunk = int.from_bytes(data[k:k + 8].ljust(8, b"\0"), "little")
        h = ((h ^ chunk) * 0x9FB21C651E98DF25) & M64
        h ^= h >> 32
    for mul in (0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53):
        h ^= h >> 33
        h = (h * mul) & M64
    return h ^ (h >> 33)


def v1_shingles_by_hand(text: str, n: int = 5, word_hash=v1_word_hash) -> list[int]:
    words = simplify_by_hand(text).split()
    if not words:
        return []
    hashes = [word_hash(w) for w in words]
    out = []
    for i in range(max(1, len(hashes) - n + 1)):
        key = 0
        for h in hashes[i:i + n]:
            key = ((key ^ h) * 0x100000001B3) & M64
        key ^= key >> 29
        key = (key * 0x9E3779B97F4A7C15) & M64
        out.append(key >> 32)
    return out


def v1_band_keys_by_hand(text: str, settings: minhash.MinHashSettings) -> list[int] | None:
    sh = v1_shingles_by_hand(text, settings.ngram)
    if not sh:
        return None
    rng = np.random.default_rng(settings.seed)
    a = (rng.integers(1, 1 << 63, settings.num_perm, dtype=np.uint64) | np.uint64(1)).tolist()
    b = rng.integers(0, 1 << 63, settings.num_perm, dtype=np.uint64).tolist()
    sig = [min(((ai * x + bi) & M64) >> 32 for x in sh) for ai, bi in zip(a, b)]
    keys = []
    for band in range(settings.bands):
        key = ((band + 1) * 0x9E3779B97F4A7C15) & M64
        for r in range(settings.rows_per_band):
            key = ((key ^ sig[band * settings.rows_per_band + r]) * 0x100000001B3) & M64
            key ^= key >> 31
        keys.append(key - (1 << 64) if key >> 63 else key)
    return keys


TEXTS = [
    "The cat sat on the mat, and the dog sat on the log in 2024.",
    "THE CAT sat on the mat -- and the dog sat on the log in 1999!",
    "Short text here",
    "",
    "!!! ... ???",
    "Café naïve résumé: “quoted” words — and ١٢٣ digits, 3.14 too",
    "one two three four five six seven eight nine ten eleven twelve",
    "tab\tseparated\nlines and  double  spaces plus e-mail and don't",
]


def test_version_1_is_unchanged_bit_for_bit():
    """Shingles and band keys of version 1 equal the definition computed word by word with the
    standard library (blake2b words, FNV-style 5-gram rolling, numpy's default_rng permutations):
    the keys stored in older tables keep matching."""
    doc, sh = minhash.shingle_stream(pa.array(TEXTS), 5, version=1)
    for i, text in enumerate(TEXTS):
        assert sh[doc == i].tolist() == v1_shingles_by_hand(text), text
    keys, has_words = minhash.minhash_batch(pa.array(TEXTS), V1)
    for i, text in enumerate(TEXTS):
        want = v1_band_keys_by_hand(text, V1)
        assert has_words[i] == (want is not None)
        if want is not None:
            assert keys[i].tolist() == want, text
    # the separate calls give the same keys as the one-call path
    sig = minhash.signatures(doc, sh, len(TEXTS), V1)
    assert np.array_equal(minhash.band_keys(sig, V1), keys)


# ---------------------------------------------------------------------------- version 2

def letters(i: int) -> str:
    """A word per integer, letters only (digits would fold into one word)."""
    out = ""
    while True:
        i, r = divmod(i, 26)
        out += chr(97 + r)
        if i == 0:
            return out


def corpus(n_docs: int, seed: int, words: int = 120) -> list[str]:
    rng = np.random.default_rng(seed)
    vocab = [letters(i) for i in range(5000)] + ["Apple", "naïve", "3.5", "e-mail", "—", "x2"]
    return [" ".join(rng.choice(vocab, int(rng.integers(1, words)))) for _ in range(n_docs)]


def test_version_2_words_are_version_1_words():
    """Version 2 simplifies and splits on bytes but finds the same words as version 1's Unicode
    regexes (punctuation and symbols inside a word vanish, digit runs across punctuation fold,
    Unicode spaces separate): each document has as many shingles, and the same exact Jaccard
    similarity with every other document."""
    texts = TEXTS + corpus(30, 1) + ["3.5 x", "3. 5", "a1.2b 12--34", "x.-.9", "no\u00a0break\u3000ideo"]
    arr = pa.array(texts)
    d1, s1 = minhash.shingles(arr, 5, version=1)
    d2, s2 = minhash.shingles(arr, 5, version=2)
    sets1 = minhash.per_doc_sets(d1, s1, len(texts))
    sets2 = minhash.per_doc_sets(d2, s2, len(texts))
    assert [len(s) for s in sets1] == [len(s) for s in sets2]
    for i in range(len(texts)):
        for j in range(i):
            assert minhash.jaccard(sets1[i], sets1[j]) == minhash.jaccard(sets2[i], sets2[j])


def test_version_2_shingles_follow_their_definition():
    """Version 2's shingles equal its definition computed word by word (the same words and
    5-gram rolling as version 1, the documented 8-byte-chunk word hash): a change to the
    vectorised code that would change stored keys fails here."""
    texts = TEXTS + corpus(20, 6) + ["x" * 23 + " " + "y" * 8 + " " + "z" * 9, "ab\u3000cd"]
    doc, sh = minhash.shingle_stream(pa.array(texts), 5, version=2)
    for i, text in enumerate(texts):
        assert sh[doc == i].tolist() == v1_shingles_by_hand(text, word_hash=v2_word_hash), text


def test_version_2_text_rules():
    """Case, punctuation, digit values and the kind of whitespace do not matter; words do."""
    same = [("The Cat, sat on THE mat!", "the cat sat on the mat"),
            ("pi is 3.14 and e is 2.71", "pi is 9 and e is 0"),
            ("café\u00a0naïve  ok\tgo now", "CAFÉ naïve ok go now"),
            ("e-mail don't stop here", "email dont stop here")]
    for a, b in same:
        keys, has = minhash.minhash_batch(pa.array([a, b]), V2)
        assert has.all() and np.array_equal(keys[0], keys[1]), (a, b)
    keys, has = minhash.minhash_batch(pa.array(["the cat sat on the mat",
                                                "the cat sat on the rug"]), V2)
    assert not np.array_equal(keys[0], keys[1])


def test_version_2_empty_short_null_and_unicode_documents():
    texts = pa.array(["", None, "   \n\t ", "!!! -- ...", "one", "two words", "a b c d",
                      "a b c d e", "日本語 テキスト", "😀 emoji", "x" * 5000])
    doc, sh = minhash.shingle_stream(texts, 5, version=2)
    counts = np.bincount(doc, minlength=len(texts)).tolist()
    # no words: no shingle; 1-5 words: one shingle of all of them; long words are words
    assert counts == [0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1]
    keys, has = minhash.minhash_batch(texts, V2)
    assert has.tolist() == [c > 0 for c in counts]
    assert keys.shape == (len(texts), V2.bands) and keys.dtype == np.int64
    sig = minhash.signatures(doc, sh, len(texts), V2)
    assert (sig[:4] == 0xFFFFFFFF).all() and (sig[4:] != 0xFFFFFFFF).any(axis=1).all()
    # a long word does not collide with a shorter prefix of it
    k2, _ = minhash.minhash_batch(pa.array(["x" * 5000, "x" * 4999, "x" * 8, "x" * 9]), V2)
    assert len({tuple(k) for k in k2.tolist()}) == 4
    assert minhash.minhash_batch(pa.array([], pa.string()), V2)[0].shape == (0, V2.bands)


def test_version_2_keys_do_not_depend_on_the_batch():
    """A document's keys are a function of its text: the same in any batch split, order,
    array layout (chunked, large_string, sliced) and process."""
    texts = corpus(60, 2) + ["", None, "é" * 3, "x. y. 3.5", "ends in 12", "34 starts it",
                             "end.", ".5 start", "tail 7", "8"]
    whole, has = minhash.minhash_batch(pa.array(texts), V2)
    parts = [minhash.minhash_batch(pa.array(texts[lo:lo + 7]), V2)[0]
             for lo in range(0, len(texts), 7)]
    assert np.array_equal(np.concatenate(parts), whole)
    order = np.random.default_rng(0).permutation(len(texts))
    shuffled, _ = minhash.minhash_batch(pa.array([texts[i] for i in order]), V2)
    assert np.array_equal(shuffled, whole[order])
    chunked = pa.chunked_array([pa.array(texts[:10], pa.large_string()),
                                pa.array(texts[10:], pa.large_string())])
    assert np.array_equal(minhash.minhash_batch(chunked, V2)[0], whole)
    sliced = pa.array(["pad"] + texts)[1:]
    assert np.array_equal(minhash.minhash_batch(sliced, V2)[0], whole)
    code = ("import json, sys, pyarrow as pa; from lance_assets.curation import minhash as m; "
            "t = json.load(sys.stdin); "
            "print(json.dumps(m.minhash_batch(pa.array(t), m.MinHashSettings(version=2))"
            "[0].tolist()))")
    out = subprocess.run([sys.executable, "-c", code], input=json.dumps(texts), text=True,
                         capture_output=True, check=True, env={"PYTHONHASHSEED": "123",
                                                               "RAYON_NUM_THREADS": "2",
                                                               "PATH": ""})
    assert json.loads(out.stdout) == whole.tolist()


def mutate(words: list[str], k: int, rng: np.random.Generator) -> list[str]:
    """``words`` with ``k`` words, spread out, replaced by new ones."""
    out = list(words)
    for p in np.linspace(10, len(words) - 10, k).astype(int):
        out[p] = "new" + letters(int(rng.integers(1 << 40)))
    return out


def test_version_2_bands_find_similar_pairs_and_only_them():
    """14 bands of 8: pairs with Jaccard ~0.9 share a band nearly always (theory: 0.9996),
    unrelated documents almost never."""
    rng = np.random.default_rng(3)
    vocab = np.array([letters(i) for i in range(20000)])
    originals = [list(rng.choice(vocab, 300)) for _ in range(200)]
    copies = [mutate(w, 3, rng) for w in originals]
    texts = [" ".join(w) for w in originals + copies]
    d, s = minhash.shingles(pa.array(texts), 5, version=2)
    sets = minhash.per_doc_sets(d, s, len(texts))
    jac = np.array([minhash.jaccard(sets[i], sets[200 + i]) for i in range(200)])
    assert 0.85 < jac.mean() < 0.95
    keys, _ = minhash.minhash_batch(pa.array(texts), V2)
    shared = (keys[:200] == keys[200:]).any(axis=1)
    assert shared.mean() >= 0.98
    unrelated = (keys[:200] == np.roll(keys[:200], 1, axis=0)).any(axis=1)
    assert unrelated.sum() == 0


def test_version_2_signatures_estimate_jaccard():
    """The share of equal signature values tracks the exact Jaccard similarity of the sets
    (112 values: standard error <= 0.05), across similarities from ~0.2 to 1."""
    rng = np.random.default_rng(4)
    vocab = np.array([letters(i) for i in range(50000)])
    texts, pairs = [], []
    for k in [0, 2, 5, 10, 20, 40]:
        for _ in range(15):
            w = list(rng.choice(vocab, 400))
            pairs.append((len(texts), len(texts) + 1))
            texts += [" ".join(w), " ".join(mutate(w, k, rng))]
    d, s = minhash.shingles(pa.array(texts), 5, version=2)
    sets = minhash.per_doc_sets(d, s, len(texts))
    ds, ss = minhash.shingle_stream(pa.array(texts), 5, version=2)
    sig = minhash.signatures(ds, ss, len(texts), V2)
    exact = np.array([minhash.jaccard(sets[i], sets[j]) for i, j in pairs])
    est = np.array([np.mean(sig[i] == sig[j]) for i, j in pairs])
    assert exact.min() < 0.4 and exact.max() > 0.95
    assert np.abs(est - exact).mean() < 0.04
    assert np.abs(est - exact).max() < 0.2
    assert np.corrcoef(est, exact)[0, 1] > 0.97


def test_version_2_signature_of_a_union_is_the_minimum():
    """A MinHash signature is a coordinatewise minimum over the shingles: the signature of a
    union is the minimum of its parts' (what makes two sketches comparable at all)."""
    rng = np.random.default_rng(5)
    a = rng.integers(0, 1 << 32, 300, dtype=np.uint64)
    b = rng.integers(0, 1 << 32, 50, dtype=np.uint64)
    sh = np.concatenate([a, b, a, b])
    doc = np.repeat([0, 1, 2, 2], [len(a), len(b), len(a), len(b)])
    sig = minhash.signatures(doc, sh, 3, V2)
    assert np.array_equal(sig[2], np.minimum(sig[0], sig[1]))
    assert (sig[0] != sig[1]).mean() > 0.9


def test_versions_are_checked():
    with pytest.raises(ValueError, match="version"):
        minhash.MinHashSettings(version=3)
    with pytest.raises(ValueError, match="version"):
        minhash.shingle_stream(pa.array(["a b"]), 5, version=7)
    assert minhash.MinHashSettings().version == minhash.VERSION == 2


def test_version_2_refuses_another_rensa_algorithm(monkeypatch):
    """Keys from another rensa algorithm would silently stop matching the stored ones."""

    class Other:
        ALGORITHM_VERSION = 3

    monkeypatch.setattr(minhash, "_RMinHash", Other)
    with pytest.raises(RuntimeError, match="ALGORITHM_VERSION 3"):
        minhash.minhash_batch(pa.array(["a b c d e f"]), V2)
    minhash.minhash_batch(pa.array(["a b c d e f"]), V1)  # version 1 needs no rensa
