"""The Snakemake workflow: config checks, the grid, dry runs (local and SLURM), and the whole DAG on tiny models."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from pipeline.decoding.spec import method_names
from pipeline.experiment.cell import Cell
from pipeline.experiment.config import ConfigError, check_config
from pipeline.experiment.grid import expand_cells
from pipeline.job.generate import cell_key
from tests.conftest import cell_entry, without_null
from tests.tiny_dag import check_report, check_tables, job_counts, said, snakemake, tiny_config

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = yaml.safe_load((ROOT / "config" / "default.yaml").read_text())


# ---- config checks ------------------------------------------------------------------------


# the jobs that make one cell again: its group, its W&B run, then the experiment's tables, notebook and run
ONE_CELL_AGAIN = {
    "generate": 1,
    "speed": 1,
    "score": 1,
    "wandb_log": 1,
    "wandb_experiment": 1,
    "aggregate": 1,
    "notebook": 1,
    "all": 1,
}


def with_change(path: str, value):
    config = json.loads(json.dumps(DEFAULT))
    *parents, last = path.split(".")
    node = config
    for p in parents:
        node = node[int(p)] if p.isdigit() else node[p]
    node[last] = value
    return config


@pytest.mark.parametrize(
    "path, value, expected",
    [
        ("grids.0.methods", ["we", "speculative"], ["grids[0].methods[1]", "'speculative'", "accepted: large_model"]),
        ("datasets", {"humanevil": {"size": 2}}, ["'humanevil'", "accepted:", "humaneval"]),
        ("datasets", {"humaneval": {"size": "huge"}}, ["datasets.humaneval.size", '"huge"', "tiny, small, full"]),
        ("gamma", [0], ["gamma[0]", "0", "positive integer"]),
        ("temperature", [-1], ["temperature[0]", "-1", ">= 0"]),
        ("grids.0.model_sets", {"x": ["smollm2-135m-instruct", "nope"]}, ["'nope'", "not defined", "defined:"]),
        ("grids.0.method_args", {"lamda": 0.5}, ["method_args.lamda", "accepted:", "lambda"]),
        ("wandb", {"mode": "sometimes"}, ["wandb.mode", '"sometimes"', "auto, online, offline, disabled"]),
        ("max_new_tokens", "many", ["max_new_tokens", '"many"', "integer"]),
        ("colour", "blue", ["unknown config key 'colour'", "accepted:", "gamma"]),
        (
            "grids.0.model_sets",
            {"s" * 300: ["smollm2-135m-instruct"]},
            ["grids[0].model_sets", "at most 100 characters"],
        ),
    ],
)
def test_bad_config_values_get_one_line(path, value, expected):
    with pytest.raises(ConfigError) as err:
        check_config(with_change(path, value))
    message = str(err.value)
    assert "\n" not in message
    for part in expected:
        assert part in message, (part, message)


def test_grid_leaves_out_cells_that_do_not_apply():
    config = check_config(
        {
            "models": {"big": {}, "small": {}, "tiny": {}},
            "grids": [
                {
                    "name": "g",
                    "model_sets": {"pair": ["big", "small"], "trio": ["big", "small", "tiny"], "solo": ["big"]},
                    "methods": ["large_model", "sd", "we", "we_se", "cd", "cd_sd"],
                    "method_args": {"alpha": 0.1},
                }
            ],
            "gamma": [1, 4],
            "se_large_gamma": 1,
        }
    )
    cells = expand_cells(config)
    ids = set(without_null(cells))
    assert "humaneval/big/large_model-T0" in ids  # one large_model cell, shared by the three sets
    assert sum("large_model" in c for c in ids) == 1
    assert {c for c in ids if "/pair/" in c} == {
        f"humaneval/pair/{m}" for m in ["sd-T0-g1", "sd-T0-g4", "we-T0", "we_se-T0-g1-1", "we_se-T0-g1-4"]
    } | {f"humaneval/pair/{m}" for m in ["cd-T0", "cd_sd-T0-g1", "cd_sd-T0-g4"]}
    # a trio: no sd, no cd (pairs only), we_se with gamma [1, g, g]
    assert {c for c in ids if "/trio/" in c} == {
        "humaneval/trio/we-T0",
        "humaneval/trio/we_se-T0-g1-1-1",
        "humaneval/trio/we_se-T0-g1-4-4",
    }
    assert not any("/solo/" in c for c in ids)
    cell = cells["humaneval/pair/we_se-T0-g1-4"].cell
    assert cell.gamma == [1, 4] and cell.baseline == "we" and "alpha" not in cell.method_args
    assert cells["humaneval/pair/cd_sd-T0-g4"].cell.method_args["alpha"] == 0.1
    assert "alpha" not in cells["humaneval/pair/sd-T0-g1"].cell.method_args
    assert cells["humaneval/pair/sd-T0-g1"].cell.baseline == "large_model"
    assert "baseline" not in cells["humaneval/pair/we-T0"].cell.to_json()


def test_per_model_gamma_lists_apply_to_se_cells_only():
    base = {
        "models": {"big": {}, "small": {}},
        "grids": [{"name": "g", "model_sets": {"pair": ["big", "small"]}, "methods": ["sd", "we_sd", "we_se"]}],
    }
    cells = expand_cells(check_config({**base, "gamma": [2, [3, 1]]}))
    assert without_null(cells) == [
        "humaneval/pair/sd-T0-g2",
        "humaneval/pair/we_sd-T0-g2",
        "humaneval/pair/we_se-T0-g1-2",
        "humaneval/pair/we_se-T0-g3-1",
    ]
    with pytest.raises(ConfigError, match=r"config key gamma: \[\[1, 3\]\] has no integer for 'sd'"):
        expand_cells(check_config({**base, "gamma": [[1, 3]]}))
    se_only = {**base, "grids": [{**base["grids"][0], "methods": ["we_se"]}]}
    with pytest.raises(ConfigError, match=r"config key gamma: \[1, 2, 3\] has 3 entries .* set of 2 models"):
        expand_cells(check_config({**se_only, "gamma": [[1, 2, 3]]}))


def test_mixture_cells_take_no_gamma_run_we_beside_them_and_refuse_greedy():
    config = {
        "models": {"big": {}, "small": {}},
        "grids": [
            {
                "name": "g",
                "model_sets": {"pair": ["big", "small"]},
                "methods": ["we", "we_me"],
                "temperature": [1.0],
                "method_args": {"lambda": 0.5},
            }
        ],
        "gamma": [2, 3],
    }
    cells = expand_cells(check_config(config))
    assert without_null(cells) == ["humaneval/pair/we-T1", "humaneval/pair/we_me-T1"]
    cell, dims = cells["humaneval/pair/we_me-T1"].cell, cells["humaneval/pair/we_me-T1"].dims
    assert cell.method_args == {"lambda": 0.5} and cell.baseline == "we"
    assert dims.standard == "we" and dims.gamma is None and dims.kind == "me"
    assert Cell.from_json(cell.to_json()) == cell and cell.method == "we_me"
    # the speculative form takes gamma, and only models as proposers
    config["grids"][0]["methods"].append("we_me_sd")
    with pytest.raises(ConfigError, match=r"proposer='lookup\+draft' for 'we_me_sd': expected one of draft$"):
        expand_cells(check_config({**config, "proposer": "lookup+draft"}))
    cells = expand_cells(check_config({**config, "proposer": "draft"}))
    assert {"humaneval/pair/we_me_sd-T1-g2", "humaneval/pair/we_me_sd-T1-g3"} < set(cells)
    assert cells["humaneval/pair/we_me_sd-T1-g3"].cell.baseline == "we"
    config["grids"][0]["temperature"] = [0.0, 1.0]
    with pytest.raises(ConfigError, match=r"^grid 'g': temperature=0.0 for 'we_me': .*temperature > 0"):
        expand_cells(check_config(config))


def test_method_arguments_are_checked_against_each_model_set():
    def grid(**extra):
        return {
            "models": {"big": {}, "small": {}, "third": {}, "student": {"distill": {"layers": 1}}},
            "grids": [{"name": "g", **extra}],
        }

    with pytest.raises(ConfigError, match=r"set 'trio': method_args for 'we': 'lambda' needs exactly 2 models"):
        expand_cells(
            check_config(
                grid(model_sets={"trio": ["big", "small", "third"]}, methods=["we"], method_args={"lambda": 0.5})
            )
        )
    with pytest.raises(ConfigError, match=r"'cd_se' needs full-vocabulary logits, but model 'student'.*full_head"):
        expand_cells(check_config(grid(model_sets={"p": ["big", "student"]}, methods=["cd_se"])))
    with pytest.raises(ConfigError, match=r"first_proposer=2 for 'we_se': expected 0..1"):
        expand_cells(
            check_config(grid(model_sets={"p": ["big", "small"]}, methods=["we_se"], method_args={"first_proposer": 2}))
        )
    # top-level method_args are every grid's defaults: each grid keeps what its methods take
    config = check_config(
        {**grid(model_sets={"p": ["big", "small"]}, methods=["we"]), "method_args": {"alpha": 0.2}}
        | {
            "grids": [
                {"name": "w", "model_sets": {"p": ["big", "small"]}, "methods": ["we"]},
                {"name": "c", "model_sets": {"p": ["big", "small"]}, "methods": ["cd"]},
            ]
        }
    )
    cells = expand_cells(config)
    assert cells["humaneval/p/we-T0"].cell.method_args == {}
    assert cells["humaneval/p/cd-T0"].cell.method_args == {"alpha": 0.2}


def test_peer_cells_run_beside_their_standard_method_on_a_full_head_pair():
    cells = expand_cells(check_config(DEFAULT))
    peers = {k: v.cell.to_json() for k, v in cells.items() if v.dims.kind == "peer"}
    at_t1 = [f"humaneval/smol+l1/{m}-T1-g3" for m in ("hf_assisted_ensemble", "hf_prompt_lookup")]
    assert sorted(peers) == sorted([*at_t1, "humaneval/smol+l1/hf_prompt_lookup-T0-g8"])
    ensemble = peers["humaneval/smol+l1/hf_assisted_ensemble-T1-g3"]
    assert ensemble["baseline"] == "we" and ensemble["method_args"] == ensemble["baseline_args"] == {"lambda": 0.5}
    lookup = peers["humaneval/smol+l1/hf_prompt_lookup-T1-g3"]
    assert lookup["baseline"] == "large_model" and lookup["method_args"] == {}  # no proposer: theirs
    # ours beside them: the same models, prompts, T and gamma, with the sd grid's proposer (like for like)
    ours = cells["humaneval/smol+l1/sd-T1-g3"].cell.to_json()
    assert ours["models"] == lookup["models"] and ours["gamma"] == lookup["gamma"] == 3
    assert ours["method_args"]["proposer"] == "suffix+recycle" and ours["temperature"] == lookup["temperature"]
    # and at T = 0, with sd-greedy's proposer, at the peers' gamma
    greedy, ours = peers["humaneval/smol+l1/hf_prompt_lookup-T0-g8"], cells["humaneval/smol+l1/sd-T0-g8"].cell.to_json()
    assert ours["models"] == greedy["models"] and ours["temperature"] == greedy["temperature"] == 0.0
    assert ours["gamma"] == greedy["gamma"] == 8 and ours["method_args"]["proposer"] == "suffix+recycle"
    peers_grid = next(i for i, g in enumerate(DEFAULT["grids"]) if g["name"] == "peers")
    restricted = with_change(f"grids.{peers_grid}.model_sets", {"l2": ["smollm2-135m-instruct", "smollm2-draft-l2"]})
    with pytest.raises(ConfigError, match=r"set 'l2': 'hf_assisted_ensemble' runs transformers' generate, which"):
        expand_cells(check_config(restricted))


def test_bad_config_stops_snakemake_with_one_line(tmp_path):
    bad = with_change("grids.0.methods", ["we", "speculative"])
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad))
    run = snakemake(tmp_path, "-n", "--configfile", str(tmp_path / "bad.yaml"))
    assert run.returncode != 0
    lines = said(run)
    # one line naming the value and every method the workflow accepts (the registry as a fresh process has it:
    # ensembles registered by other tests in this process are not in it)
    (line,) = lines
    prefix = "error: config key grids[0].methods[1]: 'speculative' is not a method; accepted: "
    assert line.startswith(prefix)
    accepted = line.removeprefix(prefix).split(", ")
    assert set(accepted) <= set(method_names()) and {"large_model", "we_p", "we_me", "gac_se", "hf_assisted"} <= set(
        accepted
    )
    assert not (tmp_path / "results").exists()


# ---- dry runs ------------------------------------------------------------------------------


def test_dry_run_of_the_default_grid_lists_exactly_its_jobs(tmp_path):
    run = snakemake(tmp_path, "-n")
    assert run.returncode == 0, run.stderr[-2000:]
    n = len(expand_cells(check_config(DEFAULT)))
    # 5 + 2 + 2 + 4 + 7 + 1 + 4 + 4 + 2 cells per grid (sd and sd-greedy on HumanEval and Spec-Bench), one gamma
    # each (none for we/we_me/cd), the null cell
    assert n == 32
    assert job_counts(run.stdout + run.stderr) == {
        "all": 1,
        "cell": n,
        "grid": 1,
        "timing": 1,
        "prepare_model": 4,  # the bundled model, two drafts and a student distilled from it: nothing to fetch
        "vllm_env": 1,  # vLLM's own environment, for the vllm* cells (found in the cache once built)
        "generate": n - 5,
        "derive": 5,  # we on smol+l2 and on smol+v4k, cd, vllm at T = 1 and 0: the side-by-side runs of their cells
        "speed": n,
        "score": n,
        "likelihood": 1,  # mmlu_mc under the grid's distinct distributions
        "wandb_log": n,
        "wandb_experiment": 1,
        "aggregate": 1,
        "notebook": 1,
    }


def test_a_local_run_reads_the_default_profile(tmp_path):
    """profiles/default beside the Snakefile is the profile Snakemake reads with no --workflow-profile (a profile
    under workflow/ is not looked for when the Snakefile is at the top): its settings are the local runs' own."""
    run = snakemake(tmp_path, "-n")
    assert "Using workflow specific profile" in run.stderr and str(Path("profiles", "default")) in run.stderr
    profile = yaml.safe_load((ROOT / "profiles" / "default" / "config.yaml").read_text())
    assert profile["rerun-incomplete"] and profile["keep-going"] and profile["force-use-threads"]
    assert profile["scheduler"] == "greedy"


