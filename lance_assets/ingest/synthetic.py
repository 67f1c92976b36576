"""A synthetic, English-like corpus shaped like FineWeb-Edu, made offline and reproducibly.

Each document has a 0-5 educational-quality ``score``: well-formed expository paragraphs score
high, boilerplate and word salad score low. A known fraction of documents are exact copies of an
earlier document, half of them with different whitespace, so exact dedup has something to find.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import pyarrow as pa

TOPICS = {
    "astronomy": (
        ["star", "planet", "telescope", "galaxy", "orbit", "comet", "nebula", "moon", "asteroid"],
        ["observe", "measure", "orbit", "reflect", "emit", "collapse", "rotate", "attract"],
        ["distant", "bright", "massive", "cold", "ancient", "rocky", "gaseous", "faint"],
    ),
    "biology": (
        ["cell", "protein", "gene", "enzyme", "membrane", "organism", "tissue", "species"],
        ["divide", "produce", "regulate", "transport", "adapt", "digest", "encode", "grow"],
        ["living", "complex", "microscopic", "essential", "active", "diverse", "stable"],
    ),
    "history": (
        ["empire", "treaty", "city", "king", "merchant", "river", "army", "harbor", "council"],
        ["build", "trade", "defend", "sign", "expand", "govern", "record", "conquer"],
        ["ancient", "powerful", "wealthy", "medieval", "northern", "coastal", "famous"],
    ),
    "chemistry": (
        ["atom", "molecule", "acid", "solution", "crystal", "bond", "element", "reaction"],
        ["dissolve", "react", "bind", "heat", "separate", "combine", "release", "absorb"],
        ["stable", "reactive", "neutral", "dense", "soluble", "volatile", "pure", "heavy"],
    ),
    "mathematics": (
        ["number", "proof", "triangle", "function", "equation", "angle", "set", "matrix"],
        ["prove", "divide", "multiply", "define", "solve", "approximate", "count", "map"],
        ["prime", "finite", "linear", "equal", "even", "rational", "simple", "general"],
    ),
    "geography": (
        ["mountain", "valley", "glacier", "desert", "coast", "island", "forest", "delta"],
        ["erode", "shape", "flood", "cover", "drain", "border", "shelter", "form"],
        ["steep", "dry", "fertile", "vast", "narrow", "tropical", "frozen", "green"],
    ),
}

CONNECTIVES = ["However,", "Therefore,", "In addition,", "For example,", "As a result,",
               "In contrast,", "Over time,", "In practice,", "Most importantly,"]
TEMPLATES = [
    "The {adj} {noun} can {verb} the {noun2}.",
    "Scientists {verb} how a {noun} and a {noun2} interact.",
    "{conn} every {adj} {noun} tends to {verb} more slowly than a {noun2}.",
    "Students often ask why the {noun} does not {verb} when the {noun2} is {adj}.",
    "A {adj} {noun} is one that will {verb} a {adj2} {noun2}.",
    "{conn} the {noun2} helps the {noun} {verb} under {adj} conditions.",
    "We can {verb} the {noun} by comparing it with a {adj} {noun2}.",
]
BOILERPLATE = [
    "Click here to subscribe to our newsletter!", "All rights reserved.", "Login | Register",
    "Share this page on social media.", "Buy now and save 50%!!!", "Cookie policy | Privacy",
    "Home > Articles > Page 2", "Read more...", "Sponsored content",
]


@dataclass(frozen=True)
class SyntheticSpec:
    rows: int = 2000
    seed: int = 0
    dup_fraction: float = 0.08

    @property
    def key(self) -> str:
        """Identity of this corpus for incremental ingest: same spec, same rows."""
        return f"synthetic:rows={self.rows},seed={self.seed},dup={self.dup_fraction}"


def _sentence(rng: random.Random, topic: str) -> str:
    nouns, verbs, adjs = TOPICS[topic]
    tpl = TEMPLATES[rng.randrange(len(TEMPLATES))]
    return tpl.format(
        noun=rng.choice(nouns), noun2=rng.choice(nouns), verb=rng.choice(verbs),
        adj=rng.choice(adjs), adj2=rng.choice(adjs), conn=rng.choice(CONNECTIVES),
    )


def _good_document(rng: random.Random) -> tuple[str, float]:
    topic = list(TOPICS)[rng.randrange(len(TOPICS))]
    n_par = rng.randrange(1, 4)
    pars = [" ".join(_sentence(rng, topic) for _ in range(rng.randrange(3, 8)))
            for _ in range(n_par)]
    title = f"An introduction to the {topic} of the {rng.choice(TOPICS[topic][0])}"
    score = min(5.0, max(0.0, 2.5 + 0.5 * n_par + rng.gauss(0, 0.4)))
    return title + "\n\n" + "\n\n".join(pars), round(score, 3)


def _bad_document(rng: random.Random) -> tuple[str, float]:
    if rng.random() < 0.5:
        lines = [rng.choice(BOILERPLATE) for _ in range(rng.randrange(3, 12))]
        return "\n".join(lines), round(rng.uniform(0, 1.2), 3)
    words = [w for ns, vs, js in TOPICS.values() for w in ns + vs + js]
    salad = " ".join(rng.choice(words) for _ in range(rng.randrange(20, 120)))
    return salad, round(rng.uniform(0.5, 2.0), 3)


def _respace(rng: random.Random, text: str) -> str:
    """Same words, different whitespace: still an exact duplicate after normalisation."""
    out = []
    for word in text.split(" "):
        out.append(word)
        out.append(rng.choice([" ", "  ", "\t", " \n "]))
    return "  " + "".join(out[:-1]) + "\n"


def generate(spec: SyntheticSpec) -> pa.Table:
    """The whole synthetic corpus as an Arrow table (``doc_id``, ``url``, ``text``, ``score``)."""
    rng = random.Random(spec.seed)
    texts: list[str] = []
    scores: list[float] = []
    for i in range(spec.rows):
        if i > 0 and rng.random() < spec.dup_fraction:
            j = rng.randrange(i)
            text = texts[j] if rng.random() < 0.5 else _respace(rng, texts[j])
            texts.append(text)
            scores.append(scores[j])
            continue
        text, score = _good_document(rng) if rng.random() < 0.8 else _bad_document(rng)
        texts.append(text)
        scores.append(score)
    return pa.table({
        "doc_id": pa.array([f"syn-{spec.seed}-{i:08d}" for i in range(spec.rows)]),
        "url": pa.array([f"https://example.org/{spec.seed}/{i}" for i in range(spec.rows)]),
        "text": pa.array(texts, pa.string()),
        "score": pa.array(scores, pa.float64()),
    })


PLANTED_SUBJECTS = ["the cat", "a dog", "the bird", "my friend", "the teacher", "our neighbour"]
PLANTED_VERBS = ["sees", "likes", "finds", "helps", "follows", "paints"]
PLANTED_OBJECTS = ["the ball.", "a house.", "the tree.", "some water.", "the road.", "a letter."]


def planted_junk(docs: int = 3000, junk_share: float = 0.2,
                 seed: int = 0) -> tuple[list[str], list[float]]:
    """A corpus with a known answer for curation ablations: ``docs`` clean documents (short
    sentences that a `tiny` model learns within a few hundred steps) and word salad made of the
    same words in random order, ``junk_share`` of all characters, with a FineWeb-Edu-style
    score (4.0 clean, 0.5 salad), shuffled. Returns (texts, scores)."""
    rng = random.Random(seed)
    clean = [" ".join(f"{rng.choice(PLANTED_SUBJECTS)} {rng.choice(PLANTED_VERBS)} "
                      f"{rng.choice(PLANTED_OBJECTS)}" for _ in range(rng.randrange(8, 16)))
             for _ in range(docs)]
    words = [w for t in clean for w in t.split()]
    target, size, junk = junk_share / (1 - junk_share) * sum(map(len, clean)), 0, []
    while size < target:
        junk.append(" ".join(rng.choices(words, k=rng.randrange(30, 70))))
        size += len(junk[-1])
    rows = [(t, 4.0) for t in clean] + [(t, 0.5) for t in junk]
    rng.shuffle(rows)
    return [t for t, _ in rows], [s for _, s in rows]
