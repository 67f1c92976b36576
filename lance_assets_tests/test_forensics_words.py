"""Properties of the layout-free word view attribution matches on: the same words under any
whitespace, line breaks, ASCII case and punctuation; offsets that point at each word in the
original text; one batch equal to its texts one by one; and a span found on the view that maps
back to the right characters."""

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from lance_assets.forensics.attribution import align
from lance_assets.forensics.words import text_words, words

SETTINGS = settings(max_examples=150, deadline=None)
# word characters: ASCII letters and digits, and non-ASCII letters (accents, Greek, CJK, emoji)
WORD = st.text(st.sampled_from(list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
                                    "éüßøłçñΩжπ中文🙂")), min_size=1, max_size=12)
# what may stand between words: whitespace of every kind, ASCII and Unicode punctuation
SEPARATOR = st.text(st.sampled_from(list(" \n\t\r\f\v.,;:!?()[]{}'\"-_/\\|*#@&=+<>~`^%$")
                                    + ["\u00a0", "\u2014", "\u2013", "\u201c", "\u201d",
                                       "\u2026", "\u2009", "\u3000", "\ufeff", "\u00ab"]),
                    min_size=1, max_size=4)


def layout(tokens: list[str], seps: list[str], lead: str, trail: str) -> str:
    return lead + "".join(t + s for t, s in zip(tokens, seps))[:-len(seps[-1])] + trail \
        if tokens else lead + trail


@st.composite
def two_layouts(draw):
    tokens = draw(st.lists(WORD, max_size=30))
    n = max(1, len(tokens))
    a = layout(tokens, draw(st.lists(SEPARATOR, min_size=n, max_size=n)),
               draw(st.sampled_from(["", " ", "\n\n", "— "])), draw(st.sampled_from(["", ".\n"])))
    cased = [draw(st.sampled_from([t, t.upper(), t.lower(), t.title()])) for t in tokens]
    b = layout(cased, draw(st.lists(SEPARATOR, min_size=n, max_size=n)), "", "")
    return tokens, a, b


def ascii_fold(t: str) -> str:
    return "".join(c.lower() if c.isascii() else c for c in t)


def ascii_upper(t: str) -> str:
    return "".join(c.upper() if c.isascii() else c for c in t)


SEPARATING = [(0xA0, 0xBF), (0x2000, 0x206F), (0x3000, 0x303F), (0xFEFF, 0xFEFF)]


def reference_words(text: str) -> list[tuple[int, int]]:
    """The definition, one character at a time: runs of ASCII letters and digits and non-ASCII
    characters outside the separating blocks."""

    def is_word(c: str) -> bool:
        o = ord(c)
        if o < 128:
            return c.isalnum()
        return not any(lo <= o <= hi for lo, hi in SEPARATING)

    out, start = [], None
    for i, c in enumerate(text + " "):
        if is_word(c) and start is None:
            start = i
        elif not is_word(c) and start is not None:
            out.append((start, i))
            start = None
    return out


@SETTINGS
@given(two_layouts())
def test_layout_and_ascii_case_do_not_change_the_words(case):
    tokens, a, b = case
    wa, wb = text_words(a), text_words(b)
    assert len(wa) == len(wb) == len(tokens)
    for k, token in enumerate(tokens):
        # each word's range holds exactly that word, in the original spelling
        assert a[wa.starts[k]:wa.ends[k]] == token
    # equal after folding ASCII case <=> equal fingerprints (non-ASCII case is kept)
    same = [ascii_fold(b[s:e]) for s, e in zip(wb.starts, wb.ends)] == \
        [ascii_fold(t) for t in tokens]
    assert np.array_equal(wa.values, wb.values) == same, (a, b)


@SETTINGS
@given(st.lists(st.text(max_size=80), max_size=12))
@example(["listen Silent enlist tinsel", "ab ba", "", "x\u00a0y"])  # anagrams: order counts
def test_a_batch_is_its_texts_one_by_one_and_follows_the_definition(texts):
    batch = words(texts, with_offsets=True)
    assert len(batch.offsets) == len(texts) + 1
    seen: dict[str, int] = {}
    for i, text in enumerate(texts):
        one = text_words(text)
        lo, hi = batch.offsets[i], batch.offsets[i + 1]
        assert np.array_equal(batch.values[lo:hi], one.values)
        assert np.array_equal(batch.starts[lo:hi], one.starts)
        assert np.array_equal(batch.ends[lo:hi], one.ends)
        assert list(zip(one.starts.tolist(), one.ends.tolist())) == reference_words(text)
        for (s, e), value in zip(reference_words(text), one.values):
            folded = ascii_fold(text[s:e])
            assert seen.setdefault(folded, int(value)) == int(value)  # one spelling, one value
    assert len(set(seen.values())) == len(seen)  # different spellings, different values


@SETTINGS
@given(st.lists(WORD, min_size=30, max_size=60), st.integers(0, 10), st.integers(8, 20),
       st.sampled_from([" ", "\n", "  \n   ", "\t"]))
def test_a_span_found_on_the_view_maps_back_to_both_originals(tokens, start, length, joiner):
    doc = " ".join(tokens)
    part = tokens[start:start + length]
    copied = joiner.join(ascii_upper(t) for t in part)
    # 13-digit words cannot be tokens (at most 12 characters): the copy ends where it ends
    generated = "9999999999999, " + copied + " \u2014 8888888888888."
    dw, gw = text_words(doc), text_words(generated)
    al = align(gw.values, dw.values, min_span=8)
    assert al.longest == len(part) and al.covered.sum() == len(part)
    ((ts, te, ds_, de),) = al.segments
    g0, g1 = gw.chars(ts, te - 1)
    d0, d1 = dw.chars(ds_, de - 1)
    assert generated[g0:g1] == copied
    assert [ascii_fold(w) for w in doc[d0:d1].split()] == [ascii_fold(t) for t in part]