def test_a_parallel_cell_reserves_a_thread_per_model(tmp_path):
    config = with_change("grids.0.methods", [*DEFAULT["grids"][0]["methods"], "we_p"])
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(config))
    run = snakemake(tmp_path, "-n", "-p", "--cores", "2", "--configfile", str(tmp_path / "p.yaml"))
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-2000:]
    threads = dict(re.findall(r"pipeline\.cli generate \S*/([\w.+-]+)\.json .*?--threads (\d+)", out))
    assert threads["we_p-T1"] == "2" and threads["we_sd-T1-g3"] == "1"  # its members' forwards run at once


def test_snakemake_lint_is_clean(tmp_path):
    run = snakemake(tmp_path, "--lint")
    out = run.stdout + run.stderr
    assert run.returncode == 0 and "Lints for" not in out, out[-3000:]
    assert "Congratulations, your workflow is in a good condition!" in out


def test_snakefmt_finds_the_rules_formatted():
    """The Snakefile and the rules as snakefmt formats them (at the project's line length, pyproject.toml)."""
    snakefmt = Path(sys.executable).parent / "snakefmt"
    run = subprocess.run([snakefmt, "--check", "workflow", "Snakefile"], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, (run.stdout + run.stderr)[-2000:]


@pytest.mark.integration  # SLURM's profile over the default grid (its local dry run: make test)
def test_slurm_dry_run_lists_jobs_with_their_resources(tmp_path):
    profile = ROOT / "workflow" / "profiles" / "slurm"
    run = snakemake(tmp_path, "-n", "--workflow-profile", str(profile), "--config", "wandb={mode: disabled}")
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-2000:]
    blocks = re.findall(r"^ *rule (\w+):\n(.*?)(?=^ *rule |\Z)", out, re.S | re.M)
    resources = {}
    for rule, body in blocks:
        found = re.search(r"resources: (.*)", body)
        if found:
            resources.setdefault(rule, found.group(1))
    assert "gpu=1" in resources["generate"] and "slurm_partition=gpu" in resources["generate"]
    assert "runtime=240" in resources["generate"] and "cpus_per_task=8" in resources["generate"]
    assert "slurm_partition=gpu" in resources["score"] and "gpu=" not in resources["score"]  # in its cell's job
    assert "slurm_partition=cpu" in resources["prepare_model"] and "gpu" not in resources["prepare_model"]
    assert job_counts(out)["generate"] == len(expand_cells(check_config(DEFAULT))) - job_counts(out)["derive"]
    assert "slurm_partition=gpu" in resources["derive"] and "gpu=" not in resources["derive"]  # its source's job
    assert "wandb_log" not in job_counts(out)
    # overridable from the command line; the rule's own defaults (one GPU) stay
    run = snakemake(
        tmp_path,
        "-n",
        "--workflow-profile",
        str(profile),
        "--set-resources",
        "generate:slurm_partition=a100",
        "generate:gpu_model=a100",
    )
    generate = re.search(r"^ *rule generate:\n.*?resources: (.*?)$", run.stdout + run.stderr, re.S | re.M).group(1)
    assert "slurm_partition=a100" in generate and "gpu_model=a100" in generate and "gpu=1" in generate


