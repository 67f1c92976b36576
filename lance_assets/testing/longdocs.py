"""Long, real-looking technical documents for the attribution tests, made offline and
reproducibly: a title, then sections on different subjects (so a document's second half is
about something else than its opening), paragraphs of varied sentences naming the document's
own components and figures, hard-wrapped at 72 columns like release notes and manuals.

And the ways generated text re-uses a passage: whitespace-flattened, re-wrapped at another
width, a share of its words replaced, quoted inside unrelated text."""

from __future__ import annotations

import random
import re
import textwrap

SUBJECTS = {
    "storage": (["write-ahead log", "page cache", "segment file", "checksum", "fsync call",
                 "block device", "compaction pass", "manifest", "tombstone", "extent"],
                ["flushes", "truncates", "verifies", "rewrites", "appends to", "mirrors"]),
    "networking": (["socket buffer", "retransmission timer", "congestion window", "handshake",
                    "keepalive probe", "packet header", "routing table", "TLS session",
                    "connection pool", "load balancer"],
                   ["negotiates", "drops", "forwards", "throttles", "resumes", "multiplexes"]),
    "scheduling": (["run queue", "time slice", "priority class", "worker thread", "deadline",
                    "preemption point", "idle loop", "affinity mask", "wakeup latency",
                    "cgroup quota"],
                   ["preempts", "migrates", "balances", "starves", "parks", "boosts"]),
    "compilers": (["parse tree", "register allocator", "inlining pass", "symbol table",
                   "basic block", "loop unroller", "type checker", "constant folder",
                   "linker script", "debug section"],
                  ["lowers", "folds", "emits", "hoists", "specialises", "rejects"]),
    "memory": (["garbage collector", "allocation arena", "free list", "heap snapshot",
                "reference count", "write barrier", "mark bitmap", "page fault",
                "huge page", "object header"],
               ["reclaims", "pins", "compacts", "scans", "promotes", "zeroes"]),
    "security": (["signing key", "certificate chain", "access token", "audit record",
                  "sandbox profile", "password hash", "nonce", "revocation list",
                  "privilege level", "secret store"],
                 ["rotates", "revokes", "encrypts", "validates", "isolates", "redacts"]),
    "databases": (["query planner", "secondary index", "transaction log", "isolation level",
                   "row lock", "materialized view", "join order", "vacuum job",
                   "replica set", "prepared statement"],
                  ["replicates", "invalidates", "reorders", "locks", "caches", "estimates"]),
    "graphics": (["frame buffer", "vertex shader", "texture atlas", "swap chain",
                  "depth buffer", "draw call", "mipmap level", "render pass", "colour space",
                  "pixel format"],
                 ["rasterises", "samples", "blends", "composites", "clips", "upscales"]),
    "telemetry": (["trace span", "metric exporter", "sampling rate", "log shipper",
                   "histogram bucket", "alert rule", "dashboard panel", "cardinality limit",
                   "retention window", "collector agent"],
                  ["aggregates", "samples", "exports", "downsamples", "annotates", "alerts on"]),
    "packaging": (["dependency resolver", "lock file", "build cache", "wheel archive",
                   "version constraint", "mirror index", "post-install hook", "signature file",
                   "platform tag", "source tarball"],
                  ["resolves", "pins", "vendors", "rebuilds", "yanks", "verifies"]),
    "audio": (["sample buffer", "mixer graph", "resampler", "latency budget", "codec frame",
               "gain stage", "ring buffer", "clock drift", "output device", "limiter"],
              ["resamples", "mixes", "attenuates", "buffers", "decodes", "dithers"]),
    "filesystems": (["inode table", "directory entry", "journal block", "mount option",
                     "quota file", "hard link", "extended attribute", "snapshot tree",
                     "free-space map", "superblock"],
                    ["allocates", "journals", "links", "snapshots", "repairs", "remounts"]),
}
QUALIFIERS = ["stale", "oversized", "partially written", "concurrent", "unaligned", "default",
              "legacy", "per-tenant", "temporary", "compressed", "remote", "cold", "hot",
              "experimental", "deprecated", "fallback"]
