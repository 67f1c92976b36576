"""A learned quality score: the ``quality_score`` column, a linear head on ``embedding``.

FineWeb-Edu's recipe: a regression head on sentence embeddings, trained on documents that carry
an educational-quality label (FineWeb-Edu's ``score``; the synthetic corpus has one too),
read as a binary classifier at a threshold (3 by default, FineWeb-Edu's). Here the head is ridge
regression solved in closed form with numpy (no extra dependency, deterministic: the same rows
give the same file, byte for byte), trained on every labelled row except a held-out tenth
chosen by a hash of the row's ``id`` (so the split never changes as rows are added), and
measured on that tenth: MAE against the mean-predictor baseline, and accuracy / precision /
recall / F1 of ``score >= threshold``.

The model is a JSON file (weights as numbers, no pickle) under ``DATA/models/quality/``, named
by its sha256, like the trained tokenizer; the table's config records which file
``quality_score`` was computed with. Later runs apply that same model to new rows
(incremental); ``retrain`` trains again on the labelled rows of now and, when the model
changes, drops the column in a new table version (older versions keep theirs) and scores every
row again — a dot product per row, cheap next to the embeddings themselves.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field

import lance
import numpy as np
import pyarrow as pa

from lance_assets import keys, paths, storage
from lance_assets.keys import QUALITY_MODEL_KEY
from lance_assets.markdown import FilePath, Markdown, markdown_table
from lance_assets.progress import phase
from lance_assets.table import Table, get_json_config
from lance_assets.table.columns import ColumnWriteReport, fragments_missing
from lance_assets.table.producer import ColumnProducer, Run, Skip, Step, setting
from lance_assets.table.settings import InputError

QUALITY_SCORE = pa.field("quality_score", pa.float32())
DESCRIPTIONS = {QUALITY_SCORE.name: "Educational quality predicted from `embedding` by a linear "
                                    "(ridge) head trained on the labelled rows (FineWeb-Edu's "
                                    "recipe; same scale as the label, e.g. 0-5); the model file "
                                    "is named in the table's config."}
FORMAT = "lance_assets.quality_head/1"
HELDOUT_BUCKETS = 10  # one id-hash bucket in ten is held out
MIN_LABELLED_ROWS = 50


class QualityModelError(InputError):
    pass


def heldout_mask(ids: np.ndarray) -> np.ndarray:
    """True for the rows held out of training: splitmix64(id) % 10 == 0 (stable as rows are
    added, independent of the order rows are read in)."""
    z = ids.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z ^= z >> np.uint64(31)
    return z % np.uint64(HELDOUT_BUCKETS) == 0


def fit_ridge(x: np.ndarray, y: np.ndarray, ridge: float) -> tuple[np.ndarray, float]:
    """Weights and bias minimising ||x w + b - y||^2 + ridge ||w||^2 (closed form, float64).

    On one BLAS thread: with several, OpenBLAS splits ``xc.T @ y``'s sums between them, so the
    weights' last bits (and the model file's sha256, its name) followed the machine's cores."""
    from threadpoolctl import threadpool_limits

    x, y = x.astype(np.float64), y.astype(np.float64)
    with threadpool_limits(limits=1, user_api="blas"):
        mx, my = x.mean(axis=0), y.mean()
        xc = x - mx
        w = np.linalg.solve(xc.T @ xc + ridge * np.eye(x.shape[1]), xc.T @ (y - my))
        return w, float(my - mx @ w)


def metrics(y: np.ndarray, pred: np.ndarray, threshold: float, baseline: float) -> dict:
    """Regression and classification figures of ``pred`` against ``y``."""
    if len(y) == 0:
        return {"rows": 0}
    truth, said = y >= threshold, pred >= threshold
    tp = int((truth & said).sum())
    precision = tp / int(said.sum()) if said.any() else 0.0
    recall = tp / int(truth.sum()) if truth.any() else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"rows": int(len(y)), "mae": round(float(np.abs(pred - y).mean()), 4),
            "mae_of_mean_baseline": round(float(np.abs(baseline - y).mean()), 4),
            "rmse": round(float(np.sqrt(((pred - y) ** 2).mean())), 4),
            "accuracy": round(float((truth == said).mean()), 4),
            "precision": round(precision, 4), "recall": round(recall, 4), "f1": round(f1, 4),
            "positive_share": round(float(truth.mean()), 4)}


