"""Quality that says something: intervals on every figure, multiple-choice tasks scored by log-likelihood once
per distinct distribution (through lm-eval), and a speed-up plot that reads at the paper grid's size."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from pipeline.measure.intervals import bootstrap_interval, fmt_quality, interval, per_example

REPO = Path(__file__).resolve().parents[1]


# ---- intervals -----------------------------------------------------------------------------------


def test_a_proportion_gets_wilsons_interval():
    low, high, how = interval([1.0] * 30 + [0.0] * 70)
    assert how == "wilson"
    assert (round(low, 3), round(high, 3)) == (0.219, 0.396)  # Wilson's 95% interval for 30 of 100, by its formula
    low, high, _ = interval([0.0] * 20)  # none passed: the interval still has a width, unlike the normal one
    assert low == 0.0 and 0.15 < high < 0.17


def test_other_scores_get_a_seeded_bootstrap_around_their_mean():
    values = [0.5, 1.0, 0.0, 0.25] * 10
    low, high, how = interval(values)
    assert how == "bootstrap" and low < sum(values) / len(values) < high
    assert interval(values) == (low, high, how)  # seeded
    assert interval([]) == (None, None, None)
    assert bootstrap_interval([0.0] * 5) == (0.0, 0.0)  # a paired difference of nothing: no width


def test_samples_of_one_example_are_averaged_before_the_interval():
    assert per_example(["a", "a", "b", "c"], [1.0, 0.0, 1.0, None]) == [0.5, 1.0]
    assert fmt_quality(0.3125, 0.27, 0.361) == "0.31 [0.27, 0.36]"
    assert fmt_quality(None, None, None) == "-" and fmt_quality(0.5, None, None) == "0.50"


def test_the_score_summary_carries_each_metrics_interval(tmp_path):
    from pipeline.job.scoring import intervals

    scores = [{"pass@1": 1.0}, {"pass@1": 0.0}, {"pass@1": 0.0}, {"pass@1": 1.0}]
    got = intervals(scores, ["p1", "p2", "p3", "p4"])
    assert set(got) == {"pass@1_low", "pass@1_high"}
    assert got["pass@1_low"] < 0.5 < got["pass@1_high"]


# ---- distributions -------------------------------------------------------------------------------


def test_the_default_grid_is_scored_once_per_distribution():
    from pipeline.experiment.checks import load_checked
    from pipeline.job.likelihood import grid_distributions, job_specs

    config, cells = load_checked(REPO / "config" / "default.yaml")
    dists = grid_distributions(cells)
    uses = {key: set(d["uses"]) for key, d in dists.items()}
    # the large model, three weighted ensembles (one over the union of two tokenizers), one contrastive
    assert len(dists) == 5, list(dists)
    union = "we(weights=0.5/0.5): smollm2-135m-instruct + smollm2-student-v4k"
    large = uses["smollm2-135m-instruct"]
    assert {"large_model (smollm2-135m-instruct)", "sd (smol+l2)", "hf_prompt_lookup (smol+l1)"} <= large
    we = uses["we(weights=0.5/0.5): smollm2-135m-instruct + smollm2-draft-l2"]
    assert we == {"we (smol+l2)", "we_sd (smol+l2)", "we_se (smol+l2)", "we_me (smol+l2)"}
    peers = uses["we(weights=0.5/0.5): smollm2-135m-instruct + smollm2-draft-l1-full"]
    assert "hf_assisted_ensemble (smol+l1)" in peers and "we_sd (smol+l1)" in peers  # lambda 0.5 = weight 0.5
    assert uses["cd(alpha=0.1): smollm2-135m-instruct + smollm2-draft-l1-full"] == {
        "cd (smol+l1)",
        "cd_sd (smol+l1)",
        "cd_se (smol+l1)",
    }
    spec = job_specs(config, cells)["mmlu_mc"]
    assert spec["limit"] == config["likelihood_tasks"]["mmlu_mc"]["limit"]
    assert union in dists and union not in spec["distributions"]  # log-likelihood is over one tokenization
    assert set(spec["distributions"]) == set(dists) - {union}
    assert set(spec["models"]) == {m for k, d in dists.items() if k != union for m in d["models"]}


def test_different_arguments_are_different_distributions():
    from pipeline.job.likelihood import distribution

    a = distribution("we_sd", ["x", "y"], {"lambda": 0.3, "proposer": "draft"})[0]
    assert a == distribution("we", ["x", "y"], {"lambda": 0.3})[0]
    assert a != distribution("we", ["x", "y"], {"lambda": 0.5})[0]
    assert distribution("small_model", ["x", "y"], {})[0] == "y"
    assert distribution("hf_prompt_lookup", ["x", "y"], {})[0] == "x"


# ---- log-likelihoods through lm-eval -------------------------------------------------------------

DISTRIBUTIONS = {
    "large": {"method": "large_model", "models": ["a"], "args": {}},
    "we": {"method": "we", "models": ["a", "b"], "args": {"lambda": 0.3}},
    "cd": {"method": "cd", "models": ["a", "b"], "args": {"alpha": 0.1}},
    "small": {"method": "small_model", "models": ["b"], "args": {}},
}
SPECENS = {"large": ("large_model", {}), "we": ("we_sd", {"lambda": 0.3}), "cd": ("cd_se", {"alpha": 0.1})}


@pytest.fixture(scope="module")
def shared_lm(tiny_dir, tiny_dir2):
    from pipeline.job.likelihood import load_distributions

    entries = {"a": {"name": "a", "source": str(tiny_dir)}, "b": {"name": "b", "source": str(tiny_dir2)}}
    return load_distributions(DISTRIBUTIONS, entries)


def test_shared_forwards_give_the_specens_models_loglikelihoods(shared_lm, tiny_dir, tiny_dir2):
    """Each question's context run once per model (KV cache, answers batched) and every distribution combined
    from the same rows: the same log-likelihoods as the specens model's, one request at a time."""
    from lm_eval.api.instance import Instance

    from pipeline.job.lm_eval_model import SpecEnsLM

    args = [
        ("Question: what is 2 + 2?\nAnswer:", " 4"),
        ("Question: what is 2 + 2?\nAnswer:", " five or so"),
        ("Question: what is 2 + 2?\nAnswer:", " a number between three and five"),
        ("The cat sat on", " the mat."),
        ("", "Hello world"),
    ]
    requests = [Instance("loglikelihood", {}, a, i) for i, a in enumerate(args)]
    shared = shared_lm.loglikelihood(requests, disable_tqdm=True)
    for key, (method, method_args) in SPECENS.items():
        lm = SpecEnsLM(models=f"a={tiny_dir}+b={tiny_dir2}", method=method, **method_args)
        for got, want in zip(shared, lm.loglikelihood(requests, disable_tqdm=True)):
            assert got[key][0] == pytest.approx(want[0], abs=1e-4) and got[key][1] == want[1]
    single = SpecEnsLM(models=f"b={tiny_dir2}").loglikelihood(requests, disable_tqdm=True)
    assert [s["small"][0] for s in shared] == pytest.approx([w[0] for w in single], abs=1e-4)


