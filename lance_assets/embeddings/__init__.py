"""Embeddings: the ``embedding`` column (one vector per document) and the
``chunk_embeddings`` column (one vector per overlapping chunk), the model that computes them,
the vector files they are stored in, and the ANN indexes over both (``vector_index``).

The face: reading and computing the vectors (the model, the column names, the readers), and the
modules ``vector_index``, ``vector_files`` and ``int8_vectors``.
"""

from lance_assets.embeddings.chunk_embeddings import (
    CHUNK_EMBEDDINGS,
    QueryChunks,
    read_chunk_vectors,
    shared_chunker,
    table_chunk_spec,
)
from lance_assets.embeddings.embeddings import (
    DEFAULT_MAX_TOKENS,
    DIM,
    EMBEDDING,
    Embedder,
    EmbeddingMismatchError,
    read_embeddings,
    shared_embedder,
    table_embedding_spec,
)

__all__ = ["CHUNK_EMBEDDINGS", "DEFAULT_MAX_TOKENS", "DIM", "EMBEDDING", "Embedder",
           "EmbeddingMismatchError", "QueryChunks", "int8_vectors", "read_chunk_vectors",
           "read_embeddings", "shared_chunker", "shared_embedder", "table_chunk_spec",
           "table_embedding_spec", "vector_files", "vector_index"]
