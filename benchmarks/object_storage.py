"""The whole asset graph on a local folder against the same graph on S3 (moto on 127.0.0.1).

    python -m benchmarks.object_storage [--rows 600] [--steps 10]

Runs every asset of ``lance_assets.definitions`` (ingest ``synthetic:ROWS``, every column, the
indexes, the BPE, ``tiny`` training for ``--steps`` steps under torchrun, samples, forensics)
once with the data root in a temporary folder (the baseline) and once with
``LANCE_ASSETS_DATA=s3://bench/prefix`` on an in-process moto S3 server. Prints the wall-clock
of each, per-asset step times and the S3/local ratio. moto keeps objects in memory and answers
over loopback HTTP, so the ratio measures the request overhead of the object-store code paths,
not a real bucket's latency.
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import tempfile
import time


def run_graph(rows: int, steps: int) -> tuple[float, dict[str, float]]:
    """Materialize the whole graph against ``$LANCE_ASSETS_DATA``; (seconds, per-step seconds)."""
    import dagster as dg

    from lance_assets.definitions import defs
    from lance_assets.defs.curation.checks import CHECKS
    from lance_assets.defs.resources import lance_store_from_env
    from lance_assets.defs.training.torchrun import TorchrunPipesClient

    os.environ["LANCE_ASSETS_SOURCE"] = f"synthetic:{rows}"
    run_config = {"ops": {
        "raw_text": {"config": {"rows_per_fragment": 200}},
        "pretrained_model": {"config": {"steps": steps, "seq_len": 64, "batch_size": 8,
                                        "eval_every": steps, "ckpt_every": steps,
                                        "nproc_per_node": 1, "run_name": "bench"}},
        "samples": {"config": {"prompts": ["The", ""], "max_new_tokens": 8}},
        "vector_index": {"config": {"recall_queries": 5}},
        "forensics": {"config": {"near_dup_sample": 100}},
    }}
    instance = dg.DagsterInstance.ephemeral()
    start = time.perf_counter()
    result = dg.materialize([*defs.assets, *CHECKS], run_config=run_config, instance=instance,
                            resources={"lance_store": lance_store_from_env(),
                                       "pipes_subprocess_client": TorchrunPipesClient()})
    total = time.perf_counter() - start
    assert result.success
    steps_s: dict[str, float] = {}
    started: dict[str, float] = {}
    for entry in instance.all_logs(result.run_id):
        event = entry.dagster_event
        if event is None:
            continue
        if event.event_type_value == "STEP_START":
            started[event.step_key] = entry.timestamp
        elif event.event_type_value == "STEP_SUCCESS" and event.step_key in started:
            steps_s[event.step_key] = entry.timestamp - started[event.step_key]
    return total, steps_s


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=600, help="synthetic documents to ingest")
    p.add_argument("--steps", type=int, default=10, help="training steps of the tiny model")
    args = p.parse_args()
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    os.environ.setdefault("LANCE_LOG", "error")

    with tempfile.TemporaryDirectory() as tmp:
        os.environ["LANCE_ASSETS_DATA"] = os.path.join(tmp, "data")
        local_s, local_steps = run_graph(args.rows, args.steps)

    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        os.environ.update({"AWS_ENDPOINT_URL": f"http://{host}:{port}",
                           "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
                           "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true",
                           "LANCE_ASSETS_DATA": "s3://bench/prefix"})
        boto3.client("s3").create_bucket(Bucket="bench")
        s3_s, s3_steps = run_graph(args.rows, args.steps)
    finally:
        server.stop()

    print(f"machine: {platform.machine()}, {os.cpu_count()} cores; rows {args.rows}, "
          f"tiny x {args.steps} steps")
    print("| step | local s | moto S3 s | S3/local |\n|---|---:|---:|---:|")
    for key in sorted(local_steps, key=lambda k: -local_steps[k]):
        if key in s3_steps and local_steps[key] >= 0.5:
            print(f"| {key} | {local_steps[key]:.1f} | {s3_steps[key]:.1f} | "
                  f"{s3_steps[key] / local_steps[key]:.2f} |")
    print(f"| **whole graph** | **{local_s:.1f}** | **{s3_s:.1f}** | **{s3_s / local_s:.2f}** |")


if __name__ == "__main__":
    main()
