"""Benchmark contamination: documents that share a normalised word 13-gram with an evaluation set.

Evaluation sets are files (``.jsonl``, ``.jsonl.gz`` or ``.parquet``) registered by name in the
``contamination`` asset's config, each with the field that holds an item's text. Text on both
sides is normalised the same way (lowercase, punctuation and symbols turned into spaces, split
on whitespace), every window of 13 words is hashed to 64 bits (numpy over the whole batch, no
Python loop per n-gram), and a document is contaminated by a set when one of its 13-grams is one
of the set's. Items shorter than 13 words cannot be checked this way; they are counted and
reported, not matched (short items would flag ordinary prose).

Columns, and why there are two kinds:

- ``contam_<name>_<fingerprint>`` (bool), one per registered set. The fingerprint is a hash of
  the set's 13-gram hashes, so the column is a pure function of the table and that file's
  content: a set registered later gets a new column computed over the whole table while the
  columns of the other sets stay as they are; new rows get every set's column; a file whose
  content changed is a new column. Nothing written is ever rewritten.
- ``contaminated`` (bool) and ``contaminated_with`` (list of set names): the union over the sets
  registered *now*, what curation rules and the blocking check read. They depend on the
  registry, which is recorded in the table's config; when it changes (a set added, removed or
  changed), these two columns are dropped in a new table version (older versions keep theirs)
  and derived again from the per-set columns, which costs a read of a few booleans per row, not
  a pass over the text. A writer that finds the registry changed under it stops with an error
  instead of writing values for another registry.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from lance_assets import storage
from lance_assets.keys import CONTAMINATION_KEY
from lance_assets.markdown import Json, Markdown, markdown_table
from lance_assets.progress import phase
from lance_assets.table import Table, get_json_config
from lance_assets.table.columns import ColumnWriteReport, fragments_missing
from lance_assets.table.producer import ColumnProducer, Run, Step, setting
from lance_assets.table.settings import InputError

NGRAM = 13
NORMALISATION = 1  # bump when the normalisation or hashing changes: fingerprints change with it
CONTAMINATED = pa.field("contaminated", pa.bool_())
CONTAMINATED_WITH = pa.field("contaminated_with", pa.list_(pa.string()))
UNION_FIELDS = [CONTAMINATED, CONTAMINATED_WITH]
DESCRIPTIONS = {
    CONTAMINATED.name: f"True when `text` shares a normalised word {NGRAM}-gram with any "
                       "evaluation set registered in the `contamination` config (the sets are "
                       "listed in the table's config).",
    CONTAMINATED_WITH.name: "Names of the registered evaluation sets `text` shares a word "
                            f"{NGRAM}-gram with (empty when none).",
}
NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,39}$")
FIELD_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,127}$")
SUFFIXES = (".jsonl", ".jsonl.gz", ".parquet")
MAX_EVAL_FILE_BYTES = 4 << 30
BATCH_ROWS = 2048
FNV = np.uint64(0x100000001B3)
MIX = np.uint64(0x9E3779B97F4A7C15)


class EvalSetError(InputError):
    """An evaluation set that cannot be used; the message names it and the fix."""


class RegistryChangedError(RuntimeError):
    """Another run registered other evaluation sets while this one was writing."""


# ---------------------------------------------------------------------------- n-grams

def _word_hashes(words: pa.Array) -> np.ndarray:
    """A stable 64-bit hash per word: blake2b over the batch's distinct words only."""
    enc = pc.dictionary_encode(words)
    table = np.fromiter(
        (int.from_bytes(hashlib.blake2b(w.encode(), digest_size=8).digest(), "little")
         for w in enc.dictionary.to_pylist()), dtype=np.uint64, count=len(enc.dictionary))
    return table[enc.indices.to_numpy(zero_copy_only=False)]


