"""Forensics: embeddings, the vector index, and attribution of generated samples."""