def slurm_submissions(dry_run: str, profile: dict) -> dict[str, int]:
    """SLURM submissions of a dry run with the slurm profile, counted as the executor submits them: a group job
    (up to group-components jobs) once, a rule in slurm-array-jobs once per slurm-array-limit jobs (when they
    are ready together: the arrays are formed from the jobs ready at once), any other job once; local rules
    (localrule: True, and `all`, which runs nothing) never."""
    local = {"all"} | {
        m[1]
        for smk in (ROOT / "workflow" / "rules").glob("*.smk")
        for m in re.finditer(r"^rule (\w+):\n(?:    .*\n|\n)*?    localrule: True", smk.read_text(), re.M)
    }
    arrays = set(profile.get("slurm-array-jobs", "").replace(" ", "").split(",")) - {""}
    limit = profile.get("slurm-array-limit", 1000)
    counts: dict[str, int] = {}
    for block in re.split(r"^(?=\[[^\]]*\])", dry_run, flags=re.M):
        group = re.match(r"\[[^\]]*\] Group job (\w+)", block)
        rule = re.search(r"^rule (\w+):", block, re.M)
        if group:
            counts[f"group {group[1]}"] = counts.get(f"group {group[1]}", 0) + 1
        elif rule and rule[1] not in local:
            counts[rule[1]] = counts.get(rule[1], 0) + 1
    return {name: -(-n // limit) if name in arrays else n for name, n in counts.items()}


@pytest.mark.integration  # the 385-cell paper grid through SLURM's profile (the default grid's dry run: make test)
def test_the_paper_grid_on_slurm_takes_few_submissions_and_a_short_target(tmp_path):
    """The paper grid (384 cells and the null cell): 358 SLURM submissions, where each job once was one (1,550)."""
    profile_dir = ROOT / "workflow" / "profiles" / "slurm"
    profile = yaml.safe_load((profile_dir / "config.yaml").read_text())
    paper = ROOT / "config" / "paper.yaml"
    run = snakemake(tmp_path, "-n", "--workflow-profile", str(profile_dir), "--configfile", str(paper))
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-2000:]
    cells = len(expand_cells(check_config(yaml.safe_load(paper.read_text()))))
    derived = sum(
        bool(c.dims.samples_from) for c in expand_cells(check_config(yaml.safe_load(paper.read_text()))).values()
    )
    assert cells == 385 and derived == 40 and job_counts(out)["generate"] == cells - derived == 345
    assert (
        job_counts(out)["derive"] == derived
    )  # the standard cells made of the *_sd cells' side-by-side runs, in their job
    submissions = slurm_submissions(out, profile)
    assert submissions == {
        "prepare_model": 12,  # converted and checked on a compute node; downloaded by fetch_model (local)
        "group cell": cells - derived,  # a cell's generation, judging and scoring, and its derived cell's, in one job
        "group report": 1,  # aggregation and the notebook
    }, submissions
    assert sum(submissions.values()) == 358
    # the judge asks for 2 GB; a greedy cell's for the float64 recompute only once its models are known
    judged = re.findall(r"^ *rule speed:\n.*?wildcards: cell=(\S+)\n.*?resources: .*?mem_mb=([^,]+),", out, re.S | re.M)
    assert len(judged) == cells
    assert {mem for cell, mem in judged if "-T1" in cell} == {"2000"}
    assert {mem for cell, mem in judged if "-T0" in cell} <= {"2000", "<TBD>"}
    target = re.search(r"^rule all:\n    input: (.*)$", out, re.M)[1]
    assert len(target) < 300 and ".wandb.json" not in target, target


# ---- the whole DAG on tiny models ------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, tiny_dir, tiny_dir2):
    """The whole workflow on tiny models: a target, an identical draft, a third model; 2 HumanEval prompts."""
    work = tmp_path_factory.mktemp("workflow")
    config = tiny_config(tiny_dir, tiny_dir2, likelihood=True)
    (work / "config.yaml").write_text(yaml.safe_dump(config))
    run = snakemake(work, "--cores", "2", "--configfile", str(work / "config.yaml"))
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    return work, config, run


def test_the_whole_dag_writes_tables_plots_wandb_runs_and_a_notebook(tiny_run):
    work, config, run = tiny_run
    results = work / "results"
    check_tables(results, config)
    cells = expand_cells(check_config(config))
    assert len(cells) == 9  # 8 and the null cell
    speed = pd.read_csv(results / "tables" / "speedup_vs_standard.csv")
    assert set(speed["method"]) == {"sd", "we", "we_se", "cd_se", "hf_assisted", "large_model vs itself (null)"}
    null = speed[speed["method"] == "large_model vs itself (null)"].iloc[0]  # the run's control, with its interval
    assert null["model_set"] == "tiny" and null["humaneval_low"] < null["humaneval"] < null["humaneval_high"]
    beside = pd.read_csv(results / "tables" / "beside.csv")  # what ran beside the timed runs, every one counted
    generated = [c for c in cells.values() if not c.dims.samples_from]  # a derived cell's runs are its source's
    assert beside["process"].iloc[0] == "(every timed sample)" and beside["pairs"].iloc[0] == 2 * len(generated) == 14
    versus = (results / "tables" / "ours_vs_peers.md").read_text()  # ours over transformers' own, side by side
    assert "hf_assisted (γ=2)" in versus and "sd (γ=2)" in versus
    md = (results / "tables" / "speedup_vs_large.md").read_text()
    for method in ("large_model", "sd", "we_se", "cd_se"):
        assert f"| {method} " in md
    assert "trio" not in md  # no large_model cell at T=1: no ratio rather than a wrong one
    assert re.search(r"\| trio +\| we_se +\| +1 \|", (results / "tables" / "speedup_vs_standard.md").read_text())
    assert "(γ=1-2-2)" in (results / "tables" / "speedup_vs_standard.md").read_text()  # the trio's gamma list

    offline = sorted((results / "wandb").glob("offline-run-*"))
    assert len(offline) == len(cells) + 1  # and the experiment's run, with the aggregate tables
    assert json.loads((results / "wandb.json").read_text())["status"] == "ok"
    status = json.loads((results / "generations" / "humaneval/pair/we_se-T0-g1-2.wandb.json").read_text())
    assert status["status"] == "ok" and status["mode"] == "offline"

    nb = json.loads((results / "analysis.ipynb").read_text())
    outputs = [o for c in nb["cells"] if c["cell_type"] == "code" for o in c["outputs"]]
    assert outputs and not [o for o in outputs if o["output_type"] == "error"]
    assert any("identical outputs: True" in "".join(o.get("text", "")) for o in outputs)


def test_the_report_holds_the_tables_and_plots(tiny_run, tmp_path):
    import matplotlib.image

    work, _, _ = tiny_run
    _, png = check_report(work, work / "config.yaml", tmp_path)
    pixels = matplotlib.image.imread(png)[..., :3]
    assert pixels.shape[:2] == (900, 1400) and pixels.std() > 0.1  # not blank: the table and the plot drawn
    assert len({tuple(p) for p in pixels.reshape(-1, 3)[::97]}) > 50


def test_a_rerun_does_nothing_and_a_crashed_cell_resumes(tiny_run):
    work, config, _ = tiny_run
    args = ["--cores", "2", "--configfile", str(work / "config.yaml")]
    again = snakemake(work, *args)
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr

    # a crash mid-cell: nothing of the cell or downstream of it is there, its journal holds one sample
    # and a torn line
    cell_id = "humaneval/pair/we_se-T0-g1-2"
    results = work / "results"
    gen = results / "generations"
    rows = (gen / f"{cell_id}.jsonl").read_text().splitlines()
    cell = expand_cells(check_config(config))[cell_id].cell
    journal = results / "journal" / f"{cell_id}-{cell_key(cell)}.jsonl"
    journal.parent.mkdir(parents=True, exist_ok=True)
    journal.write_text(rows[0] + "\n" + rows[1][:30])
    for suffix in (".jsonl", ".speed.json", ".meta.json", ".scores.jsonl", ".summary.json", ".wandb.json"):
        (gen / f"{cell_id}{suffix}").unlink()
    for name in ("tables/summary.md", "tables/cells.csv", "analysis.ipynb"):
        (results / name).unlink()
    resumed = snakemake(work, *args)
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-3000:]
    counts = job_counts(resumed.stdout + resumed.stderr)
    again = {"derive": 1, "speed": 2, "score": 2, "wandb_log": 2}  # we-T0 is made of its side-by-side runs
    assert counts == {**ONE_CELL_AGAIN, **again}
    new_rows = (gen / f"{cell_id}.jsonl").read_text().splitlines()
    assert new_rows[0] == rows[0]  # kept as it was, timing included: not generated again
    assert json.loads(new_rows[1])["id"] == json.loads(rows[1])["id"] and not journal.exists()
    log = (results / "logs" / "generate" / f"{cell_id}.log").read_text()
    assert "1 of 2 samples already generated" in log


