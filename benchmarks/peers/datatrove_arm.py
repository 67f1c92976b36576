"""The datatrove arm of ``benchmarks.scale --peers``; runs in datatrove's own environment
(``scripts/peers_venv.sh``).

    python benchmarks/peers/datatrove_arm.py TEXTS.parquet WORK OUT.npy

HuggingFace datatrove's MinHash deduplication as FineWeb ran it, 4 stages (signatures,
buckets, clusters, filter) with its default settings, which are ours: word 5-grams, 14 buckets
x 8 hashes. One worker (the buckets stage as 14 tasks, one after another). Saves the ids it
removes; prints wall and CPU seconds.
"""

import json
import sys
import time
from pathlib import Path

import numpy as np
from datatrove.executor import LocalPipelineExecutor
from datatrove.pipeline.dedup.minhash import (
    MinhashConfig,
    MinhashDedupBuckets,
    MinhashDedupCluster,
    MinhashDedupFilter,
    MinhashDedupSignature,
)
from datatrove.pipeline.readers import ParquetReader
from datatrove.pipeline.writers import JsonlWriter


def main() -> None:
    src, work, out = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    config = MinhashConfig()
    reader = ParquetReader(str(src.parent), glob_pattern=src.name, text_key="text", id_key="id")
    stages = [
        [reader, MinhashDedupSignature(output_folder=str(work / "sigs"), config=config)],
        [MinhashDedupBuckets(input_folder=str(work / "sigs"), output_folder=str(work / "buckets"),
                             config=config)],
        [MinhashDedupCluster(input_folder=str(work / "buckets"),
                             output_folder=str(work / "remove_ids"), config=config)],
        [reader, MinhashDedupFilter(input_folder=str(work / "remove_ids"),
                                    exclusion_writer=JsonlWriter(str(work / "removed"),
                                                                 compression=None)),
         JsonlWriter(str(work / "kept"), compression=None)],
    ]
    wall, cpu = time.perf_counter(), time.process_time()
    for i, pipeline in enumerate(stages):
        # the buckets stage runs one task per bucket (datatrove requires it), one at a time
        tasks = config.num_buckets if i == 1 else 1
        LocalPipelineExecutor(pipeline=pipeline, tasks=tasks, workers=1,
                              logging_dir=str(work / f"logs{i}")).run()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    removed = [int(json.loads(line)["id"]) for f in sorted((work / "removed").glob("*.jsonl"))
               for line in f.read_text().splitlines() if line.strip()]
    np.save(out, np.array(sorted(removed), dtype=np.int64))
    print(json.dumps({"wall_s": wall, "cpu_s": cpu, "removed": len(removed)}))


if __name__ == "__main__":
    main()
