"""`mixture_search`: a swarm, a regression, the chosen mixture verified with paired seeds.

Two planted corpora (``lance_assets.testing.mixture_planted``), byte-tokenized:

- **planted**: `prose`, `code` and `junk` (random consonant strings, 42 % of the tokens), the
  target in `prose`: the chosen weights must put under a tenth on `junk` and beat the natural
  mixture by a lead called real;
- **halves**: one corpus cut into two domains by a coin: no lead may be called real.

The search is the asset's (its config, its plan, every run the trainer's CLI with the asset's
own arguments), each run in this process instead of under torchrun, on a budget small enough
for the suite (64 steps of 8 x 32 tokens; the full defaults are timed in docs/benchmarks.md).
One run of the halves search is left to the asset, launched through torchrun and Dagster
Pipes, and the run config it hands out trains `pretrained_model` on the chosen weights.
"""

import contextlib
import io
import json
import shutil
from pathlib import Path

import dagster as dg
import numpy as np
import pyarrow.parquet as pq
import pytest

from lance_assets import paths
from lance_assets.ablation import mixture
from lance_assets.table import Table
from lance_assets.testing.mixture_planted import planted_domains, random_halves, url_domains
from lance_assets_tests.helpers import build_table, quiet

SMALL = {"proxies": 3, "token_budget": 16_384, "seq_len": 32, "eval_blocks": 128,
         "filter": "NOT is_dup"}