@dataclass
class QualityHead:
    weights: np.ndarray
    bias: float
    sha256: str
    doc: dict

    def predict(self, x: np.ndarray) -> np.ndarray:
        return (x.astype(np.float64) @ self.weights + self.bias).astype(np.float32)


def model_path(table: Table, sha256: str) -> storage.Location:
    return paths.models_dir(table.root) / "quality" / f"{sha256}.json"


def load_head(table: Table, sha256: str) -> QualityHead:
    """The model file named ``sha256`` (checked against its content; JSON, never unpickled)."""
    path = model_path(table, sha256)
    if not path.is_file():
        raise QualityModelError(f"quality model {path} is missing; run `quality_score` with "
                                "retrain: true to train it again")
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != sha256:
        raise QualityModelError(f"quality model {path} is corrupt (its sha256 is not its name); "
                                "delete it and run `quality_score` with retrain: true")
    doc = json.loads(data)
    if doc.get("format") != FORMAT:
        raise QualityModelError(f"{path}: not a {FORMAT} file")
    weights = np.asarray(doc["weights"], dtype=np.float64)
    return QualityHead(weights, float(doc["bias"]), sha256, doc)


def _embeddings(col: pa.ChunkedArray) -> np.ndarray:
    vecs = col.combine_chunks()
    dim = vecs.type.list_size
    return vecs.values.to_numpy(zero_copy_only=False).reshape(-1, dim)


def train_head(table: Table, *, label: str = "score", threshold: float = 3.0,
               ridge: float = 1.0, pinned: lance.LanceDataset | None = None) -> QualityHead | str:
    """Train on the labelled, embedded rows of the ``pinned`` version (default: the newest) and
    save the file; or a sentence saying why no model could be trained (too few labelled rows)."""
    ds = pinned if pinned is not None else table.newest()
    if label not in ds.schema.names:
        raise QualityModelError(f"{ds.uri} has no column {label!r} to learn from; set `label` "
                                "to a numeric column (FineWeb-Edu's `score`)")
    ltype = ds.schema.field(label).type
    if not (pa.types.is_integer(ltype) or pa.types.is_floating(ltype)):
        raise QualityModelError(f"label column {label!r} has type {ltype}, not a number; set "
                                "`label` to a numeric column")
    # label is a checked column name of the table, quoted as an identifier
    t = ds.to_table(columns=["id", keys.EMBEDDING, label],
                    filter=f"`{label}` IS NOT NULL AND {keys.EMBEDDING} IS NOT NULL")
    y = t.column(label).to_numpy(zero_copy_only=False).astype(np.float64)
    finite = np.isfinite(y)
    ids = t.column("id").to_numpy()[finite]
    x = _embeddings(t.column(keys.EMBEDDING))[finite] if t.num_rows else np.zeros((0, 1))
    y = y[finite]
    held = heldout_mask(ids)
    if (~held).sum() < MIN_LABELLED_ROWS or held.sum() == 0:
        return (f"only {int((~held).sum())} labelled training rows (and {int(held.sum())} "
                f"held out) carry `{label}` and an embedding; at least {MIN_LABELLED_ROWS} are "
                "needed")
    w, b = fit_ridge(x[~held], y[~held], ridge)
    mean = float(y[~held].mean())
    pred = (x @ w + b)
    doc = {
        "format": FORMAT, "label": label, "threshold": threshold, "ridge": ridge,
        "embedding": get_json_config(ds, keys.EMBEDDING_KEY), "dim": int(x.shape[1]),
        "weights": [float(v) for v in w], "bias": b,
        "split": f"held out: splitmix64(id) % {HELDOUT_BUCKETS} == 0",
        "train": metrics(y[~held], pred[~held], threshold, mean),
        "heldout": metrics(y[held], pred[held], threshold, mean),
    }
    data = json.dumps(doc, sort_keys=True).encode()
    sha = hashlib.sha256(data).hexdigest()
    path = model_path(table, sha)
    if not path.is_file():
        storage.write_atomic(path, data)
    return QualityHead(w, b, sha, doc)


