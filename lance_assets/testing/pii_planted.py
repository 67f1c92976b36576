"""A planted personal-data test set: documents of ordinary prose with known e-mail addresses,
phone numbers, IP addresses and card numbers at known places, and look-alikes that are none of
them (dates, versions, ISBNs, prices, numbers failing the Luhn check). Used by
``lance_assets_tests/test_curation_pii.py`` and ``benchmarks/curation_tags.py``."""

from __future__ import annotations

import random

FILLER = ["The meeting moved to the north building.", "Results are in the attached table.",
          "Thanks again for the quick reply.", "The river was high after the storm.",
          "We will publish the minutes next week.", "Bring the signed form on Monday."]
CARD_PREFIXES = ["4", "51", "55", "2221", "34", "37", "6011", "65", "35"]


def luhn_complete(body: str) -> str:
    """``body`` plus the check digit that makes it pass the Luhn test."""
    total = 0
    for i, ch in enumerate(reversed(body)):
        d = int(ch)
        if i % 2 == 0:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return body + str((10 - total % 10) % 10)


def _card(rng: random.Random) -> str:
    prefix = rng.choice(CARD_PREFIXES)
    length = 15 if prefix in ("34", "37") else 16
    digits = luhn_complete(prefix + "".join(rng.choice("0123456789")
                                            for _ in range(length - len(prefix) - 1)))
    if length == 16 and rng.random() < 0.6:
        sep = rng.choice([" ", "-"])
        return sep.join(digits[i:i + 4] for i in range(0, 16, 4))
    return digits


def _phone(rng: random.Random) -> str:
    d = lambda k: "".join(rng.choice("0123456789") for _ in range(k))  # noqa: E731
    return rng.choice([
        f"+1 ({rng.randint(201, 989)}) {d(3)}-{d(4)}", f"{rng.randint(201, 989)}-{d(3)}-{d(4)}",
        f"{rng.randint(201, 989)}.{d(3)}.{d(4)}", f"+44 20 {d(4)} {d(4)}", f"020 {d(4)} {d(4)}",
        f"+49 30 {d(8)}", f"+33 1 {d(2)} {d(2)} {d(2)} {d(2)}", f"(0{rng.randint(2, 9)}) {d(4)} {d(4)}",
    ])


def _email(rng: random.Random) -> str:
    user = rng.choice(["anna", "j.smith", "dev-team", "info", "x_y+tag", "maria.garcia99"])
    host = rng.choice(["example.com", "mail.example.org", "uni-example.edu", "example.co.uk"])
    return f"{user}@{host}"


def _ip(rng: random.Random) -> str:
    if rng.random() < 0.6:
        return ".".join(str(rng.randint(1, 254)) for _ in range(4))
    groups = [f"{rng.randint(0, 0xFFFF):x}" for _ in range(8)]
    return rng.choice([":".join(groups), f"2001:db8::{groups[0]}:{groups[1]}", f"fe80::{groups[2]}"])


GENERATORS = {"email": _email, "phone": _phone, "ip": _ip, "card": _card}


def _decoy(rng: random.Random) -> str:
    d = lambda k: "".join(rng.choice("0123456789") for _ in range(k))  # noqa: E731
    bad_card = luhn_complete("4" + d(14))
    bad_card = bad_card[:-1] + str((int(bad_card[-1]) + 1) % 10)  # fails the Luhn check
    return rng.choice([
        f"version {rng.randint(1, 9)}.{rng.randint(0, 20)}.{rng.randint(0, 9)}",
        f"on 20{d(2)}-0{rng.randint(1, 9)}-1{rng.randint(0, 9)}", f"at 1{d(1)}:{d(2)}:{d(2)}",
        f"ISBN 978-{d(1)}-{d(2)}-{d(6)}-{d(1)}", f"costs ${d(1)},{d(3)},{d(3)}.{d(2)}",
        f"order {bad_card}", f"about 3.{d(5)}", "rooms 120 130 140", f"the years 19{d(2)} and 20{d(2)}",
        f"address 256.{d(2)}.{d(1)}.300", "user at example dot com", f"page {d(3)} of {d(3)}",
    ])


def planted_documents(n: int = 400, seed: int = 0) -> list[tuple[str, list[tuple[str, str]]]]:
    """(text, [(kind, value)...]) pairs: each document mixes filler, decoys and 0-3 planted
    values, and lists exactly what was planted, in order."""
    rng = random.Random(seed)
    docs = []
    for _ in range(n):
        parts, planted = [], []
        for _ in range(rng.randint(2, 6)):
            r = rng.random()
            if r < 0.35:
                kind = rng.choice(list(GENERATORS))
                value = GENERATORS[kind](rng)
                planted.append((kind, value))
                parts.append(rng.choice(["Contact: {}.", "See {} for details.", "Reach us at {} today.",
                                         "({})", "Value {} recorded."]).format(value))
            elif r < 0.6:
                parts.append(f"Note the {_decoy(rng)} here.")
            else:
                parts.append(rng.choice(FILLER))
        docs.append((" ".join(parts), planted))
    return docs
