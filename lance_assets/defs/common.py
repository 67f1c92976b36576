"""Definitions shared by the Dagster domains (``defs/ingest``, ``defs/tokens``, ``defs/curation``,
``defs/embeddings``, ``defs/forensics``, ``defs/table``, ``defs/training``): the pool, group
names, tags and the keys of assets one domain depends on in another.

Domains import this module, ``defs/metadata`` and ``defs/resources``, never each other: an
asset in another domain is referenced by its key from here, so no domain module imports
another domain's module.
"""

import multiprocessing

import dagster as dg

# Every asset that writes the corpus table takes this pool. The instance may use it to queue
# writers (a throughput nicety); correctness does not depend on it: the library's writes are
# safe under concurrent writers from any process or instance.
POOL = "lance_corpus"

# Each group is named after the library package that holds its code, and its assets are defined
# in the ``defs/`` folder of that name (a column producer's asset by ``defs/columns.py``).
# ``training`` is the one group over several packages: ``train/``, ``launch/`` and ``ablation/``.
INGEST_GROUP = "ingest"
TOKENS_GROUP = "tokens"
CURATION_GROUP = "curation"
FINEWEB_GROUP = "fineweb"
EMBEDDINGS_GROUP = "embeddings"
FORENSICS_GROUP = "forensics"
TRAINING_GROUP = "training"
TABLE_GROUP = "table"

TABLE_TAGS = {"lance_assets/table": "corpus"}  # assets that read or write the corpus table

# Steps that launch torchrun (each takes every core, or every GPU, of its machine) run one at a
# time inside a run; across runs they are separate machines' or the user's choice. Without this
# `make demo`'s pretrained_model and curation_ablation split two cores and both take twice as long.
TRAINER_TAG = "lance_assets/trainer"
TRAINER_TAGS = {TRAINER_TAG: "torchrun"}
# Each step's process forks from a server that imported the code location once (Dagster's
# `forkserver` start method preloads the job's module): a spawned step would import it again,
# seconds of CPU per step (`spawn` where there is no forkserver: Windows).
START_METHOD = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
RUN_EXECUTOR = dg.multiprocess_executor.configured(
    {"tag_concurrency_limits": [{"key": TRAINER_TAG, "limit": 1}],
     "start_method": {START_METHOD: {}}}, name="multiprocess")

# Assets referenced across domains.
RAW_TEXT = dg.AssetKey("raw_text")
DEDUP_FLAG = dg.AssetKey("dedup_flag")
TOKEN_IDS = dg.AssetKey("token_ids")
QUALITY_SIGNALS = dg.AssetKey("quality_signals")
NEAR_DUP = dg.AssetKey("near_dup")
CURATION_RULES = dg.AssetKey("curation_rules")
TOKENIZER = dg.AssetKey("tokenizer")
PRETRAINED_MODEL = dg.AssetKey("pretrained_model")
TABLE_MAINTENANCE = dg.AssetKey("table_maintenance")
TEXT_INDEX = dg.AssetKey("text_index")
VECTOR_INDEX = dg.AssetKey("vector_index")
CHUNK_INDEX = dg.AssetKey("chunk_index")
SAMPLES = dg.AssetKey("samples")
FORENSICS = dg.AssetKey("forensics")
CURATION_ABLATION = dg.AssetKey("curation_ablation")
# Column producers (declared in the library, made into assets by defs/columns.py).
DETECTED_LANGUAGE = dg.AssetKey("detected_language")
PERSONAL_DATA = dg.AssetKey("personal_data")
CONTAMINATION = dg.AssetKey("contamination")
QUALITY_SCORE = dg.AssetKey("quality_score")
PARAGRAPH_DUPS = dg.AssetKey("paragraph_dups")
EMBEDDINGS = dg.AssetKey("embeddings")
CHUNK_EMBEDDINGS = dg.AssetKey("chunk_embeddings")  # per-chunk vectors (forensics)
