"""Embeddings: the ANN indexes on the document and chunk vectors."""
