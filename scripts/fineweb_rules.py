"""Write the data FineWeb's filters decide with to ``lance_assets/fineweb/fineweb_rules.json``:
spaCy's English tokenizer rules (prefix, suffix, infix and URL patterns, special cases, the
sentencizer's sentence ends: ``spacy.blank("en")``, which datatrove's filters split words with)
and datatrove's punctuation and terminal punctuation sets. ``fineweb/web_words.py`` and
``fineweb/fineweb_signals.py`` read it; nothing at run time imports spaCy or datatrove (both
Apache-2.0 / MIT licensed).

    scripts/peers_venv.sh datatrove && .venv-datatrove/bin/python scripts/fineweb_rules.py
"""

import json
import re
from pathlib import Path

import datatrove
import spacy
from datatrove.utils.text import PUNCTUATION_SET, TERMINAL_PUNCTUATION
from spacy.attrs import ORTH
from spacy.lang.char_classes import CURRENCY, UNITS

OUT = Path(__file__).resolve().parents[1] / "lance_assets" / "fineweb" / "fineweb_rules.json"


def main() -> None:
    nlp = spacy.blank("en")
    tok = nlp.tokenizer
    strings = nlp.vocab.strings
    specials = {}
    for orth, tokens in sorted(tok.rules.items()):
        if orth.isspace():
            continue
        specials[orth] = [t[ORTH] if isinstance(t[ORTH], str) else strings[t[ORTH]] for t in tokens]
    # spaCy re-merges a special case its affix rules cut into pieces (its special matcher): the
    # pieces each such case is cut into, from a tokenizer without special cases
    bare = spacy.blank("en")
    bare.tokenizer.rules = {}
    pieces = {}
    for orth in specials:
        if tok.prefix_search(orth) or tok.suffix_search(orth) or list(tok.infix_finditer(orth)):
            cut = [t.text for t in bare.tokenizer(orth)]
            if len(cut) > 1:
                pieces[orth] = cut
    # the characters a prefix can start with and a suffix can end with (every code point tried
    # in the contexts the patterns look at): a chunk outside them skips the searches
    heads = ["", "a", "A", "AA", "0", "'", "’", "°F", "°c"]
    points = [chr(c) for c in range(0x110000) if not 0xD800 <= c < 0xE000]
    prefix_first = [c for c in points
                    if any(tok.prefix_search(c + t) for t in ("", "a", "0", "S$", "$", "."))]
    # units and currencies after a number ('5km', '5US$') end a suffix with their last character
    suffix_last = sorted({c for c in points if any(tok.suffix_search(h + c) for h in heads)}
                         | {u[-1] for u in re.split(r"[|\s]+", UNITS + "|" + CURRENCY) if u})
    rules = {
        "spacy_version": spacy.__version__,
        "datatrove_version": datatrove.__version__ if hasattr(datatrove, "__version__") else
        __import__("importlib.metadata").metadata.version("datatrove"),
        "license": "spaCy (MIT): spacy.blank('en') tokenizer and sentencizer; datatrove "
                   "(Apache-2.0): datatrove.utils.text PUNCTUATION_SET, TERMINAL_PUNCTUATION",
        "prefix": tok.prefix_search.__self__.pattern,
        "suffix": tok.suffix_search.__self__.pattern,
        "infix": tok.infix_finditer.__self__.pattern,
        "url": tok.url_match.__self__.pattern,
        "special_cases": specials,
        "special_pieces": pieces,
        "prefix_first": "".join(prefix_first),
        "suffix_last": "".join(suffix_last),
        "sentence_end": sorted(nlp.add_pipe("sentencizer").punct_chars),
        "punctuation": sorted(PUNCTUATION_SET),
        "terminal_punctuation": sorted(TERMINAL_PUNCTUATION),
    }
    OUT.write_text(json.dumps(rules, ensure_ascii=False, indent=0, sort_keys=True) + "\n",
                   encoding="utf-8")
    print(f"{OUT}: {len(specials)} special cases, spaCy {rules['spacy_version']}, "
          f"datatrove {rules['datatrove_version']}")


if __name__ == "__main__":
    main()