def test_a_changed_timing_setting_re_judges_cells_without_generating_again(tiny_run):
    work, config, _ = tiny_run
    changed = {**config, "timing": {"max_halfwidth": 0.5, "resamples": 2000}}
    (work / "changed.yaml").write_text(yaml.safe_dump(changed))
    run = snakemake(work, "-n", "--cores", "2", "--configfile", str(work / "changed.yaml"))
    assert run.returncode == 0, (run.stdout + run.stderr)[-2000:]
    counts = job_counts(run.stdout + run.stderr)
    assert "generate" not in counts and "score" not in counts
    assert counts["speed"] == len(expand_cells(check_config(config)))


def test_a_changed_cell_setting_reruns_only_the_cells_it_changes(tiny_run):
    work, config, _ = tiny_run
    changed = json.loads(json.dumps(config))
    changed["grids"][0]["method_args"]["lambda"] = 0.25  # read by we and we_se only
    (work / "changed-cell.yaml").write_text(yaml.safe_dump(changed))
    run = snakemake(work, "-n", "--cores", "2", "--configfile", str(work / "changed-cell.yaml"))
    assert run.returncode == 0, (run.stdout + run.stderr)[-2000:]
    counts = job_counts(run.stdout + run.stderr)
    assert counts["cell"] == counts["score"] == 2 and counts["generate"] == counts["derive"] == 1, counts  # we: derived
    assert "prepare_model" not in counts and "timing" not in counts
    cells = [f for f in (work / "results" / "cells").rglob("*.json")]
    assert len(cells) == len(expand_cells(check_config(config)))
    entry = json.loads((work / "results" / "cells" / "humaneval" / "pair" / "we-T0.json").read_text())
    assert entry["cell"]["method_args"] == {"lambda": 0.5} and entry["dims"]["id"] == "humaneval/pair/we-T0"


