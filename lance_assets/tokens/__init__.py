"""Tokens: the BPE tokenizer trained on the curated text (``bpe``), the tokenizer files and
their loading (``tokenizers``), and the ``input_ids`` column (``token_ids``).

The face: the module ``bpe``, and the tokenizer loaders.
"""

from lance_assets.tokens.tokenizers import load_bpe, load_tokenizer

__all__ = ["bpe", "load_bpe", "load_tokenizer"]