@dataclass(frozen=True)
class ScoreFragment:
    """``quality_score`` of one fragment; refuses to write when the table names another model.
    Picklable (the weights are a numpy array): a Ray task can run it."""

    table: Table
    sha256: str
    weights: np.ndarray
    bias: float

    def __call__(self, frag) -> Iterator[pa.RecordBatch]:
        stored = self.table.get_config(QUALITY_MODEL_KEY) or {}
        if stored.get("sha256") != self.sha256:
            raise QualityModelError(f"{self.table}: the quality model changed while "
                                    "`quality_score` was writing; run it again")
        for batch in frag.to_batches(columns=[keys.EMBEDDING], batch_size=4096):
            col = batch.column(keys.EMBEDDING)
            if col.null_count:
                raise QualityModelError(
                    f"fragment {frag.fragment_id} has rows without an embedding; materialize "
                    "`embeddings` first")
            x = col.values.to_numpy(zero_copy_only=False).reshape(len(col), -1)
            pred = (x.astype(np.float64) @ self.weights + self.bias).astype(np.float32)
            yield pa.RecordBatch.from_arrays([pa.array(pred)], schema=pa.schema([QUALITY_SCORE]))


@dataclass
class QualityScoreReport(ColumnWriteReport):
    """The write's report, with the model that scored it."""

    model: dict = field(default_factory=dict)  # sha256, label, threshold, ridge, metrics
    trained: bool = False


def not_computed(ds: lance.LanceDataset) -> str | None:
    """Why ``quality_score`` is not expected on this table (no model was ever trained: too few
    rows carry a label), or None when it is. A corpus without labels is not an incomplete one:
    the coverage check passes, and a rule that names ``quality_score`` fails ``rules_valid``."""
    if get_json_config(ds, QUALITY_MODEL_KEY) is None and QUALITY_SCORE.name not in ds.schema.names:
        return ("no quality model was trained on this table (fewer than "
                f"{MIN_LABELLED_ROWS} rows carry a label), so `quality_score` is not computed")
    return None


def _has_scores(ds: lance.LanceDataset) -> bool:
    return QUALITY_SCORE.name in ds.schema.names and len(
        fragments_missing(ds, [QUALITY_SCORE.name])) < len(ds.get_fragments())


@dataclass(frozen=True)
class QualityScoreSettings:
    label: str = setting("score", "The numeric column to learn from (FineWeb-Edu's `score`, 0-5).")
    threshold: float = setting(3.0, "`label >= threshold` is the positive class for accuracy / F1 "
                                    "(FineWeb-Edu uses 3).")
    ridge: float = setting(1.0, "L2 penalty of the ridge regression.")
    retrain: bool = setting(False, "Train again on the labelled rows of now; a different model "
                                   "re-scores every row.")


@dataclass
class Head:
    """The state: the head that scores this run (trained now, or the one the table names)."""

    score: ScoreFragment  # the compute: the head's weights, checked against the table's config
    model: dict  # sha256, label, threshold, ridge, metrics
    trained: bool