def test_rerun_unstable_measures_the_flagged_cells_again_and_nothing_else(tiny_run, tmp_path):
    from pipeline.cli import main

    work, config, _ = tiny_run
    copy = tmp_path / "work"
    shutil.copytree(work, copy, symlinks=True)  # modification times kept: Snakemake sees the same state
    flagged = "humaneval/pair/sd-T0-g2"
    for speed in (copy / "results" / "generations").rglob("*.speed.json"):  # one flagged cell, however this run went
        flags = ["interference on 2 of 2 samples"] if speed.name == "sd-T0-g2.speed.json" else []
        mtime = speed.stat().st_mtime_ns
        speed.write_text(json.dumps({**json.loads(speed.read_text()), "flags": flags}))
        os.utime(speed, ns=(mtime, mtime))  # as the judge left it: nothing downstream is out of date
    assert main(["rerun", str(copy / "results"), "--unstable"]) == 0
    run = snakemake(copy, "-n", "--cores", "2", "--configfile", str(copy / "config.yaml"))
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-2000:]
    assert job_counts(out) == ONE_CELL_AGAIN
    assert re.search(rf"wildcards: cell={re.escape(flagged)}$", out, re.M)


def test_without_side_by_side_runs_speedups_come_from_the_standard_cells(tiny_run, tmp_path):
    from pipeline.measure.speed import Policy, summarize
    from pipeline.report.aggregate import aggregate

    work, _, _ = tiny_run
    results = tmp_path / "results"
    shutil.copytree(work / "results" / "generations", results / "generations")
    shutil.copy(work / "results" / "grid.json", results / "grid.json")
    for path in (results / "generations").rglob("*.jsonl"):
        if path.name.endswith(".scores.jsonl"):
            continue
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        rows = [{k: v for k, v in r.items() if k != "baseline"} for r in rows]
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        path.with_suffix(".speed.json").write_text(json.dumps(summarize(rows, Policy()).to_json()))
    aggregate(results)
    df = pd.read_csv(results / "tables" / "cells.csv").set_index("id")
    assert df["speedup_side_by_side"].isna().all()
    we_se, we = df.loc["humaneval/pair/we_se-T0-g1-2"], df.loc["humaneval/pair/we-T0"]
    assert we_se["speedup_vs_standard"] == pytest.approx(we_se["tokens_per_s"] / we["tokens_per_s"])
    sd, large = df.loc["humaneval/pair/sd-T0-g2"], df.loc["humaneval/tiny/large_model-T0"]
    assert sd["speedup_vs_standard"] == pytest.approx(sd["tokens_per_s"] / large["tokens_per_s"])
    assert pd.isna(large["speedup_vs_standard"]) and we["speedup_vs_standard"] == 1.0
    assert (results / "plots" / "speedup_vs_gamma.png").exists()


