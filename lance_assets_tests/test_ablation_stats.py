"""The paired verdict's statistics: the held-out error per document, the rule's error rates, and
the power projection, checked by simulation against ablations whose truth is known.

A simulated ablation: two arms, n seeds, D held-out documents of unequal length. A run's loss on
document d is ``tokens_d x (base_d + doc_effect_d + seed_s + run_noise + token noise)``: the seed
moves both arms alike (shared initialisation), ``doc_effect_d`` is how much worse arm B is on
that document (its mean over the population of documents is the true lead), ``run_noise`` is
training noise of one run. Under the null the true lead is 0 but the held-out documents still
favour one arm by chance, which only the held-out part of the error accounts for.
"""

import math

import numpy as np
import pytest
import torch

from lance_assets.ablation import plan as ablation
from lance_assets.ablation.stats import (
    HeldOut,
    Lead,
    detectable_lead,
    paired_lead,
    ratio_se,
)


def simulate(rng, *, lead: float, seeds: int = 3, docs: int = 40, seed_sd: float = 0.2,
             run_sd: float = 0.02, doc_sd: float = 0.1) -> tuple[dict, dict]:
    tokens = rng.integers(200, 3000, size=docs).astype(float)
    base = rng.normal(3.0, 0.5, size=docs)
    doc_effect = lead + rng.normal(0, doc_sd, size=docs)  # this held-out sample's own luck
    a, b = {}, {}
    for s in range(seeds):
        shared = rng.normal(0, seed_sd)
        for runs, effect in ((a, 0.0), (b, doc_effect)):
            noise = rng.normal(0, run_sd) + rng.normal(0, 0.3, size=docs) / np.sqrt(tokens)
            loss = tokens * (base + effect + shared + noise)
            held = HeldOut(loss, tokens, None)
            runs[s] = (held.value, held)
    return a, b


def rate(rng, trials: int, **kw) -> float:
    real = 0
    for _ in range(trials):
        a, b = simulate(rng, **kw)
        real += paired_lead("a", a, "b", b).real
    return real / trials


def test_ratio_se_is_the_standard_error_of_the_mean_for_equal_documents():
    rng = np.random.default_rng(0)
    per_doc = rng.normal(2.0, 0.3, size=50)
    tokens = np.full(50, 100.0)
    assert ratio_se(per_doc * tokens, tokens) == pytest.approx(
        per_doc.std(ddof=1) / math.sqrt(50))
    assert ratio_se(np.array([5.0]), np.array([2.0])) is None


def test_the_rule_calls_a_null_lead_real_about_five_times_in_a_hundred():
    """No true lead, seeds that move both arms by far more than any lead, held-out documents that
    favour one arm by chance: the rule's false positives stay at its 5 % level. Without the
    held-out part of the error (documents' luck counted as if it were the truth) they do not."""
    rng = np.random.default_rng(1)
    assert rate(rng, 1500, lead=0.0) <= 0.07
    lucky_documents = {"doc_sd": 0.3, "run_sd": 0.01}  # steady training, a telling sample
    assert rate(rng, 1500, lead=0.0, **lucky_documents) <= 0.07
    seeds_only = 0
    for _ in range(600):
        a, b = simulate(rng, lead=0.0, **lucky_documents)
        lead = paired_lead("a", a, "b", b)
        seeds_only += lead.lead > 4.303 * lead.seed_se  # t(0.975, 2) x the seed part alone
    assert seeds_only / 600 > 0.15


def test_the_detectable_lead_is_detected_four_times_in_five():
    """The projection: a true lead equal to the smallest detectable lead the plan reports is
    called real with about the promised power (0.8), and a lead twice that almost always."""
    rng = np.random.default_rng(2)
    # the detectable lead from the error parts the simulation really has (not estimates)
    truth = Lead("a", "b", [0, 1, 2], [0.0] * 3, 0.0, seed_se=math.sqrt(2) * 0.02 / math.sqrt(3),
                 held_out_se=0.1 / math.sqrt(40), held_out_docs=40, se=None, df=None, real=None)
    mde = detectable_lead(truth, 3)
    assert 0.05 < mde < 0.2
    assert 0.65 <= rate(rng, 800, lead=mde) <= 0.95
    assert rate(rng, 300, lead=2 * mde) >= 0.97