def test_a_context_longer_than_the_window_is_cut_as_the_specens_model_cuts_it(shared_lm, tiny_dir, tiny_dir2):
    from lm_eval.api.instance import Instance

    from pipeline.job.lm_eval_model import SpecEnsLM

    args = [("One two three four five six", " seven eight"), ("One two three four five six", " nine")]
    requests = [Instance("loglikelihood", {}, a, i) for i, a in enumerate(args)]
    shared_lm.max_length = 5
    try:
        shared = shared_lm.loglikelihood(requests, disable_tqdm=True)
    finally:
        shared_lm.max_length = 2048
    lm = SpecEnsLM(models=f"a={tiny_dir}+b={tiny_dir2}", method="we", **{"lambda": 0.3}, max_length=5)
    want = lm.loglikelihood(requests, disable_tqdm=True)
    assert [s["we"][0] for s in shared] == pytest.approx([w[0] for w in want], abs=1e-4)


def test_the_task_is_scored_by_lm_evals_own_metrics(shared_lm, tiny_dir, monkeypatch):
    """mmlu_mc through lm-eval's evaluator with the specens model: the same acc and acc_norm per question as
    the shared scoring, and each figure's interval."""
    import lm_eval

    from pipeline.job.likelihood import lm_eval_task, score_task
    from pipeline.job.lm_eval_model import SpecEnsLM

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    limit = 6
    found = score_task("mmlu_mc", shared_lm, limit=limit)
    assert found["questions"] == limit and set(found["scores"]) == set(DISTRIBUTIONS)
    large = found["scores"]["large"]
    assert set(large["metrics"]) == {"acc", "acc_norm"}
    for metric, f in large["metrics"].items():
        values = large["per_question"][metric]
        assert len(values) == limit and f["value"] == pytest.approx(sum(values) / limit)
        assert f["low"] <= f["value"] <= f["high"] and f["interval"] == "wilson"
    theirs = lm_eval.simple_evaluate(
        model=SpecEnsLM(models=f"a={tiny_dir}"),
        tasks=[lm_eval_task("mmlu_mc")],
        limit=limit,
        log_samples=True,
    )
    samples = sorted(theirs["samples"]["mmlu_mc"], key=lambda x: x["doc_id"])
    for metric in ("acc", "acc_norm"):
        assert [float(x[metric]) for x in samples] == large["per_question"][metric]