def test_wandb_failure_never_loses_results(tiny_run, tmp_path, monkeypatch):
    import wandb

    from pipeline.report.tracking import WandbFailed, log_cell

    work, _, _ = tiny_run
    src = work / "results" / "generations" / "humaneval" / "pair"
    for f in src.glob("we-T0.*"):
        shutil.copy(f, tmp_path / f.name)

    def unreachable(*args, **kwargs):
        raise ConnectionError("api.wandb.ai unreachable\nsecond line")

    monkeypatch.setattr(wandb, "init", unreachable)
    with pytest.raises(WandbFailed):
        log_cell(tmp_path / "we-T0.jsonl", tmp_path / "status.json", cell_entry("x"), mode="online", wandb_dir=tmp_path)
    record = json.loads((tmp_path / "status.failed.json").read_text())
    assert record["status"] == "failed" and record["error"] == "ConnectionError: api.wandb.ai unreachable"
    assert not (tmp_path / "status.json").exists()
    assert (tmp_path / "we-T0.jsonl").read_text() == (src / "we-T0.jsonl").read_text()

    def timeout(*args, **kwargs):
        raise TimeoutError()

    monkeypatch.setattr(wandb, "init", timeout)
    with pytest.raises(WandbFailed, match="TimeoutError;"):
        log_cell(tmp_path / "we-T0.jsonl", tmp_path / "s2.json", cell_entry("x"), mode="offline", wandb_dir=tmp_path)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert log_cell(tmp_path / "we-T0.jsonl", tmp_path / "status.json", cell_entry("x"))["status"] == "disabled"