@pytest.fixture(autouse=True)
def one_thread():
    """A proxy's losses depend on torch's thread count; the figures are those of one thread,
    whatever the workers beside this one."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def corpus_root(base: Path, table) -> Path:
    source = base / "corpus.parquet"
    pq.write_table(table, source)
    return build_table(base / "data", str(source), rows_per_fragment=1000,
                       upto=["dedup_flag", "token_ids"])


@pytest.fixture(scope="module")
def planted_root(tmp_path_factory):
    return corpus_root(tmp_path_factory.mktemp("planted"), planted_domains())


@pytest.fixture(scope="module")
def halves_root(tmp_path_factory):
    return corpus_root(tmp_path_factory.mktemp("halves"), random_halves())


def config(**kw):
    from lance_assets.defs.training.mixture import MixtureConfig

    return MixtureConfig(**{**SMALL, **kw})


def in_process(stop_at: str | None = None):
    """The asset's launch, but the trainer's CLI in this process; ``stop_at``: that proxy trains
    a quarter of its steps (a checkpoint, no finished summary) and the search is cancelled."""
    from lance_assets.train.trainer import main

    def launch(spec):
        stopped = stop_at is not None and Path(spec.out).name.startswith(stop_at + "-")
        if stopped:
            spec = spec.replace(steps=spec.settings["steps"] // 4)
        with contextlib.redirect_stdout(io.StringIO()):
            assert main(spec.argv()) == 0
        if stopped:
            raise KeyboardInterrupt  # what a cancel does to the search

    return launch


def search(root: Path, cfg, stop_at: str | None = None) -> mixture.SearchReport:
    launch = in_process(stop_at)
    found = mixture.Search(Table.of(root), cfg, log=quiet)
    with contextlib.closing(found.runs()) as runs:
        for specs in runs:
            for spec in specs:
                launch(spec)
    return found.report


def test_planted_junk_gets_under_a_tenth_and_the_chosen_mixture_beats_natural(planted_root):
    """Also: a search cancelled in its swarm resumes on rerun; finished proxies are reused and
    the interrupted one continues from its checkpoint."""
    cfg = config(name="planted", domains=url_domains(["prose", "code", "junk"]),
                 target="url LIKE '%/prose/%'")
    with pytest.raises(KeyboardInterrupt):
        search(planted_root, cfg, stop_at="proxy-03")
    swarm = paths.ablation_dir(planted_root, "mixture-planted") / "swarm"
    finished = sorted(p.parent for p in swarm.glob("proxy-0[012]-*/summary.json"))
    (stopped,) = swarm.glob("proxy-03-*")
    assert len(finished) == 3 and list(stopped.glob("ckpt_*.pt"))
    before = {p: p.stat().st_mtime_ns for f in finished for p in f.iterdir()}

    report = search(planted_root, cfg)
    assert {p: p.stat().st_mtime_ns for p in before} == before  # reused, not retrained
    assert report.reused == 3 and report.trained == 6 + 9
    rows = [json.loads(line) for line in (stopped / "metrics.jsonl").read_text().splitlines()]
    assert sum(r["step"] == 0 for r in rows) == 1  # resumed from its checkpoint, not restarted

    weights = dict(zip(report.plan.names, report.chosen))
    natural = dict(zip(report.plan.names, report.arms["natural"]))
    assert natural["junk"] > 0.35 and weights["junk"] < 0.1, weights
    assert report.chosen.sum() == pytest.approx(1.0)
    lead = report.leads["natural"]
    assert report.lead_is_real is True and lead.lead > report.detectable, lead.text("val_bpb")
    means = {arm: mean for arm, (mean, _) in report.arm_bpb().items()}
    assert means["chosen"] < means["natural"] and means["chosen"] < means["uniform"]
    assert report.fit.loo_r2 > 0.3  # the weights explain held-out members' losses
    saved = json.loads((report.base / "results.json").read_text())
    assert saved["lead_is_real"] is True and saved["weights"]["junk"] < 0.1


def test_random_halves_call_no_lead_real_and_the_asset_hands_out_the_run_config(halves_root):
    """The search on halves calls nothing real. Then the asset itself, with one verification run
    deleted: every other run is found again, the missing one trains under torchrun through
    Pipes, and its metadata names the weights, the verdict and a run config that trains
    `pretrained_model` on them."""
    cfg = config(name="halves", domains=url_domains(["a", "b"]))
    report = search(halves_root, cfg)
    assert report.lead_is_real is False, report.leads["natural"].text("val_bpb")
    assert not any(lead.real for lead in report.leads.values())
    assert all(0 <= w <= 1 for w in report.chosen)

    from lance_assets.defs.training.mixture import materialize_in_process

    (gone,) = (report.base / "verify").glob("uniform-*/seed-2")
    shutil.rmtree(gone)
    result = materialize_in_process(halves_root, {**SMALL, "name": "halves",
                                                  "domains": url_domains(["a", "b"])})
    meta = result.asset_materializations_for_node("mixture_search")[0].metadata
    assert meta["runs_trained"].value == 1 and meta["runs_reused"].value == 6 + 8
    assert (gone / "summary.json").is_file()
    weights = meta["weights"].value
    assert weights == dict(zip(report.plan.names, report.chosen.tolist()))
    for key in ("predicted_bpb", "lead_over_natural", "smallest_detectable_lead",
                "regression_loo_rmse", "arm/chosen/val_bpb", "arm/natural/val_bpb",
                "arm/uniform/val_bpb"):
        assert isinstance(meta[key].value, float), key
    assert meta["lead_is_real"].value is False
    assert meta["plot"].value.startswith("![") and "data:image/png;base64," in meta["plot"].value
    assert len(meta["swarm"].value.records) == 6

    from lance_assets.defs.resources import LanceStore
    from lance_assets.defs.training.assets import pretrained_model
    from lance_assets.defs.training.torchrun import TorchrunPipesClient

    one_line = meta["pretrained_model_config"].value
    run_config = one_line["ops"]["pretrained_model"]["config"]
    assert set(run_config) == {"domains", "weights", "filter"}
    run_config.update(run_name="mixed", steps=4, seq_len=32, batch_size=8, eval_every=4,
                      eval_blocks=8, ckpt_every=4)
    dg.materialize([pretrained_model], run_config=one_line, resources={
        "lance_store": LanceStore(data_dir=str(halves_root)),
        "pipes_subprocess_client": TorchrunPipesClient(termination_timeout_seconds=55)})
    summary = json.loads((paths.run_dir(halves_root, "mixed") / "summary.json").read_text())
    shares = {d: v["share_read"] for d, v in summary["domains"].items()}
    assert shares == pytest.approx(weights, abs=0.02)


def test_without_domains_the_asset_does_nothing_and_says_how_to_configure_it(halves_root):
    from lance_assets.defs.training.mixture import materialize_in_process

    meta = materialize_in_process(halves_root, {}).asset_materializations_for_node(
        "mixture_search")[0].metadata
    assert "domains" in meta["skipped"].value and "domain_column" in meta["skipped"].value


def test_domains_that_overlap_or_miss_documents_are_refused_before_anything_trains(halves_root):
    from lance_assets.ablation.plan import AblationError

    for domains, said in [({"a": "url LIKE '%/a/%'"}, "in no domain"),
                          ({"a": "url LIKE '%/a/%'", "all": "n_tokens >= 0"}, "in two or more"),
                          ({"a": "url LIKE '%/a/%'", "b": "url; DROP TABLE corpus"}, "';'")]:
        with pytest.raises(AblationError, match=said):
            search(halves_root, config(name="refused", domains=domains))
    assert "ablation-mixture-refused" not in Table.of(halves_root).newest().tags.list()
    assert not (paths.ablation_dir(halves_root, "mixture-refused") / "swarm").exists()


def test_the_regression_finds_a_planted_optimum_and_its_leave_one_out_error():
    """A known loss surface (the loss falls with log of the first weight, rises with the third)
    sampled like a swarm: the fit's leave-one-out error is small against the spread and the
    optimum within the caps puts the third domain at zero and the first at its cap."""
    from lance_assets.ablation import regression

    caps = np.array([0.7, 1.0, 1.0])
    w = regression.swarm(caps, 15, seed=0)
    rng = np.random.default_rng(1)
    loss = 2.0 - 0.1 * np.log(w[:, 0] + 0.01) + 0.5 * w[:, 2] + rng.normal(0, 0.005, len(w))
    fit = regression.fit(w, loss)
    assert fit.loo_rmse < 0.1 * loss.std() and fit.loo_r2 > 0.95
    best, predicted = regression.best_mixture(fit, caps, seed=0)
    assert best[0] == pytest.approx(0.7, abs=0.03) and best[2] < 0.02
    assert (best <= caps + 1e-9).all() and best.sum() == pytest.approx(1.0)
    assert predicted < loss.min()


def test_a_budget_the_swarm_cannot_draw_is_refused_naming_the_smallest_domain():
    """A domain whose tokens allow it no share under max_repeats: the swarm cannot draw a
    mixture, and the search says which domain and how much it holds (``Search`` draws the
    swarm before it tags the version or writes plan.json), never a raw ValueError."""
    from lance_assets.ablation.plan import AblationError

    plan = mixture.SearchPlan(7, "NOT is_dup", "", 10, 400, 64, 512, 16_384, [
        mixture.DomainPlan("web", "url LIKE '%/web/%'", 900, 90_000, 2_728, 0.99, 1.0),
        mixture.DomainPlan("tiny", "url LIKE '%/tiny/%'", 2, 300, 8, 0.01, 0.0)])
    with pytest.raises(AblationError, match=r"domain 'tiny' \(predicate `url LIKE '%/tiny/%'`\) "
                                            r"holds 2 rows / 300 tokens at version 7, at most "
                                            r"share 0\.0000"):
        mixture.swarm_weights(plan, config(), 6)


@pytest.mark.xdist_group("ray")
def test_proxies_as_ray_tasks_train_what_the_local_path_trains(ray_cluster, halves_root, tmp_path):
    """Two proxies as Ray tasks (torchrun in each, one thread) and the same two trained here
    (one thread): the same held-out losses, document by document."""
    from lance_assets.ablation import remote
    from lance_assets.table import snapshots

    cfg = config(name="ray", domains=url_domains(["a", "b"]), token_budget=2048, eval_blocks=32)
    table = Table.of(halves_root)
    version = table.choose().version
    table.snapshots.hold("ablation-mixture-ray", version, owner="test", kind=snapshots.ABLATION)
    plan = mixture.plan_search(table.open(version), cfg, cfg.filter)
    weights = [np.array([0.3, 0.7]), np.array([0.8, 0.2])]

    def runs(where: str):
        return [mixture.make_run(table, cfg, plan, w, 0, tmp_path / where / str(i),
                                 ("ablation-mixture-ray", version))
                for i, w in enumerate(weights)]

    remote.train_on_ray(runs("ray"), threads=1, log=quiet)
    launch = in_process()
    for run in runs("local"):
        launch(run)
    for i in range(len(weights)):
        on_ray = json.loads((tmp_path / "ray" / str(i) / "held_out.json").read_text())
        here = json.loads((tmp_path / "local" / str(i) / "held_out.json").read_text())
        assert on_ray["doc_tokens"] == here["doc_tokens"] and len(here["doc_tokens"]) > 5
        assert on_ray["doc_loss"] == here["doc_loss"], i  # bit for bit
        summary = json.loads((tmp_path / "ray" / str(i) / "summary.json").read_text())
        assert summary["domains"]["a"]["weight"] == weights[i][0]