def test_more_seeds_shrink_the_detectable_lead_down_to_the_held_out_floor():
    one = Lead("a", "b", [0], [0.1], 0.1, None, 0.01, 40, None, None, None)
    floor = detectable_lead(one, 3)  # one seed: only the held-out part is known
    assert floor == pytest.approx(2.8016 * 0.01, rel=1e-3)
    two = Lead("a", "b", [0, 1], [0.1, 0.2], 0.15, 0.05, 0.01, 40, None, None, None)
    mdes = [detectable_lead(two, n) for n in (2, 3, 5, 10, 100)]
    assert mdes == sorted(mdes, reverse=True) and mdes[-1] > floor


def test_runs_without_held_out_losses_are_paired_on_their_summaries():
    """Runs trained before the trainer wrote per-document losses still compare (seed part only)."""
    arm = ablation.ArmPlan("x", {}, "", "", 1, 1, 1.0, 1, 0.5, True)
    a = ablation.ArmResult("a", arm, {s: {"val_bpb": 2.0 + s / 10} for s in range(3)},
                           {s: None for s in range(3)})
    b = ablation.ArmResult("b", arm, {s: {"val_bpb": 2.3 + s / 10 + 0.01 * (s % 2)}
                                      for s in range(3)}, {s: None for s in range(3)})
    v = ablation.verdict([b, a])
    assert v.best == "a" and v.real and v.lead.held_out_se is None


def test_evaluate_sums_the_loss_per_document_told_apart_by_eos():
    """The trainer's evaluation: per-document sums equal each document's own token losses, and
    their ratio is the plain mean loss over every validation token."""
    from lance_assets.train import data
    from lance_assets.train.collectives import Collectives
    from lance_assets.train.evaluation import evaluate
    from lance_assets.train.model import GPT, config_for

    torch.manual_seed(0)
    eos, pad = 256, 257
    docs = [torch.randint(0, 256, (n,)) for n in (5, 40, 1, 23, 60)]
    stream = torch.cat([torch.cat([d, torch.tensor([eos])]) for d in docs])
    block = 17
    stream = torch.cat([stream, torch.full((block - len(stream) % block,), pad)])
    blocks = stream.view(-1, block)
    model = GPT(config_for("tiny", 258, block - 1))
    is_eos = (blocks == eos).long().sum(1)
    first_doc = torch.cumsum(is_eos, 0) - is_eos  # documents closed before each block
    val = data.ValBlocks(blocks, first_doc)
    ev = evaluate(model, val, pad, Collectives(torch.device("cpu")), 3, torch.no_grad, eos)

    with torch.no_grad():
        logits, _ = model(blocks[:, :-1])
    nll = torch.nn.functional.cross_entropy(logits.flatten(0, 1), blocks[:, 1:].flatten(),
                                            reduction="none").view(blocks.shape[0], -1)
    owner = torch.cumsum((stream == eos).long(), 0) - (stream == eos).long()
    owner = owner.view(blocks.shape)[:, 1:]
    target_is_token = blocks[:, 1:] != pad
    expected = [float(nll[(owner == d) & target_is_token].sum()) for d in range(len(docs))]
    counts = [int(((owner == d) & target_is_token).sum()) for d in range(len(docs))]
    assert ev.doc_tokens == counts and sum(counts) == int(target_is_token.sum())
    assert ev.doc_loss == pytest.approx(expected, rel=1e-6)
    assert ev.loss == pytest.approx(sum(expected) / sum(counts), rel=1e-6)
    assert ev.loss_se is not None and ev.loss_se > 0