def test_logging_a_cell_again_resumes_its_wandb_run(tmp_path, monkeypatch):
    """W&B offline, the real client: a cell's run id comes from the experiment and the cell, so a rerun resumes
    the run rather than adding one; job_type names the step, the method stays in the config."""
    import wandb

    from pipeline.report.tracking import log_cell, log_experiment, run_id

    monkeypatch.setenv("WANDB_MODE", "offline")
    samples = tmp_path / "sd-T0-g2.jsonl"
    samples.write_text(json.dumps({"id": "a", "output": "x", "stats": {"new_tokens": 4, "wall_time_s": 0.5}}) + "\n")
    samples.with_suffix(".speed.json").write_text(json.dumps({"tokens_per_s": 8.0, "flags": []}))
    entry = cell_entry("humaneval/pair/sd-T0-g2")
    seen = []
    real_init = wandb.init
    monkeypatch.setattr(wandb, "init", lambda **kw: seen.append(kw) or real_init(**kw))

    first = log_cell(samples, tmp_path / "s1.json", entry, experiment="exp", wandb_dir=tmp_path)
    second = log_cell(samples, tmp_path / "s2.json", entry, experiment="exp", wandb_dir=tmp_path)
    assert first["run_id"] == second["run_id"] == run_id("exp", entry.dims.id)
    assert run_id("other", entry.dims.id) != first["run_id"] != run_id("exp", "humaneval/pair/sd-T0-g3")
    assert [kw["resume"] for kw in seen] == ["allow", "allow"] and {kw["job_type"] for kw in seen} == {"cell"}
    runs = sorted((tmp_path / "wandb").glob("offline-run-*"))
    # one run id in both directories (`wandb sync` resumes one run); W&B adds "-1" to a second directory made in
    # the same second as the first
    assert len(runs) == 2 and all(
        re.fullmatch(rf"offline-run-\d{{8}}_\d{{6}}-{first['run_id']}(-\d+)?", r.name) for r in runs
    )

    (tmp_path / "tables").mkdir()
    (tmp_path / "tables" / "cells.csv").write_text("id,tokens_per_s\nhumaneval/pair/sd-T0-g2,8.0\n")
    (tmp_path / "tables" / "summary.md").write_text("# Summary\n")
    experiment = log_experiment(tmp_path, tmp_path / "wandb.json", experiment="exp")
    assert experiment["status"] == "ok" and experiment["run_id"] == run_id("exp", "experiment")
    assert seen[-1]["job_type"] == "aggregate" and seen[-1]["group"] == "exp"
