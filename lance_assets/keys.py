"""Names and defaults every layer shares: the Dagster definitions, the library, the trainer and
the benchmarks import them from here, so a key is spelled once.

Framework-free on purpose (no dagster, torch or lance import): the trainer runs under
``torchrun`` without Dagster, and any module may import this one without creating a cycle.
"""

# Keys of the table's config (Lance manifest key/value metadata): what a column was computed
# with, read back by whoever uses the column.
TOKENIZER_KEY = "lance_assets.tokenizer"  # the tokenizer input_ids hold (name, ids, sha256)
CURATION_KEY = "lance_assets.curation"  # the curation rules in force
NEAR_DUP_KEY = "lance_assets.near_dup"  # the MinHash settings near_dup was computed with
EMBEDDING_KEY = "lance_assets.embedding"  # the model and truncation of `embedding`
VECTOR_INDEX_KEY = "lance_assets.vector_index"  # the ANN index settings and measured recall
CONTAMINATION_KEY = "lance_assets.contamination"  # the evaluation sets `contaminated` is for
QUALITY_MODEL_KEY = "lance_assets.quality_model"  # the model file `quality_score` was made with
TOKEN_REDACTION_KEY = "lance_assets.token_redaction"  # whether input_ids were redacted (PII)
CHUNK_EMBEDDING_KEY = "lance_assets.chunk_embedding"  # the model and chunking of `chunk_embeddings`
CHUNK_INDEX_KEY = "lance_assets.chunk_index"  # the ANN index on `chunk_embeddings`, its recall
SEMANTIC_DUP_KEY = "lance_assets.semantic_dup"  # semantic_dup's settings (clusters: its side store)
LANGUAGE_ID_KEY = "lance_assets.language_id"  # the detector `lang` / `lang_score` hold
OPT_OUT_KEY = "lance_assets.opt_out"  # the opt-out lists `opted_out` follows (their digests)

# Columns read across layers (the trainer, forensics and the benchmarks read what the corpus
# assets write).
INPUT_IDS = "input_ids"
N_TOKENS = "n_tokens"
N_BYTES = "n_bytes"
IS_DUP = "is_dup"
NEAR_DUP = "near_dup"
EMBEDDING = "embedding"
CHUNK_EMBEDDINGS = "chunk_embeddings"
SEMANTIC_CLUSTER = "semantic_cluster"
SEMANTIC_REP = "semantic_rep"
SEMANTIC_COS = "semantic_cos"
SEMANTIC_DUP = "semantic_dup"
SEMANTIC_VECTOR = "semantic_vector"
TEXT_HASH = "text_hash"  # md5 of the whitespace-normalised text, kept by dedup_flag

# Prompts the sampler continues when none are given (the `samples` asset and the CLI).
DEFAULT_PROMPTS = ("An introduction to the", "The bright star", "Students often ask why", "")
