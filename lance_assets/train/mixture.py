"""Training blocks from one stream per domain, each domain's share of tokens held to its weight.

``--domains`` names the domains (``train.domains``), ``--weights`` their shares of the training
tokens. Each domain is its own packed stream (``StreamingDataset`` with ``pack_sequences``, its
filter the training split AND the domain's predicate, its shuffle permutation stored once per
run and epoch like the single stream's), and the trainer's blocks are drawn from them by the
schedule: global block ``g`` (split ``g % num_splits``, that split's ``g // num_splits``-th) is
the next block of split ``g % num_splits`` of domain ``schedule[g % PERIOD]``.

Why one stream per (domain, split): a split draws a domain as often as the schedule says, which
differs by a block or so between splits, so one domain's splits are never at one block count,
which ``StreamingDataset.merge_state_dicts`` requires of packed states. Each (domain, split)
stream is a ``StreamingDataset`` owning that one split, so its state belongs to the split alone:
a checkpoint holds every (domain, split) state and every split's block count, gathered from all
ranks, and any world size dividing ``num_splits`` resumes the same blocks in the same steps.

A domain whose split runs out starts its next epoch (a new permutation); a run that would read
any domain more than ``--max-repeats`` times is refused before it starts. Tokens and blocks read
per domain are counted per split, so they add up the same whatever the world size.
"""

from __future__ import annotations

import torch

from lance_assets import storage
from lance_assets.train import data
from lance_assets.train.domains import (  # noqa: F401 (Domain, Mixture, plan_mixture: this module's API)
    Domain,
    DomainError,
    Mixture,
    plan_mixture,
)
from lance_assets.train.streaming_adapter import SharedPermutationDataset

STATE_FORMAT = 1


def for_run(cfg, snap: data.TableSnapshot, train: data.Predicate, block_len: int, steps: int,
            global_batch: int) -> Mixture | None:
    """The mixture a trainer config (``--domains``, ``--weights``) asks for, or None."""
    if not cfg.domains:
        return None
    return plan_mixture(snap.table.to_lance(), domains=cfg.domains, weights=cfg.weights, train=train,
                        block_len=block_len, num_splits=cfg.num_splits, steps=steps,
                        global_batch=global_batch, seed=cfg.seed, max_repeats=cfg.max_repeats)


# ---- the loader


class _Stream:
    """Split ``split`` of domain ``domain``, epoch after epoch."""

    def __init__(self, owner: MixtureBatches, domain: int, split: int, saved: dict):
        self.owner, self.domain, self.split = owner, domain, split
        self.epoch, self.state = int(saved["epoch"]), saved["state"]
        self.tokens, self.blocks = int(saved["tokens"]), int(saved["blocks"])
        self.dataset: SharedPermutationDataset | None = None
        self.it = None

    def _open(self) -> None:
        o, d = self.owner, self.owner.mixture.domains[self.domain]
        stored = o.permutation(self.domain, self.epoch, build=True)
        self.dataset = SharedPermutationDataset(
            o.snap.table, permutation=stored, columns=["input_ids"], filter=d.filter,
            shuffle=True, shuffle_seed=o.seed, epoch=self.epoch, num_splits=o.num_splits,
            rank=self.split, world_size=o.num_splits, pack_sequences=o.block_len,
            eos_id=o.snap.tokenizer["eos_id"], pad_id=o.pad_id,
            blocks_per_epoch=d.blocks_per_epoch, **o.reader)
        if self.state is not None:
            self.dataset.load_state_dict(self.state)
        self.it = iter(self.dataset)

    def next_block(self) -> torch.Tensor:
        for _ in range(2):  # the current epoch, else the first block of the next one
            if self.it is None:
                self._open()
            try:
                block = next(self.it)["input_ids"]
            except StopIteration:
                self.epoch, self.state, self.dataset, self.it = self.epoch + 1, None, None, None
                continue
            self.blocks += 1
            self.tokens += int((block[1:] != self.owner.pad_id).sum())  # targets, as trained
            return block
        raise RuntimeError(f"domain {self.owner.mixture.names[self.domain]!r} split {self.split}: "
                           "an epoch without a block")

    def state_dict(self) -> dict:
        state = self.dataset.state_dict() if self.dataset is not None else self.state
        return {"epoch": self.epoch, "state": state, "tokens": self.tokens, "blocks": self.blocks}


