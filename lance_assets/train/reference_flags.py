"""Flags of the reference recipe's trainer (LanceDB's ``examples/llm_pretraining/train.py``) that
this trainer spells otherwise or does elsewhere.

A user arriving with a reference command line gets, for each such flag, one line naming the
equivalent here and exit status 2, instead of argparse's "unrecognized arguments" or a silent
difference. The flags both trainers share (``--pack``, ``--seq-len``, ``--num-splits``,
``--read-batch-size``, ``--io-queue-depth``, ``--transform-parallelism``,
``--transform-queue-depth``, ``--num-workers``, ``--mp-context``, ``--lr-total-steps`` ...) mean
the same in both. ``docs/seeds.md`` maps every command of the recipes.
"""

from __future__ import annotations

EQUIVALENTS = {
    "--db": "--data DATA, the data root (its LanceDB folder is DATA/lance)",
    "--ckpt-dir": "--out DIR, the run folder (checkpoints, metrics.jsonl, summary.json; "
                  "--resume auto looks there)",
    "--warmup-steps": "--warmup N (linear warmup steps)",
    "--shuffle-seed": "--seed N (seeds the loader's shuffle and the initial weights)",
    "--min-score": "--filter \"NOT is_dup AND score >= X\" (any SQL predicate over the table's "
                   "columns; the pretrained_model asset applies the curation rules in force)",
    "--eval-batches": "--eval-blocks N x --batch-size (validation blocks per pass, the same "
                      "blocks every run)",
    "--compile-mode": "--compile (torch.compile in its default mode)",
    "--blocks-mode": "the pre-packed A/B arms live in benchmarks/: python -m "
                     "benchmarks.build_packed_datasets, then make bench-loaders",
    "--blocks-path": "the pre-packed A/B arms live in benchmarks/: python -m "
                     "benchmarks.build_packed_datasets, then make bench-loaders",
    "--blocks-per-epoch": "nothing: the packed block budget is always computed exactly from "
                          "n_tokens (the reference's default)",
}

ZERO_MEANS_DEFAULT = {
    "--steps": "leave --steps out: --epochs decides (or 300 steps without it)",
    "--eval-every": "for one evaluation at the end, set --eval-every to the run's --steps",
    "--num-splits": "give the splits: a multiple of every world size x --num-workers the run "
                    "will use (default 8)",
    "--transform-queue-depth": "leave --transform-queue-depth out: no cap",
}
"""The reference's ``0 = its default`` values, which this trainer's ranges refuse."""

HF_TOKENIZER = ("the table is tokenized once, by the token_ids asset (its `tokenizer` run config: "
                "byte, the trained BPE, or a tiktoken encoding such as gpt2 when in tiktoken's "
                "cache); --tokenizer NAME here only checks that the table's input_ids are NAME's")


def refusal(argv: list[str]) -> str | None:
    """A one-line refusal for the first reference-only flag in ``argv``, else None."""
    for i, arg in enumerate(argv):
        name, _, value = arg.partition("=")
        if name in EQUIVALENTS:
            return f"{name} is the reference recipe's flag; here use {EQUIVALENTS[name]} (docs/seeds.md)"
        value = value or (argv[i + 1] if i + 1 < len(argv) else "")
        if name == "--tokenizer" and value.startswith("hf:"):
            return f"--tokenizer {value}: {HF_TOKENIZER} (docs/seeds.md)"
        if name in ZERO_MEANS_DEFAULT and value == "0":
            return (f"{name} 0 is the reference recipe's 'default'; here {ZERO_MEANS_DEFAULT[name]} "
                    "(docs/seeds.md)")
    return None
