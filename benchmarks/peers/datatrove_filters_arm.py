"""The datatrove arm of ``benchmarks.fineweb_filters``; runs in datatrove's own environment
(``scripts/peers_venv.sh datatrove``).

    python benchmarks/peers/datatrove_filters_arm.py TEXTS.parquet OUT.parquet

FineWeb's four quality filters as its pipeline (datatrove's ``examples/fineweb.py``) sets them:
``GopherRepetitionFilter()``, ``GopherQualityFilter()``,
``C4QualityFilter(filter_no_terminal_punct=False)``, ``FineWebQualityFilter()``, each on every
document. The Gopher filters and C4 read the document as it comes; FineWeb's filter reads it as
C4 hands it on (C4 keeps the lines it does not drop, stripped, without citation marks; for a
document C4 drops, the same line edits with its document-level drops turned off). Saves one
keep/drop column per filter and prints the CPU and wall seconds of the filtering alone.
"""

import copy
import json
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
from datatrove.data import Document
from datatrove.pipeline.filters import (
    C4QualityFilter,
    FineWebQualityFilter,
    GopherQualityFilter,
    GopherRepetitionFilter,
)


def kept(result) -> bool:
    return result if isinstance(result, bool) else bool(result[0])


def main() -> None:
    src, out = sys.argv[1], sys.argv[2]
    texts = pq.read_table(src, columns=["text"]).column("text").to_pylist()
    rep, qual = GopherRepetitionFilter(), GopherQualityFilter()
    c4 = C4QualityFilter(filter_no_terminal_punct=False)
    # C4's line edits without its document-level drops: what FineWeb's filter would read
    c4_lines = C4QualityFilter(filter_no_terminal_punct=False, filter_lorem_ipsum=False,
                               filter_curly_bracket=False, min_num_sentences=-1)
    fineweb = FineWebQualityFilter()
    rep.filter(Document(text="warm up the word tokenizer.", id="0"))  # spaCy loads here
    cols: dict[str, list[bool]] = {"gopher_repetition": [], "gopher_quality": [], "c4": [],
                                   "fineweb": []}
    wall, cpu = time.perf_counter(), time.process_time()
    for i, text in enumerate(texts):
        doc = Document(text=text, id=str(i))
        cols["gopher_repetition"].append(kept(rep.filter(doc)))
        cols["gopher_quality"].append(kept(qual.filter(doc)))
        c4_doc = copy.copy(doc)
        c4_kept = kept(c4.filter(c4_doc))
        cols["c4"].append(c4_kept)
        if not c4_kept:
            c4_doc = copy.copy(doc)
            c4_lines.filter(c4_doc)
        cols["fineweb"].append(kept(fineweb.filter(c4_doc)))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    pq.write_table(pa.table(cols), out)
    print(json.dumps({"docs": len(texts), "wall_s": wall, "cpu_s": cpu}))


if __name__ == "__main__":
    main()