def fresh_state(mixture: Mixture, num_splits: int) -> dict:
    """The loader state of a run that has read nothing."""
    return {"format": STATE_FORMAT, "mixture": mixture.key, "num_splits": num_splits,
            "emitted": [0] * num_splits,
            "streams": {d.name: [{"epoch": 0, "state": None, "tokens": 0, "blocks": 0}
                                 for _ in range(num_splits)] for d in mixture.domains}}


class MixtureBatches:
    """This rank's training blocks, ``batch_size`` at a time: its splits in turn (as one
    ``StreamingDataset`` over them would give them), each split's next block from the domain the
    schedule names for its global position. ``state_dict()`` is this rank's part of the loader
    state; ``merge_state_dicts`` joins every rank's into one that any world size resumes."""

    epoch = 0  # epochs are per domain and split, inside the state

    def __init__(self, snap: data.TableSnapshot, mixture: Mixture, *, state: dict | None,
                 batch_size: int, block_len: int, num_splits: int, rank: int, world_size: int,
                 seed: int, permutations: storage.Location, read_batch_size: int = 64,
                 io_queue_depth: int = 4, transform_parallelism: int | None = None,
                 transform_queue_depth: int | None = None):
        self.snap, self.mixture, self.seed = snap, mixture, seed
        self.batch_size, self.block_len, self.num_splits = batch_size, block_len, num_splits
        self.pad_id = snap.tokenizer["pad_id"]
        self.permutations, self.rank = permutations, rank
        self.reader = dict(read_batch_size=read_batch_size, io_queue_depth=io_queue_depth,
                           transform_parallelism=transform_parallelism,
                           transform_queue_depth=transform_queue_depth)
        state = state if state is not None else fresh_state(mixture, num_splits)
        check_state(state, mixture, num_splits)
        per_rank = num_splits // world_size
        self.splits = list(range(rank * per_rank, (rank + 1) * per_rank))
        self.emitted = {j: int(state["emitted"][j]) for j in self.splits}
        if len(set(self.emitted.values())) > 1:
            raise DomainError("the mixture's loader state is not at a step boundary (its splits "
                              f"gave {sorted(set(self.emitted.values()))} blocks); resume from "
                              "a checkpoint the trainer wrote")
        self.streams = {(i, j): _Stream(self, i, j, state["streams"][d.name][j])
                        for i, d in enumerate(mixture.domains) for j in self.splits}
        # ``io_queue_depth`` reads in flight shared by this rank's streams (one per domain and
        # split), not given to each: that read most of a small table ahead of the first step,
        # and its threads cost a small proxy run a fifth of its CPU time. The blocks are
        # the same whatever the depth.
        self.reader["io_queue_depth"] = max(1, io_queue_depth // len(self.streams))
        self._perms: dict[tuple[int, int], data.StoredPermutation] = {}
        self._turn = 0
        self._step_tokens = [0] * len(mixture.domains)
        # every epoch some split reads now: rank 0 stores it, the others wait for it
        wanted = {(i, int(s["epoch"])) for i, d in enumerate(mixture.domains) if d.weight > 0
                  for s in state["streams"][d.name]}
        for i, epoch in sorted(wanted):
            self.permutation(i, epoch, build=rank == 0)

    def permutation(self, domain: int, epoch: int, *, build: bool) -> data.StoredPermutation:
        """Domain ``domain``'s stored permutation of ``epoch`` (built here when ``build``: a
        later epoch is built by whichever rank reaches it first; the same key gives the same
        rows, so two ranks building it at once store the same permutation)."""
        if (domain, epoch) not in self._perms:
            key = data.PermutationKey(self.snap.version, self.mixture.domains[domain].filter,
                                      self.seed, epoch, self.num_splits)
            self._perms[domain, epoch] = data.shared_permutation(self.snap, key,
                                                                 self.permutations, build=build)
        return self._perms[domain, epoch]

    def __iter__(self) -> MixtureBatches:
        return self

    def __next__(self) -> torch.Tensor:
        blocks = []
        period = len(self.mixture.schedule)
        for _ in range(self.batch_size):
            split = self.splits[self._turn % len(self.splits)]
            position = self.emitted[split] * self.num_splits + split
            domain = int(self.mixture.schedule[position % period])
            stream = self.streams[domain, split]
            before = stream.tokens
            blocks.append(stream.next_block())
            self._step_tokens[domain] += stream.tokens - before
            self.emitted[split] += 1
            self._turn += 1
        return torch.stack(blocks)

    def take_step_tokens(self) -> list[int]:
        """Tokens (padding excluded) this rank read from each domain since the last call."""
        out, self._step_tokens = self._step_tokens, [0] * len(self.mixture.domains)
        return out

    def close(self) -> None:
        """Nothing to stop: the streams read in this process."""

    def state_dict(self) -> dict:
        if len(set(self.emitted.values())) > 1:
            raise RuntimeError("the mixture's loader state is only taken at a step boundary")
        streams = {d.name: [None] * self.num_splits for d in self.mixture.domains}
        for (i, j), stream in self.streams.items():
            streams[self.mixture.domains[i].name][j] = stream.state_dict()
        emitted = [self.emitted.get(j) for j in range(self.num_splits)]
        return {"format": STATE_FORMAT, "mixture": self.mixture.key,
                "num_splits": self.num_splits, "emitted": emitted, "streams": streams}

    @staticmethod
    def merge_state_dicts(states: list[dict]) -> dict:
        """Every rank's state joined: each split's entries from the rank that owned it."""
        first = states[0]
        merged = {**first, "emitted": list(first["emitted"]),
                  "streams": {d: list(v) for d, v in first["streams"].items()}}
        for state in states[1:]:
            if state["mixture"] != first["mixture"] or state["num_splits"] != first["num_splits"]:
                raise ValueError("loader states of different mixtures")
            for j, n in enumerate(state["emitted"]):
                if n is not None:
                    merged["emitted"][j] = n
            for d, entries in state["streams"].items():
                for j, entry in enumerate(entries):
                    if entry is not None:
                        merged["streams"][d][j] = entry
        if None in merged["emitted"] or len(set(merged["emitted"])) != 1:
            raise ValueError(f"the ranks' loader states do not cover every split at one step "
                             f"(blocks per split {merged['emitted']})")
        return merged


def batches_for_run(cfg, snap: data.TableSnapshot, mix: Mixture, state: dict | None, *,
                    block_len: int, rank: int, world_size: int,
                    permutations: storage.Location) -> MixtureBatches:
    """This rank's ``MixtureBatches`` under a trainer config."""
    return MixtureBatches(snap, mix, state=state, batch_size=cfg.batch_size, block_len=block_len,
                          num_splits=cfg.num_splits, rank=rank, world_size=world_size,
                          seed=cfg.seed, permutations=permutations,
                          read_batch_size=cfg.read_batch_size, io_queue_depth=cfg.io_queue_depth,
                          transform_parallelism=cfg.transform_parallelism,
                          transform_queue_depth=cfg.transform_queue_depth)


def across_redaction(state: dict, mix: Mixture) -> dict:
    """A mixture's loader state saved before ``forget`` redacted the run's snapshot, each
    domain's streams made to resume on the copy (``data.across_redaction``)."""
    if not isinstance(state, dict) or "streams" not in state:
        return state
    streams = {d.name: [{**s, "state": data.across_redaction(s.get("state"), d.blocks_per_epoch)}
                        for s in state["streams"].get(d.name, [])] for d in mix.domains}
    return {**state, "streams": streams}


def check_state(state: dict, mixture: Mixture, num_splits: int) -> None:
    """A checkpoint's loader state must be a mixture state of this very mixture."""
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        raise DomainError("--resume: the checkpoint was trained without --domains (or by another "
                          "version of the mixture loader); resume it without --domains/--weights, "
                          "or start a new --out")
    if state["num_splits"] != num_splits:
        raise DomainError(f"--num-splits {num_splits}: the checkpoint's mixture has "
                          f"{state['num_splits']} splits; keep --num-splits")
    if state["mixture"] != mixture.key:
        raise DomainError(f"--domains/--weights: the checkpoint was trained on the mixture "
                          f"{state['mixture']}, this run asks for {mixture.key}; resume with the "
                          "same --domains, --weights and --seed, or start a new --out")


def read_by_domain(state: dict, mixture: Mixture) -> dict[str, dict]:
    """Per domain: its weight, tokens (padding excluded) and blocks read, and the passes over it
    (blocks read / blocks per epoch), from a merged loader state."""
    out = {}
    for d in mixture.domains:
        entries = state["streams"][d.name]
        blocks = sum(int(e["blocks"]) for e in entries)
        out[d.name] = {"weight": round(d.weight, 6), "tokens_read": sum(int(e["tokens"])
                                                                         for e in entries),
                       "blocks_read": blocks, "tokens_available": d.tokens,
                       "epochs": round(blocks / d.blocks_per_epoch, 4) if d.blocks_per_epoch
                       else 0.0}
    total = sum(v["tokens_read"] for v in out.values())
    for v in out.values():
        v["share_read"] = round(v["tokens_read"] / total, 6) if total else 0.0
    return out


def flat(summary: dict) -> dict:
    """``summary`` with its ``domains`` as ``domain/<name>/<figure>`` entries and any other
    mapping (``redacted``) as ``<key>/<figure>`` ones: what a Pipes materialization takes (a
    nested dict is not a metadata value), and a plot across materializations."""
    out = {k: v for k, v in summary.items() if k != "domains" and not isinstance(v, dict)}
    for name, figures in summary.get("domains", {}).items():
        out.update({f"domain/{name}/{k}": v for k, v in figures.items()})
    for key, value in summary.items():
        if key != "domains" and isinstance(value, dict):
            out.update({f"{key}/{k}": v for k, v in value.items()})
    return out


def read_epochs(state: dict, mixture: Mixture, version: int, seed: int,
                root: storage.Location) -> list[dict] | None:
    """The read record's epochs (``table.read_record``): per domain and epoch, its stored
    permutation and how far each split advanced (a finished epoch: the whole split; one not
    started: nothing). None when an epoch's permutation is not stored here."""
    epochs = []
    num_splits = state["num_splits"]
    for d in mixture.domains:
        entries = state["streams"][d.name]
        for epoch in range(max(int(e["epoch"]) for e in entries) + 1):
            if all(int(e["epoch"]) == epoch and e["state"] is None for e in entries):
                continue  # no split has read from it yet
            key = data.PermutationKey(version, d.filter, seed, epoch, num_splits)
            stored = data.stored_rows(key, root)
            if stored is None:
                return None
            positions = []
            for j, e in enumerate(entries):
                if int(e["epoch"]) > epoch:
                    positions.append(int(stored[1][j]))
                elif int(e["epoch"]) == epoch and e["state"] is not None:
                    positions.append(int(e["state"]["samples_consumed_per_split"][j]))
                else:
                    positions.append(0)
            epochs.append({"epoch": epoch, "domain": d.name, "rows": stored[0],
                           "split_sizes": stored[1], "positions": positions})
    return epochs


def describe(mixture: Mixture) -> str:
    return ", ".join(f"{d.name} {d.weight:.3f} ({d.blocks_per_epoch:,} blocks/epoch, "
                     f"{mixture.epochs_needed[d.name]:.2f} epochs)" for d in mixture.domains)

