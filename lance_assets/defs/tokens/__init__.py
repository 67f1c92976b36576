"""Tokens: the BPE ``tokenizer`` and the check that a new one compresses no worse."""
