"""Planted semantic duplicates for ``semantic_dup``: originals, reworded copies that MinHash
(``near_dup``, Jaccard of word 5-grams) mostly misses, and distractors on the same topics.

- An **original** is several paragraphs of prose on one topic: sentences drawn from the topic's
  templates, their slots filled from the topic's word lists (names, places, numbers), so two
  documents on one topic share vocabulary and sentence shapes but not their facts.
- A **copy** says the same in other words: its sentences reordered, a share of them dropped,
  and a share of the words with synonyms (``SYNONYMS``) replaced, re-paragraphed.
- A **distractor** is another original on the same topic (a false positive would be one).

``SynonymBagEmbedder`` stands in for the sentence model in tests: a bag of words, synonyms
folded to one, hashed into 384 signed dimensions, so a reworded copy lands close to its original
as it does with the real model.
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass

import numpy as np

from lance_assets.embeddings.embeddings import DIM

SYNONYMS = [
    ["big", "large", "huge", "sizeable"], ["small", "little", "tiny", "modest"],
    ["quickly", "rapidly", "swiftly", "fast"], ["slowly", "gradually", "steadily"],
    ["important", "significant", "crucial", "vital"], ["shows", "reveals", "demonstrates"],
    ["began", "started", "commenced"], ["built", "constructed", "erected"],
    ["old", "ancient", "aged"], ["new", "fresh", "novel"], ["many", "numerous", "countless"],
    ["often", "frequently", "regularly"], ["help", "assist", "aid"],
    ["needs", "requires", "demands"], ["uses", "employs", "relies on"],
    ["people", "folk", "residents"], ["difficult", "hard", "tough"],
    ["easy", "simple", "straightforward"], ["made", "produced", "created"],
    ["found", "discovered", "uncovered"], ["careful", "cautious", "attentive"],
    ["area", "region", "zone"], ["study", "research", "investigation"],
    ["increase", "rise", "growth"], ["decrease", "drop", "decline"],
    ["also", "additionally", "likewise"], ["however", "yet", "nevertheless"],
    ["because", "since", "as"], ["usually", "typically", "generally"],
    ["buy", "purchase", "acquire"], ["strong", "powerful", "robust"],
    ["weak", "feeble", "fragile"], ["problem", "issue", "difficulty"],
    ["method", "technique", "approach"], ["result", "outcome", "consequence"],
    ["main", "principal", "primary"], ["near", "close to", "beside"],
    ["travelled", "journeyed", "went"], ["watched", "observed", "viewed"],
    ["said", "stated", "remarked"], ["keep", "retain", "preserve"],
]
_SYN_OF = {w: group for group in SYNONYMS for w in group}
_CANON = {w: group[0] for group in SYNONYMS for w in group}

TOPICS: dict[str, dict[str, list[str]]] = {
    "astronomy": {
        "x": ["the ring of Uranus", "a white dwarf", "the Andromeda galaxy", "a supernova remnant",
              "the polar aurora", "the solar corona", "a meteor shower", "the globular cluster",
              "the comet", "the nebula", "a red dwarf", "the binary star", "the moon of Saturn",
              "a distant quasar", "the asteroid belt", "the spiral galaxy"],
        "who": ["Dr. Alvarez", "the observatory team", "Professor Lindqvist", "a student group",
                "the survey crew", "Dr. Okafor"],
        "tool": ["a large telescope", "the radio array", "an infrared camera", "a spectrograph",
                 "the orbiting observatory"],
        "t": [
            "{who} watched {x} for {n} nights with {tool}.",
            "The study shows that {x} is {n} light years away, much farther than people believed.",
            "Many astronomers often use {tool} because faint light from {x} is difficult to see.",
            "However, the main problem was that {x} moved quickly across the sky.",
            "{who} said the result was important for models of how stars are made.",
            "A small increase in brightness was found near {x} in the {n}th week.",
            "The new method needs careful calibration of {tool} before every night.",
            "Old records also mention {x}, which people usually found easy to spot.",
            "{who} began a big study of {x} after a strong flare in {yr}.",
            "The decrease in signal from {x} shows that dust blocks part of the light.",
            "Because the area is small, {tool} keeps {x} in view for hours.",
            "{who} built a simple model that shows how {x} will move over {n} years.",
            "On clear evenings {who} pointed {tool} at {x} and recorded every flicker.",
            "Funding for the observatory was cut in {yr}, so the work on {x} paused.",
            "Amateur observers sent {n} photographs of {x} to the journal.",
            "The colour of {x} hints at iron and nickel in its outer layers.",
            "Clouds over the mountain ruined {n} of the planned sessions.",
            "Students compared the spectrum of {x} with laboratory lamps.",
            "The orbit of {x} takes roughly {n} days to complete.",
            "A press release about {x} was shared widely across newspapers.",
        ]},
    "cooking": {
        "x": ["the fish stew", "a chocolate cake", "the pumpkin gnocchi", "a bean chili",
              "the rye bread", "a plum jam", "the pea risotto", "a cheese souffle",
              "the sourdough loaf", "a tomato sauce", "the lentil soup", "a lemon tart",
              "the roast chicken", "a vegetable curry", "the apple pie", "a mushroom risotto"],
        "who": ["the chef", "my aunt Rosa", "the baker next door", "a cooking teacher",
                "the restaurant owner", "our grandmother"],
        "tool": ["a cast iron pan", "the old oven", "a heavy pot", "a wooden spoon",
                 "the stone mortar"],
        "t": [
            "{who} made {x} for {n} guests using {tool}.",
            "The main secret of {x} is slowly cooking the onions for {n} minutes.",
            "Many people often buy ready {x}, but a homemade one is easy and cheap.",
            "However, {x} needs careful timing because the heat of {tool} is strong.",
            "{who} said the result depends on fresh herbs and good salt.",
            "A small increase in sugar makes {x} taste rich without being heavy.",
            "The old method uses {tool} and requires patience rather than skill.",
            "{who} also found that {x} keeps well for {n} days in a cool place.",
            "{who} began to make {x} every Sunday in {yr}.",
            "Because the kitchen area is small, {who} usually prepares {x} in the morning.",
            "A big problem with {x} is that the crust gets hard if it waits too long.",
            "The study of old recipes shows that {x} was made with barley long ago.",
            "Garlic, thyme and a splash of wine go into {x} near the end.",
            "The recipe for {x} was written on a card that smells of butter.",
            "Guests asked for second helpings of {x} at the wedding in {yr}.",
            "Leftover {x} can be frozen in jars and warmed on a busy evening.",
            "Kneading the dough for {n} minutes gives {x} a chewy texture.",
            "The market sells cheap potatoes, which stretch {x} for a crowd.",
            "Too much pepper ruined {x} the first time it was served.",
            "Children in the family learned to cook {x} standing on a chair.",
        ]},
    "gardening": {
        "x": ["the strawberry bed", "a row of leeks", "the climbing ivy", "the potato rows",
              "a cherry tree", "the sunflower border", "a lettuce bed", "the fig tree",
              "the rose bushes", "a bed of carrots", "the apple trees", "the herb garden",
              "a row of beans", "the tomato plants", "the lavender hedge", "a pumpkin patch"],
        "who": ["the gardener", "my neighbour Tom", "the allotment club", "a retired teacher",
                "the school children", "the park staff"],
        "tool": ["a sharp spade", "the compost heap", "a drip hose", "a wheelbarrow",
                 "the glass frame"],
        "t": [
            "{who} planted {x} in spring and watched them for {n} weeks.",
            "The main problem for {x} is slugs, which often eat young leaves at night.",
            "Many gardeners use {tool} because dry soil is difficult for roots.",
            "However, {x} needs strong sunlight for at least {n} hours a day.",
            "{who} said the result was a big harvest despite the cold weather.",
            "A small increase in compost helps {x} grow quickly in poor soil.",
            "The old method uses {tool} and keeps the ground moist for days.",
            "{who} also found that {x} usually flower early near a warm wall.",
            "{who} began to grow {x} after moving to the village in {yr}.",
            "Because the area is small, {who} placed {x} along the fence.",
            "A decrease in rain last summer made {x} weak and pale.",
            "A simple study shows that {x} grown with {tool} give more fruit.",
            "Bees visit {x} from dawn until the evening dew settles.",
            "Frost in late April killed {n} seedlings along the path.",
            "Mulch of straw around {x} stops weeds and saves water.",
            "Seeds saved in {yr} still sprouted when sown last March.",
            "A blackbird nests every year in the hedge beside {x}.",
            "Pruning in winter keeps {x} tidy and lets light reach the centre.",
            "The soil test came back acidic, so lime was spread over {x}.",
            "Neighbours swap cuttings of {x} at the autumn fair.",
        ]},
    "history": {
        "x": ["the cathedral tower", "a Viking settlement", "the salt mine", "the old mill",
              "a fortified farm", "the customs house", "the canal locks", "a hillside theatre",
              "the old harbour", "a medieval castle", "the stone bridge", "the royal library",
              "a Roman road", "the market hall", "the city walls", "a mountain monastery"],
        "who": ["the historian Marta Weiss", "the local museum", "a team of archaeologists",
                "the town council", "Professor Haddad", "the heritage society"],
        "tool": ["tax records", "old maps", "letters of merchants", "a parish register",
                 "carved inscriptions"],
        "t": [
            "{x} was built around {yr} by people who travelled from the coast.",
            "{who} found {tool} that describe {x} in great detail.",
            "The main reason for building {x} was trade, which grew quickly after {yr}.",
            "However, {x} was difficult to defend because the area was flat.",
            "{who} said the study of {tool} shows {n} families lived there.",
            "Many visitors often ask why {x} is so large for such a small town.",
            "A decrease in trade later made {x} old and empty for {n} years.",
            "The new research uses {tool} and also relies on soil samples.",
            "{who} began to restore {x} in {yr} with help from volunteers.",
            "Because {x} was important, the king kept soldiers near it.",
            "A fire in {yr} was a big problem, yet {x} was rebuilt quickly.",
            "Simple records show that {n} workers made {x} in a few seasons.",
            "Pilgrims once rested at {x} on their way to the cathedral.",
            "Coins from {yr} turned up in a drain beneath {x}.",
            "During the war {x} served as a hospital for {n} wounded men.",
            "A painting of {x} hangs in the town hall above the fireplace.",
            "Floods in {yr} washed away the wooden houses around {x}.",
            "Legends claim a tunnel runs from {x} to the river.",
            "Tax on salt paid for the repairs to {x}.",
            "Schoolchildren visit {x} every autumn to learn about guilds.",
        ]},
    "finance": {
        "x": ["the school fund", "a dairy farm", "the football club", "a charity shop",
              "the hospital trust", "a taxi company", "the village hall", "a music festival",
              "the pension fund", "a small bakery business", "the city budget",
              "a family savings plan", "the farm cooperative", "a local credit union",
              "the startup", "the housing loan"],
        "who": ["the accountant", "the board", "an independent adviser", "the treasurer",
                "the bank manager", "a consumer group"],
        "tool": ["a monthly report", "the spreadsheet", "an external audit", "a budget plan",
                 "the annual statement"],
        "t": [
            "{who} said {x} grew by {n} percent last year.",
            "The main problem for {x} is that costs rise quickly while income is flat.",
            "Many people often ignore fees, but a small fee is important over {n} years.",
            "However, {x} needs a strong reserve because markets can drop suddenly.",
            "{who} uses {tool} to keep track of every payment.",
            "A small increase in interest made {x} difficult to manage in {yr}.",
            "The new method requires {tool} to be checked by two people.",
            "{who} also found that {x} usually spends more in winter.",
            "{x} began to save money in {yr} after a big loss.",
            "Because the risk is large, {who} keeps part of {x} in cash.",
            "A decrease in sales shows that {x} must cut spending by {n} percent.",
            "A simple study of {tool} reveals where {x} loses money.",
            "Inflation of {n} percent ate into the savings held by {x}.",
            "Shareholders voted in {yr} to pay no dividend from {x}.",
            "Loans taken by {x} carry a fixed rate until the contract ends.",
            "Tax rules changed, so {x} moved its accounts to a new bank.",
            "Members of {x} receive a statement by post each quarter.",
            "Cash flow turned negative when two customers paid late.",
            "Insurance premiums for {x} doubled after the flood in {yr}.",
            "Auditors flagged {n} invoices that lacked a signature.",
        ]},
    "sailing": {
        "x": ["the ferry", "a trimaran", "the lifeboat", "a canal barge", "the tall ship",
              "a sea kayak", "the cargo sloop", "a pilot cutter", "the small sloop",
              "a wooden ketch", "the racing dinghy", "the old schooner", "a fishing boat",
              "the catamaran", "a rescue launch", "the training yacht"],
        "who": ["the skipper", "a young crew", "the harbour master", "my uncle Piet",
                "the sailing school", "two friends"],
        "tool": ["a paper chart", "the compass", "a hand bearing", "the radio",
                 "a storm jib"],
        "t": [
            "{who} sailed {x} across the bay in {n} hours.",
            "The main problem was a strong wind that rose quickly after noon.",
            "Many sailors often use {tool} because electronics can fail at sea.",
            "However, {x} needs careful handling when waves are large.",
            "{who} said the trip was difficult but the result was worth it.",
            "A small increase in speed came from trimming the sails near the shore.",
            "The old method of navigation uses {tool} and a watch.",
            "{who} also found that {x} usually leaks a little in rough weather.",
            "{who} began to sail {x} every summer in {yr}.",
            "Because the area is rocky, {who} keeps {x} far from the coast.",
            "A decrease in wind left {x} drifting for {n} minutes.",
            "{who} built {x} in a barn and launched it in {yr}.",
            "Dolphins swam beside {x} for the last mile into port.",
            "The mast of {x} was replaced after a collision in {yr}.",
            "Fog rolled in and the crew sounded the horn every {n} seconds.",
            "Tides in the channel run fast, so departure was timed carefully.",
            "Fresh paint on the hull of {x} took a whole weekend.",
            "Seasickness kept half the crew below deck on the first day.",
            "A regatta in {yr} brought {n} boats to the harbour.",
            "Ropes on {x} are coiled and stowed before every race.",
        ]},
}


def original(rng: random.Random, topic: str, subject: str, sentences: int = 12) -> str:
    """One document of ``sentences`` sentences about ``subject`` (one of the topic's) in three
    paragraphs."""
    t = TOPICS[topic]
    templates = rng.sample(t["t"], min(sentences, len(t["t"])))
    while len(templates) < sentences:
        templates.append(rng.choice(t["t"]))
    out = []
    for tpl in templates:
        s = tpl.format(x=subject,
                       who=rng.choice(t["who"]), tool=rng.choice(t["tool"]),
                       n=rng.randint(2, 90), yr=rng.randint(1200, 2020))
        out.append(s[0].upper() + s[1:])
    cut = sorted(rng.sample(range(1, len(out)), 2))
    return "\n\n".join(" ".join(p) for p in (out[:cut[0]], out[cut[0]:cut[1]], out[cut[1]:]))


def _replace_words(text: str, share: float, rng: random.Random) -> str:
    def swap(m: re.Match) -> str:
        word = m.group(0)
        group = _SYN_OF.get(word.lower())
        if not group or rng.random() >= share:
            return word
        new = rng.choice([w for w in group if w != word.lower()])
        return new.capitalize() if word[0].isupper() else new
    return re.sub(r"[A-Za-z]+", swap, text)


def reworded(text: str, rng: random.Random, *, drop: float = 0.2, synonyms: float = 0.7,
             shuffle: float = 0.6) -> str:
    """``text`` said again: ``shuffle`` of its sentences moved, ``drop`` of them left out, and
    ``synonyms`` of the words that have synonyms replaced by one."""
    sentences = re.findall(r"[^.!?]+[.!?]", text.replace("\n", " "))
    sentences = [s.strip() for s in sentences if s.strip()]
    keep = [s for s in sentences if rng.random() >= drop] or sentences[:1]
    moved = [i for i in range(len(keep)) if rng.random() < shuffle]
    picked = [keep[i] for i in moved]
    rng.shuffle(picked)
    for i, s in zip(moved, picked):
        keep[i] = s
    keep = [_replace_words(s, synonyms, rng) for s in keep]
    half = len(keep) // 2
    return " ".join(keep[:half]) + "\n\n" + " ".join(keep[half:])


@dataclass
class Planted:
    texts: list[str]
    copy_of: dict[int, int]  # copy position -> original position
    originals: list[int]
    distractors: list[int]


def max_documents() -> int:
    """Originals and distractors a planted set can hold: one per subject."""
    return sum(len(t["x"]) for t in TOPICS.values())


def planted_set(originals: int = 30, copies_per_original: int = 1, distractors: int = 30,
                seed: int = 0, **reword) -> Planted:
    """Originals on the topics in turn, their reworded copies, and distractors on the same
    topics, shuffled (a copy always after its original: a copy is the later document). Every
    original and distractor has a subject of its own (at most ``max_documents()``)."""
    if originals + distractors > max_documents():
        raise ValueError(f"originals + distractors = {originals + distractors}: at most "
                         f"{max_documents()} (one subject each)")
    rng = random.Random(seed)
    topics = sorted(TOPICS)
    subjects = {t: rng.sample(TOPICS[t]["x"], len(TOPICS[t]["x"])) for t in topics}

    def fresh(i: int) -> str:
        topic = topics[i % len(topics)]
        return original(rng, topic, subjects[topic].pop())

    docs = [fresh(i) for i in range(originals)]
    items: list[tuple[str, str, int | None]] = [("original", t, i) for i, t in enumerate(docs)]
    for i, t in enumerate(docs):
        for _ in range(copies_per_original):
            items.append(("copy", reworded(t, rng, **reword), i))
    for j in range(distractors):
        items.append(("distractor", fresh(originals + j), None))
    rng.shuffle(items)
    texts, copy_of, origs, dis = [], {}, [], []
    pos_of_original: dict[int, int] = {}
    waiting: dict[int, list[str]] = {}
    for kind, text, src in items:
        if kind == "copy" and src not in pos_of_original:
            waiting.setdefault(src, []).append(text)
            continue
        pos = len(texts)
        texts.append(text)
        if kind == "original":
            origs.append(pos)
            pos_of_original[src] = pos
            for w in waiting.pop(src, []):
                copy_of[len(texts)] = pos
                texts.append(w)
        elif kind == "copy":
            copy_of[pos] = pos_of_original[src]
        else:
            dis.append(pos)
    return Planted(texts, copy_of, origs, dis)


class SynonymBagEmbedder:
    """Stands in for the sentence model: a bag of words (synonyms folded to one, words of three
    letters or fewer left out) hashed into ``DIM`` signed dimensions, unit length."""

    device = "cpu"
    batch_size = 64

    def __init__(self) -> None:
        self._slots: dict[str, tuple[int, float]] = {}

    def _slot(self, word: str) -> tuple[int, float]:
        if word not in self._slots:
            h = int.from_bytes(hashlib.sha256(word.encode()).digest()[:8], "little")
            self._slots[word] = (h % DIM, 1.0 if (h >> 32) & 1 else -1.0)
        return self._slots[word]

    def encode(self, texts) -> np.ndarray:
        out = np.zeros((len(texts), DIM), np.float32)
        for i, t in enumerate(texts):
            for w in re.findall(r"[a-z]+", t.lower()):
                if len(w) > 3:
                    j, sign = self._slot(_CANON.get(w, w))
                    out[i, j] += sign
            norm = np.linalg.norm(out[i])
            if norm:
                out[i] /= norm
            else:
                out[i, 0] = 1.0
        return out