def test_a_task_that_is_not_multiple_choice_is_one_clear_line():
    from pipeline.errors import UserError
    from pipeline.job.likelihood import lm_eval_task

    with pytest.raises(UserError, match="humaneval_local.*generate_until.*expected one task of output type"):
        lm_eval_task("humaneval_local")


def test_the_shipped_subset_and_its_licence():
    data = REPO / "tasks" / "lm_eval" / "data"
    rows = [json.loads(line) for line in (data / "mmlu_subset.jsonl").read_text().splitlines()]
    assert len(rows) == 500 and all(len(r["choices"]) == 4 and r["answer"] in range(4) for r in rows)
    assert "MIT" in (data / "README.md").read_text()


# ---- the quality tables ----------------------------------------------------------------------------


LARGE = "smollm2-135m-instruct"
WE = "we(weights=0.5/0.5): smollm2-135m-instruct + smollm2-draft-l2"


def _likelihood_file(results: Path) -> None:
    """likelihood/mmlu_mc.json as the job writes it: the large model, an ensemble of the grid (9 and 15 right of
    30, the ensemble right wherever the large model is), and a distribution of another config's grid."""
    large, we = [1.0] * 9 + [0.0] * 21, [1.0] * 15 + [0.0] * 15

    def score(values, models, uses):
        low, high, how = interval(values)
        metrics = {"acc": {"value": sum(values) / len(values), "low": low, "high": high, "interval": how}}
        return {"metrics": metrics, "per_question": {"acc": values}, "models": models, "uses": uses}

    scores = {
        LARGE: score(large, [LARGE], [f"large_model ({LARGE})", "sd (smol+l2)", "sd (gone)"]),
        WE: score(we, [LARGE, "smollm2-draft-l2"], ["we (smol+l2)", "we_sd (smol+l2)"]),
        "old": score(we, ["x", "y"], ["we (a set of another config)"]),
    }
    (results / "likelihood").mkdir()
    found = {"task": "mmlu_mc", "questions": 30, "confidence": 0.95, "scores": scores}
    (results / "likelihood" / "mmlu_mc.json").write_text(json.dumps(found))


def test_the_quality_tables_give_each_figure_its_interval(tmp_path):
    from pipeline.report.aggregate import TABLES
    from pipeline.report.figures import collect

    tables = {t.name: t for t in TABLES}

    results = synthetic_results(tmp_path, "default.yaml")
    for i, summary in enumerate(sorted((results / "generations" / "humaneval").rglob("*.speed.json"))):
        low, high, _ = interval([1.0] * (i % 3) + [0.0] * (20 - i % 3))
        figures = {"task": "humaneval", "pass@1": (i % 3) / 20, "pass@1_low": low, "pass@1_high": high}
        summary.with_name(summary.name.replace(".speed.", ".summary.")).write_text(json.dumps(figures))
    _likelihood_file(results)
    found = collect(results)
    numbers, text = tables["quality"].shape(found, tables["quality"])
    assert list(numbers.columns) == ["humaneval pass@1", "humaneval pass@1_high", "humaneval pass@1_low"]
    assert list(text.columns) == ["humaneval pass@1"]  # Spec-Bench's cells are timed, not scored
    assert len(text) == found.cells["dataset"].eq("humaneval").sum() < len(found.cells)
    assert set(text["humaneval pass@1"]) == {"0.00 [0.00, 0.16]", "0.05 [0.01, 0.24]", "0.10 [0.03, 0.30]"}

    numbers, text = tables["likelihood"].shape(found, tables["likelihood"])
    assert list(numbers.index) == [LARGE, WE]  # the other config's distribution left out
    assert text.loc[LARGE, "methods"] == f"large_model ({LARGE}); sd (smol+l2)"
    assert text.loc[WE, "mmlu_mc acc (n=30)"] == "0.50 [0.33, 0.67]"
    assert text.loc[LARGE, "mmlu_mc acc - large"] == "-"  # the ensemble's difference, paired by question
    assert numbers.loc[WE, "mmlu_mc acc - large"] == pytest.approx(0.2)  # paired: significant, though the
    assert 0 < numbers.loc[WE, "mmlu_mc acc - large_low"] < 0.2 < numbers.loc[WE, "mmlu_mc acc - large_high"]
    assert numbers.loc[WE, "mmlu_mc acc (n=30)_low"] < numbers.loc[LARGE, "mmlu_mc acc (n=30)_high"]  # overlap