def normalised_words(texts: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(document index, word hash) of every word after normalisation, in document order."""
    texts = pc.fill_null(pc.cast(texts, pa.string()), "")
    if isinstance(texts, pa.ChunkedArray):
        texts = texts.combine_chunks()
    norm = pc.replace_substring_regex(pc.utf8_lower(texts), r"[\p{P}\p{S}]+", " ")
    tokens = pc.utf8_split_whitespace(norm)
    parents = pc.list_parent_indices(tokens).to_numpy(zero_copy_only=False).astype(np.int64)
    flat = tokens.flatten()
    keep = pc.greater(pc.utf8_length(flat), 0).to_numpy(zero_copy_only=False)
    return parents[keep], _word_hashes(flat.filter(pa.array(keep)))


def ngram_hashes(texts: pa.Array, n: int = NGRAM) -> tuple[np.ndarray, np.ndarray]:
    """(document index, 64-bit hash) of every window of ``n`` consecutive normalised words of
    every text; windows never cross documents, texts shorter than ``n`` words have none."""
    parents, h = normalised_words(texts)
    m = len(h) - n + 1
    if m <= 0:
        return np.empty(0, np.int64), np.empty(0, np.uint64)
    key = np.zeros(m, dtype=np.uint64)
    for j in range(n):  # n vectorised passes over all windows at once
        key = (key ^ h[j:j + m]) * FNV
        key ^= key >> np.uint64(29)
    key *= MIX
    valid = parents[:m] == parents[n - 1:]
    return parents[:m][valid], key[valid]


def _sorted_isin(sorted_values: np.ndarray, h: np.ndarray) -> np.ndarray:
    if len(sorted_values) == 0 or len(h) == 0:
        return np.zeros(len(h), dtype=bool)
    pos = np.minimum(np.searchsorted(sorted_values, h), len(sorted_values) - 1)
    return sorted_values[pos] == h


# ---------------------------------------------------------------------------- evaluation sets

@dataclass(frozen=True)
class EvalSetSpec:
    """One registered set: a name (lowercase identifier), a file, the field with the text."""

    name: str = setting(help="A lowercase identifier (it names the set's column: "
                             "contam_<name>_<fingerprint>).")
    path: str = setting(help="A .jsonl, .jsonl.gz or .parquet file (local path, or s3:// gs:// "
                             "az://).")
    text_field: str = setting("text", "The field holding each item's text.")


@dataclass(frozen=True)
class ContaminationSettings:
    eval_sets: list[EvalSetSpec] = setting(
        default_factory=list, help="The evaluation sets to check the corpus against. A set added "
        "later is checked over the whole table; new rows are checked against every set.")


@dataclass
class EvalSet:
    spec: EvalSetSpec
    hashes: np.ndarray  # sorted, unique uint64
    items: int
    items_too_short: int
    fingerprint: str

    @property
    def column(self) -> str:
        return f"contam_{self.spec.name}_{self.fingerprint[:8]}"

    def to_dict(self) -> dict:
        return {"name": self.spec.name, "column": self.column, "fingerprint": self.fingerprint,
                "path": self.spec.path, "text_field": self.spec.text_field, "items": self.items,
                "items_too_short": self.items_too_short, "ngrams": int(len(self.hashes))}


def _fail(spec_or_name, problem: str, fix: str) -> EvalSetError:
    name = spec_or_name.name if isinstance(spec_or_name, EvalSetSpec) else spec_or_name
    path = f" ({spec_or_name.path})" if isinstance(spec_or_name, EvalSetSpec) else ""
    return EvalSetError(f"evaluation set {name!r}{path}: {problem}. {fix}")


def check_spec(spec: EvalSetSpec) -> storage.Location:
    """The set's file, or an ``EvalSetError`` naming what is wrong with the registration."""
    if not isinstance(spec.name, str) or not NAME_RE.match(spec.name):
        raise _fail(str(spec.name), "the name must be a lowercase identifier of at most 40 "
                    "characters (letters, digits, underscores, starting with a letter)",
                    "Rename it in the `contamination` config (eval_sets: [{name, path, "
                    "text_field}])")
    if not isinstance(spec.text_field, str) or not FIELD_RE.match(spec.text_field):
        raise _fail(spec, f"text_field {spec.text_field!r} is not a field name",
                    "Give the name of the field that holds each item's text")
    if not isinstance(spec.path, str) or not spec.path.strip() or "\x00" in spec.path:
        raise _fail(spec, "no path given", "Give the path of a .jsonl, .jsonl.gz or .parquet file")
    if not spec.path.lower().endswith(SUFFIXES):
        raise _fail(spec, "unsupported file type",
                    f"Register a file ending in {', '.join(SUFFIXES)}")
    try:
        loc = storage.location(spec.path)
        if not storage.is_object_store(loc):
            loc = loc.resolve()
        is_file = loc.is_file()
    except (OSError, ValueError) as err:
        raise _fail(spec, f"the path cannot be used ({err})", "Give a local path or an "
                    "s3:// / gs:// / az:// URI") from None
    if not is_file:
        raise _fail(spec, "no such file", "Check the path (relative paths are resolved from the "
                    "directory Dagster runs in; absolute paths are safer)")
    size = loc.stat().st_size if not storage.is_object_store(loc) else loc.stat().get("size", 0)
    if size > MAX_EVAL_FILE_BYTES:
        raise _fail(spec, f"the file has {size} bytes, more than {MAX_EVAL_FILE_BYTES}",
                    "An evaluation set should be small; register only the text you evaluate on")
    return loc


def read_items(spec: EvalSetSpec) -> list[str | None]:
    """The text of every item of the set (None for items whose field is null)."""
    loc = check_spec(spec)
    data = loc.read_bytes()
    if spec.path.lower().endswith(".parquet"):
        import io

        try:
            table = pq.read_table(io.BytesIO(data))
        except Exception as err:  # noqa: BLE001 - any parquet error means the same to the user
            raise _fail(spec, f"not a readable parquet file ({err})", "Check the file") from None
        if spec.text_field not in table.column_names:
            raise _fail(spec, f"no field {spec.text_field!r} (fields: {table.column_names})",
                        "Set text_field to the field that holds the item text")
        col = table.column(spec.text_field)
        if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
            raise _fail(spec, f"field {spec.text_field!r} has type {col.type}, not text",
                        "Point text_field at a string field")
        return col.to_pylist()
    if spec.path.lower().endswith(".gz"):
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as err:
            raise _fail(spec, f"not a readable gzip file ({err})", "Check the file") from None
    items: list[str | None] = []
    for lineno, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as err:
            raise _fail(spec, f"line {lineno} is not valid JSON ({err.msg})",
                        "Fix or remove that line") from None
        if not isinstance(obj, dict) or spec.text_field not in obj:
            raise _fail(spec, f"line {lineno} has no field {spec.text_field!r}",
                        "Set text_field to the field that holds the item text")
        value = obj[spec.text_field]
        if value is not None and not isinstance(value, str):
            raise _fail(spec, f"line {lineno}: field {spec.text_field!r} holds "
                        f"{type(value).__name__}, not text", "Point text_field at a text field")
        items.append(value)
    return items


def load_eval_set(spec: EvalSetSpec) -> EvalSet:
    items = read_items(spec)
    if not items:
        raise _fail(spec, "the file holds no items", "Register a file with at least one item")
    texts = pa.array(items, pa.string())
    doc, hashes = ngram_hashes(texts)
    checkable = np.zeros(len(items), dtype=bool)
    checkable[doc] = True
    hashes = np.unique(hashes)
    digest = hashlib.sha256(f"v{NORMALISATION}:n{NGRAM}:".encode())
    digest.update(hashes.tobytes())
    return EvalSet(spec=spec, hashes=hashes, items=len(items),
                   items_too_short=int((~checkable).sum()), fingerprint=digest.hexdigest())


def load_eval_sets(specs: list[EvalSetSpec]) -> list[EvalSet]:
    """Every registered set, checked and hashed; an ``EvalSetError`` for the first bad one."""
    names = [s.name for s in specs]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise EvalSetError(f"evaluation set name(s) {dupes} registered more than once in the "
                           "`contamination` config; give each set its own name")
    return sorted((load_eval_set(s) for s in specs), key=lambda e: e.spec.name)


# ---------------------------------------------------------------------------- computes

@dataclass(frozen=True)
class SetOverlap:
    """One bool column per set for a fragment: does the document share a 13-gram with it?
    Picklable (numpy arrays): a Ray task can run it."""

    columns: tuple[str, ...]
    hashes: tuple[np.ndarray, ...]
    union: np.ndarray = field(default=None)

    @classmethod
    def of(cls, sets: list[EvalSet]) -> SetOverlap:
        hashes = tuple(s.hashes for s in sets)
        union = np.unique(np.concatenate(hashes)) if hashes else np.empty(0, np.uint64)
        return cls(tuple(s.column for s in sets), hashes, union)

    def flags(self, texts: pa.Array) -> list[np.ndarray]:
        doc, h = ngram_hashes(texts)
        hit = _sorted_isin(self.union, h)  # most n-grams miss every set: check the union first
        doc, h = doc[hit], h[hit]
        out = []
        for hashes in self.hashes:
            flag = np.zeros(len(texts), dtype=bool)
            flag[doc[_sorted_isin(hashes, h)]] = True
            out.append(flag)
        return out

    def __call__(self, frag) -> Iterator[pa.RecordBatch]:
        schema = pa.schema([pa.field(c, pa.bool_()) for c in self.columns])
        for batch in frag.to_batches(columns=["text"], batch_size=BATCH_ROWS):
            flags = self.flags(batch.column("text"))
            yield pa.RecordBatch.from_arrays([pa.array(f) for f in flags], schema=schema)


def registry_fingerprint(sets: list[dict]) -> str:
    pairs = sorted((s["name"], s["column"]) for s in sets)
    return hashlib.sha256(json.dumps(pairs).encode()).hexdigest()


@dataclass(frozen=True)
class Union:
    """``contaminated`` / ``contaminated_with`` of a fragment from its per-set columns, for the
    registry ``fingerprint``; refuses to write when the table's registry moved on."""

    table: Table
    fingerprint: str
    columns: tuple[str, ...]
    names: tuple[str, ...]

    def __call__(self, frag) -> Iterator[pa.RecordBatch]:
        stored = self.table.get_config(CONTAMINATION_KEY) or {}
        if stored.get("registry") != self.fingerprint:
            raise RegistryChangedError(
                f"{self.table.uri}: the registered evaluation sets changed while `contamination` was "
                "writing (another run registered other sets); run the asset again")
        schema = pa.schema(UNION_FIELDS)
        n = frag.physical_rows
        if not self.columns:
            yield pa.RecordBatch.from_arrays(
                [pa.array(np.zeros(n, dtype=bool)), pa.array([[]] * n, CONTAMINATED_WITH.type)],
                schema=schema)
            return
        table = frag.to_table(columns=list(self.columns))
        flags = []
        for c in self.columns:
            col = table.column(c)
            if col.null_count:
                raise RuntimeError(f"fragment {frag.fragment_id} of {self.table}: {c} is not "
                                   "computed; run `contamination` again")
            flags.append(col.to_numpy(zero_copy_only=False).astype(bool))
        matrix = np.stack(flags, axis=1)
        names = np.array(self.names, dtype=object)
        with_ = [list(names[row]) for row in matrix]
        yield pa.RecordBatch.from_arrays(
            [pa.array(matrix.any(axis=1)), pa.array(with_, CONTAMINATED_WITH.type)], schema=schema)


# ---------------------------------------------------------------------------- the column writes

@dataclass
class Reported:
    """The columns a run reports (they are named by the data): written now, their
    descriptions, and every column the asset owns (the per-set columns of the registered sets
    and the union over them)."""

    fields: list[pa.Field]
    descriptions: dict[str, str]
    owned: list[str]


@dataclass
class ContaminationReport(ColumnWriteReport):
    """The union's write, with the per-set writes and the run's numbers."""

    sets: list[dict] = field(default_factory=list)
    per_set: list[ColumnWriteReport] = field(default_factory=list)
    registry_changed: bool = False
    contaminated_rows: int = 0
    rows_by_set: dict = field(default_factory=dict)
    reported: Reported | None = None

    @property
    def nothing_to_do(self) -> bool:
        return not self.fragments_written and all(r.nothing_to_do for r in self.per_set)

    @property
    def new_columns(self) -> list[str]:
        return [c for r in self.per_set if not r.nothing_to_do for c in r.columns]


def _sets_to_write(ds: lance.LanceDataset, sets: list[EvalSet]) -> list[EvalSet]:
    """The sets whose column some fragment lacks. Each set's column is a column group of its own
    (its own write marker): a set registered later, or a set dropped from the registry, never
    changes how another set's column was written, so its data files stay as they are."""
    return [s for s in sets
            if s.column not in ds.schema.names or fragments_missing(ds, [s.column])]


def _drop_union(table: Table) -> None:
    def attempt(ds: lance.LanceDataset) -> None:
        present = [f.name for f in UNION_FIELDS if f.name in ds.schema.names]
        if present:
            ds.drop_columns(present)

    table.commit("drop contaminated columns", attempt)


@dataclass
class Sets:
    """The per-set step's state: every registered set (checked and hashed), and those whose
    column the pinned version lacks (one group each)."""

    registered: list[EvalSet]
    todo: list[EvalSet]

    def __iter__(self) -> Iterator[EvalSet]:
        return iter(self.todo)


def load_sets(run: Run, before: None) -> Sets:
    """The first step's state: every registered set, checked and hashed."""
    with phase("contamination: reading the evaluation sets", run.log, announce=False):
        sets = load_eval_sets(list(run.settings.eval_sets))
    for s in sets:
        run.log(f"evaluation set {s.spec.name}: {s.items} items, {len(s.hashes)} distinct "
                f"{NGRAM}-grams, {s.items_too_short} items shorter than {NGRAM} words (not checked)")
    return Sets(sets, _sets_to_write(run.pinned, sets))


@dataclass
class PerSet:
    """The per-set step's result: the registered sets and the writes of their columns."""

    registered: list[EvalSet]
    written: list[ColumnWriteReport]


@dataclass
class Registry:
    """The union step's state: the registry recorded in the table's config, and its compute."""

    union: Union
    changed: bool  # another registry was recorded: the union columns were dropped first
    per_set: PerSet


def record_registry(run: Run, per_set: PerSet) -> Registry:
    """The union step's state, once the per-set columns are written: the registry recorded in
    the table's config (the union columns dropped first when it changed)."""
    table, sets = run.table, per_set.registered
    described = [s.to_dict() for s in sets]
    registry = {"ngram": NGRAM, "normalisation": NORMALISATION, "sets": described,
                "registry": registry_fingerprint(described)}
    stored = table.get_config(CONTAMINATION_KEY)
    changed = False
    if stored is None or stored.get("registry") != registry["registry"]:
        # drop first, then record: a run killed in between drops nothing more and records it;
        # a writer of the old registry that commits after the drop finds its columns gone
        changed = stored is not None
        _drop_union(table)
        table.set_config(CONTAMINATION_KEY, registry)
    elif stored != registry:  # same sets, other paths or counts: keep the config current
        table.set_config(CONTAMINATION_KEY, registry)
    return Registry(Union(table, registry["registry"], tuple(s.column for s in sets),
                          tuple(s.spec.name for s in sets)), changed, per_set)


def count_contaminated(run: Run, registry: Registry,
                       written: ColumnWriteReport) -> ContaminationReport:
    """After the union: contaminated rows, in all and by set, and the run's report."""
    ds = run.table.newest()
    sets = registry.per_set.registered
    report = ContaminationReport(
        **asdict(written), sets=[s.to_dict() for s in sets], per_set=registry.per_set.written,
        registry_changed=registry.changed,
        # column names are built here from checked names and hex digits, never from free text
        contaminated_rows=ds.count_rows(filter="contaminated = true"),
        rows_by_set={s.spec.name: ds.count_rows(filter=f"`{s.column}` = true") for s in sets})
    done = set(report.new_columns) | ({f.name for f in UNION_FIELDS}
                                      if not written.nothing_to_do else set())
    report.reported = Reported(
        # a no-op run reports the columns it owns
        fields=[f for f in ds.schema if f.name in (done or {f.name for f in UNION_FIELDS})],
        descriptions=set_column_descriptions(ds),
        owned=[f.name for f in UNION_FIELDS] + [s["column"] for s in report.sets])
    return report


STEPS = (
    # one group per set whose column some fragment of the pinned version lacks
    Step(fields=lambda settings, eval_set: [pa.field(eval_set.column, pa.bool_())], each=True,
         state=load_sets, compute=lambda settings, eval_set: SetOverlap.of([eval_set]),
         after=lambda run, sets, written: PerSet(sets.registered, written)),
    # then the union over the registered sets
    Step(fields=UNION_FIELDS, state=record_registry, compute=lambda settings, state: state.union,
         after=count_contaminated),
)


def registered_sets(ds: lance.LanceDataset) -> list[dict]:
    """The sets ``contaminated`` was last derived for (empty when none)."""
    return (get_json_config(ds, CONTAMINATION_KEY) or {}).get("sets", [])


def set_column_descriptions(ds: lance.LanceDataset) -> dict[str, str]:
    """Descriptions of the per-set columns the table holds (for the asset's column schema)."""
    out = {}
    for s in registered_sets(ds):
        out[s["column"]] = (f"True when `text` shares a normalised word {NGRAM}-gram with "
                            f"evaluation set '{s['name']}' ({s['path']}, field "
                            f"'{s['text_field']}', fingerprint {s['fingerprint'][:12]}).")
    return out


def summary(table: Table, report: ContaminationReport) -> dict:
    return {
        "nothing_to_do": report.nothing_to_do,
        "rows_written": report.rows_written + sum(r.rows_written for r in report.per_set),
        "eval_sets": Markdown(markdown_table([
            {**{k: s[k] for k in ("name", "column", "items", "items_too_short", "ngrams")},
             "rows": report.rows_by_set.get(s["name"], 0)} for s in report.sets])
            if report.sets else "no evaluation sets registered"),
        "contaminated_rows": report.contaminated_rows,
        "registry_changed": report.registry_changed,
        "new_set_columns": Json(report.new_columns),
    }


PRODUCER = ColumnProducer(
    name="contamination",
    doc="Benchmark contamination: `contaminated` (bool) and `contaminated_with` (set names) mark "
        "every document that shares a normalised word 13-gram with a registered evaluation set; "
        "one `contam_<name>_<fingerprint>` column per set makes new sets and new rows "
        "incremental. A blocking check on `curation_rules` stops training while a kept row is "
        "contaminated.",
    descriptions=DESCRIPTIONS, steps=STEPS, summary=summary, settings=ContaminationSettings,
    kinds=("lance", "numpy"))