def head_for(run: Run, before: None) -> Head | Skip:
    """The state, on the pinned version: the head the table names (its settings checked), or
    one trained on the pinned version's labelled rows (if the table names none, or ``retrain``),
    recorded in the table's config (the column dropped first when the model changed). ``Skip``
    when too few rows carry a label."""
    table, ds, log, asked = run.table, run.pinned, run.log, run.settings
    uri = table.uri
    if keys.EMBEDDING not in ds.schema.names:
        raise QualityModelError(f"{uri} has no `embedding` column; materialize `embeddings` "
                                "before `quality_score`")
    current = get_json_config(ds, QUALITY_MODEL_KEY)
    settings = {"label": asked.label, "threshold": asked.threshold, "ridge": asked.ridge}
    trained = False
    if current is not None and not asked.retrain:
        if {k: current.get(k) for k in settings} != settings:
            raise QualityModelError(
                f"{uri}: quality_score was made with {({k: current.get(k) for k in settings})}, "
                f"not {settings}. Run with the stored settings, or with retrain: true to train a "
                "new model and score every row again")
        head = load_head(table, current["sha256"])
    else:
        with phase("quality_score: training the quality model on the labelled rows", log):
            got = train_head(table, label=asked.label, threshold=asked.threshold,
                             ridge=asked.ridge, pinned=ds)
        if isinstance(got, str):
            skipped = f"no model trained: {got}"
            log(skipped)
            return Skip(skipped)
        head, trained = got, True
        if current is None or current.get("sha256") != head.sha256:
            if _has_scores(table.newest()):
                log("a new quality model: dropping quality_score (older table versions keep it)")

                def drop(d: lance.LanceDataset) -> None:
                    if QUALITY_SCORE.name in d.schema.names:
                        d.drop_columns([QUALITY_SCORE.name])

                table.commit("drop quality_score", drop)
            table.set_config(QUALITY_MODEL_KEY, {
                **settings, "sha256": head.sha256,
                "path": f"models/quality/{head.sha256}.json",
                "heldout": head.doc["heldout"], "train": head.doc["train"]})
    model = {**settings, "sha256": head.sha256, "heldout": head.doc["heldout"],
             "train": head.doc["train"]}
    return Head(ScoreFragment(table, head.sha256, head.weights, head.bias), model, trained)


def scored(run: Run, head: Head, written: ColumnWriteReport) -> QualityScoreReport:
    return QualityScoreReport(**asdict(written), model=head.model, trained=head.trained)


STEPS = (Step(fields=[QUALITY_SCORE], state=head_for, compute=lambda settings, head: head.score,
              after=scored),)


def summary(table: Table, report: QualityScoreReport) -> dict:
    held = report.model.get("heldout", {})
    return {
        "trained": report.trained,
        "model_sha256": report.model["sha256"],
        "model_file": FilePath(str(model_path(table, report.model["sha256"]))),
        "heldout_rows": held.get("rows", 0),
        "heldout_mae": held.get("mae"),
        "heldout_mae_of_mean_baseline": held.get("mae_of_mean_baseline"),
        "heldout_accuracy": held.get("accuracy"),
        "heldout_f1": held.get("f1"),
        "metrics": Markdown(markdown_table([
            {"split": name, **report.model.get(name, {})} for name in ("train", "heldout")])),
    }


def lineage(settings: QualityScoreSettings) -> dict:
    reads = [("embeddings", "embedding")]
    return {QUALITY_SCORE.name: reads + [("raw_text", settings.label)]
            if settings.label == "score" else reads}


PRODUCER = ColumnProducer(
    name="quality_score",
    doc="`quality_score` (float32): a linear (ridge) head on `embedding` trained on the rows that "
        "carry a label (FineWeb-Edu's `score`), the FineWeb-Edu recipe. A tenth of the labelled "
        "rows, chosen by id hash, is held out: its MAE, accuracy, precision, recall and F1 at the "
        "threshold are shown here. The model is DATA/models/quality/<sha256>.json, named in the "
        "table's config; later runs score new rows with it.",
    descriptions=DESCRIPTIONS, steps=STEPS, summary=summary, settings=QualityScoreSettings,
    reads=lineage, deps=("raw_text", "embeddings"), kinds=("lance", "numpy"),
    not_computed=not_computed)