# ---- the speed-up plot at the paper grid's size ------------------------------------------------------


def synthetic_results(root: Path, config: str = "paper.yaml") -> Path:
    """A results tree of a config's cells (the paper grid's 384) as the aggregator reads it: grid.json, and per cell its
    samples (none: no ratio across cells) and a .speed.json with a side-by-side speed-up, some unstable."""
    from pipeline.experiment.checks import load_checked

    _, cells = load_checked(REPO / "config" / config)
    results = root / "results"
    (results / "generations").mkdir(parents=True)
    (results / "grid.json").write_text(json.dumps([c.dims.to_json() for c in cells.values()]))
    rng = random.Random(0)
    for cell_id, c in cells.items():
        base = results / "generations" / f"{cell_id}.jsonl"
        base.parent.mkdir(parents=True, exist_ok=True)
        base.write_text("")
        speed = {"samples": 10, "tokens_per_s": 20.0, "unstable": rng.random() < 0.1, "flags": []}
        if c.dims.kind != "plain":
            v = rng.uniform(0.8, 2.5)
            speed.update(speedup_side_by_side=v, speedup_ci_low=v * 0.93, speedup_ci_high=v * 1.06)
        base.with_suffix(".speed.json").write_text(json.dumps(speed))
    return results


def test_the_paper_grids_speedup_plot_reads(tmp_path):
    import matplotlib.colors as mcolors
    from PIL import Image

    from pipeline.report.figures import collect
    from pipeline.report.plots import plot_speedup_vs_gamma, speedup_vs_gamma_figure

    found = collect(synthetic_results(tmp_path))
    assert len(found.cells) == 385  # and the null cell
    fig = speedup_vs_gamma_figure(found)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    axes = [ax for ax in fig.axes if ax.get_legend() is not None]
    assert len(axes) >= 8  # 4 datasets x (single, we, cd), the empty panels without a legend
    boxes = [ax.get_window_extent(renderer) for ax in fig.axes]
    for ax in axes:
        legend = ax.get_legend().get_window_extent(renderer)
        assert not any(legend.overlaps(box) for box in boxes), ax.get_title()
        assert fig.bbox.contains(legend.x0, legend.y0) and fig.bbox.contains(legend.x1, legend.y1)
        lines = [c for c in ax.containers]  # one errorbar container per series
        styles = {(mcolors.to_hex(c[0].get_color()), c[0].get_marker()) for c in lines}
        assert len(styles) == len(lines) == len(ax.get_legend().get_texts())
        xs = [tuple(c[0].get_xdata()) for c in lines]
        assert len(set(xs)) == len(xs)  # spread apart: no two series at the same x
    assert max(len(ax.containers) for ax in axes) >= 12
    hollow = [c for ax in axes for c in ax.collections if len(c.get_facecolors()) and (c.get_facecolors() == 1).all()]
    assert hollow  # unstable cells drawn hollow (white inside)
    path = plot_speedup_vs_gamma(found, tmp_path / "speedup_vs_gamma.png")
    width, height = Image.open(path).size
    assert 1000 <= width <= 4000 and 1000 <= height <= 4000


def test_model_sets_that_share_no_model_are_loaded_apart():
    from pipeline.experiment.checks import load_checked
    from pipeline.job.likelihood import grid_distributions, model_groups

    _, cells = load_checked(REPO / "config" / "paper.yaml")
    groups = model_groups(grid_distributions(cells))
    models = [{m for d in g.values() for m in d["models"]} for g in groups]
    assert all(not (a & b) for i, a in enumerate(models) for b in models[i + 1 :])
    assert sorted(len(m) for m in models) == [2, 2, 2, 3, 3]  # qwen 3b; llama3; opt; qwen 1.5b; llama-2 (we, cd)
    _, cells = load_checked(REPO / "config" / "default.yaml")
    assert len(model_groups(grid_distributions(cells))) == 1  # every set holds the bundled model


def test_the_forecast_counts_the_likelihood_job():
    from pipeline.experiment import estimate
    from pipeline.experiment.checks import load_checked
    from pipeline.experiment.preflight import inspect_config, models_to_prepare

    config, cells = load_checked(REPO / "config" / "default.yaml")
    infos = inspect_config(config, models_to_prepare(config, cells), "float32")
    result = estimate.forecast(config, cells, infos, estimate.GPUS["cpu"], 0.59, 0.0, estimate.ACCEPTANCE)
    derived = sum(bool(c.dims.samples_from) for c in cells.values())  # judged and scored in their source's job
    assert result["jobs"]["likelihood"] == 1 and result["submissions"] == len(infos) + len(cells) - derived + 2