TEMPLATES = [
    "When the {a} {v} the {b}, the {comp} records the {q} {c} before it continues.",
    "The {comp} now {v} every {q} {a} within {n} milliseconds instead of waiting for the {b}.",
    "Previously a {q} {a} could leave the {b} in an inconsistent state; version {ver} fixes "
    "this by checking the {c} first.",
    "Operators who tune the {a} should know that the {comp} {v} the {b} only after {n} "
    "retries.",
    "If the {c} is {q}, the {comp} falls back to the {b} and logs a warning with the {a}.",
    "A new option, {opt}, controls how often the {comp} {v} the {a}; the default is {n}.",
    "Benchmarks on {n} nodes show that the {b} no longer dominates when the {a} is {q}.",
    "The documentation of the {comp} explains why the {a} and the {b} must agree on the {c}.",
    "Internally, each {a} keeps a pointer to its {b}, so the {comp} {v} both in one step.",
    "This release removes the {q} {c}, which the {comp} had kept only for compatibility.",
    "Users reported that the {comp} {v} the {a} twice under load; the {b} now guards it.",
    "To debug a {q} {b}, enable {opt} and compare the {c} with the {a} in the trace.",
]
NAMES = ["Kestrel", "Marlow", "Quillon", "Tamsin", "Orrery", "Veldt", "Brannock", "Lisker",
         "Pennant", "Corvid", "Halyard", "Sorrel", "Tarn", "Wickham", "Yarrow", "Fennick",
         "Gossamer", "Isolde", "Juniper", "Larkspur", "Moraine", "Nettle", "Ospry", "Rookery"]
UNRELATED = (
    "My grandmother kept bees behind the railway cutting, and every summer she sold honey "
    "from a folding table by the gate, next to a tin for coins and a hand-lettered price "
    "card. The bees went on working the clover and the lime trees regardless of the weather, "
    "the timetable or the price of sugar in town, and on wet days she read to us instead.")


def document(seed: int, sections: int = 6, sentences: int = 5) -> str:
    """One long document (~150 words per section) about ``sections`` subjects."""
    rng = random.Random(seed)
    name = NAMES[seed % len(NAMES)]
    subjects = rng.sample(sorted(SUBJECTS), sections)
    parts = [f"{name} {seed // len(NAMES) + 1}.{seed % 7} Release Notes",
             "=" * (len(name) + 20), ""]
    for subject in subjects:
        nouns, verbs = SUBJECTS[subject]
        comp = f"{name} {rng.choice(['daemon', 'scheduler', 'agent', 'driver', 'service'])}"
        parts += [f"{subject.capitalize()}", "-" * len(subject), ""]
        for _ in range(2):
            lines = []
            for _ in range(sentences):
                a, b, c = rng.sample(nouns, 3)
                lines.append(rng.choice(TEMPLATES).format(
                    a=a, b=b, c=c, v=rng.choice(verbs), q=rng.choice(QUALIFIERS), comp=comp,
                    n=rng.randint(2, 900), ver=f"{rng.randint(1, 9)}.{rng.randint(0, 40)}",
                    opt=f"--{name.lower()}-{rng.choice(nouns).split()[-1]}-{rng.randint(1, 99)}"))
            parts += textwrap.wrap(" ".join(lines), 72) + [""]
    return "\n".join(parts)


def corpus(n: int, seed: int = 0) -> list[str]:
    return [document(seed * 1000 + i) for i in range(n)]


def passage(doc: str, n_words: int, at: float, seed: int = 0) -> str:
    """``n_words`` whitespace-separated words of ``doc`` starting ``at`` (0-1) of the way in,
    with the document's own line breaks."""
    tokens = list(re.finditer(r"\S+", doc))
    start = min(int(len(tokens) * at), len(tokens) - n_words)
    return doc[tokens[start].start():tokens[start + n_words - 1].end()]


def flattened(text: str) -> str:
    return " ".join(text.split())


def rewrapped(text: str, width: int) -> str:
    return "\n".join(textwrap.wrap(flattened(text), width))


def words_replaced(text: str, share: float, seed: int = 0) -> str:
    """``text`` with ``share`` of its words (at random places) replaced by other words."""
    rng = random.Random(seed)
    pieces = re.split(r"(\s+)", text)
    spots = [i for i, p in enumerate(pieces) if p and not p.isspace()]
    fillers = ["several", "quietly", "another", "usually", "certain", "roughly", "mostly",
               "carefully", "notably", "plainly"]
    for i in rng.sample(spots, max(1, round(len(spots) * share))):
        pieces[i] = rng.choice(fillers)
    return "".join(pieces)


def quoted(text: str) -> str:
    """``text`` inside unrelated prose, as a model would embed a memorised passage."""
    half = len(UNRELATED) // 2
    cut = UNRELATED.index(" ", half)
    return UNRELATED[:cut] + " " + text + " " + UNRELATED[cut + 1:]
