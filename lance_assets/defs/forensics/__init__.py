"""Forensics: the full-text index, attribution of generated samples, and document stories."""
