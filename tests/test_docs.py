"""The documentation keeps its promises: README.md stays a short guide, every relative link in it and in docs/
resolves (files and GitHub's heading anchors), every shell command in their code blocks is run by a test or
marked as needing a GPU or a cluster, and docs/benchmarks.md is what its records give."""

from __future__ import annotations

import argparse
import re
import shlex
from collections import Counter
from pathlib import Path

import pytest
import yaml

from pipeline import cli
from pipeline.bench import automaton as automaton_bench
from pipeline.bench import coverage as coverage_study
from pipeline.bench import doc as benchmarks_doc
from pipeline.bench import methods as bench
from pipeline.bench import positions as positions_bench
from pipeline.bench import runners as runner_bench

from .conftest import without_null

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```([\w+-]*)\n(.*?)^```\s*$", re.S | re.M)
SHELL = {"bash", "sh", "shell", "console"}

# Every shell command of README.md and docs/*.md (continuations joined, comments and repeated spaces dropped):
# the test that runs it (tests/FILE::NAME), or why no test here can ("gpu: ...", "cluster: ...", or "suite: ..." for
# the command that runs the suite). Commands of
# `pipeline`, `python -m pipeline.bench` and `python -m pipeline.bench.runners` are also parsed with the program's
# own argument parser below; the benchmarks' runs take minutes, and the test named in PROGRAMS runs each program.
COMMANDS = {
    "make run": "tests/test_workflow.py::test_the_whole_dag_writes_tables_plots_wandb_runs_and_a_notebook",
    "make test": "suite: it runs every test here but the integration and exhaustive tiers (tests/conftest.py)",
    "bash benchmarks/gpu/run.sh trees": "gpu: benchmarks/gpu/run.sh runs on a GPU machine only",
    "bash benchmarks/gpu/run.sh trees-compiled": "gpu: benchmarks/gpu/run.sh runs on a GPU machine only",
    "make bench": "tests/test_bundled_model.py::test_benchmark_runs_prints_every_method_and_records_the_run",
    ".venv/bin/pipeline --help": "tests/test_docs.py::test_the_readmes_cheap_commands_run_as_written",
    ".venv/bin/pipeline grid config/default.yaml": (
        "tests/test_docs.py::test_the_readmes_cheap_commands_run_as_written"
    ),
    ".venv/bin/pipeline grid config/my.yaml": (
        "tests/test_docs.py::test_the_readmes_own_model_pair_passes_the_config_check"
    ),
    ".venv/bin/snakemake --cores 2 --configfile config/my.yaml": (
        "tests/test_workflow.py::test_the_whole_dag_writes_tables_plots_wandb_runs_and_a_notebook"
    ),
    ".venv/bin/snakemake -n": "tests/test_workflow.py::test_dry_run_of_the_default_grid_lists_exactly_its_jobs",
    ".venv/bin/snakemake --cores 2": (
        "tests/test_workflow.py::test_the_whole_dag_writes_tables_plots_wandb_runs_and_a_notebook"
    ),
    "echo MODEL_PATH=/data/models > .env": (
        "tests/test_models_and_distill.py::test_model_path_from_environment_and_dotenv"
    ),
    "python -m pipeline preflight config/paper.yaml --gpu a100-40gb": (
        "cluster: reads the paper's models' config.json and tokenizers from MODEL_PATH or the hub"
    ),
    "python -m pipeline estimate config/paper.yaml --gpu a100-80gb": (
        "tests/test_estimate.py::test_the_paper_grid_on_an_a100"
    ),
    "snakemake --workflow-profile workflow/profiles/slurm --configfile config/paper.yaml -n": (
        "tests/test_workflow.py::test_the_paper_grid_on_slurm_takes_few_submissions_and_a_short_target"
    ),
    "snakemake --workflow-profile workflow/profiles/slurm --configfile config/paper.yaml": (
        "cluster: the paper's 384 cells on 7B-13B models need a SLURM cluster with GPUs"
    ),
    "python -m pipeline status results/paper": (
        "tests/test_status.py::test_status_counts_cells_and_says_why_each_failed"
    ),
    "python -m pipeline rerun results/paper --unstable": (
        "tests/test_status.py::test_rerun_unstable_sets_aside_only_the_flagged_cells_files"
    ),
    "sudo scripts/slurm-local.sh up": (
        "tests/test_slurm.py::test_the_tiny_dag_runs_on_slurm_and_a_failed_cell_says_why_and_resumes"
    ),
    "export SLURM_CONF=/tmp/specens-slurm/slurm.conf": "cluster: the shell of a user of the one-node cluster",
    "sinfo": "cluster: SLURM's own command, on the one-node cluster",
    "snakemake --workflow-profile workflow/profiles/slurm -n": (
        "tests/test_workflow.py::test_slurm_dry_run_lists_jobs_with_their_resources"
    ),
    "snakemake --workflow-profile workflow/profiles/slurm --slurm-init-seconds-before-status-checks 5 "
    "--seconds-between-status-checks 5": (
        "tests/test_slurm.py::test_the_tiny_dag_runs_on_slurm_and_a_failed_cell_says_why_and_resumes"
    ),
    "squeue --states=all": "cluster: SLURM's own command, on the one-node cluster",
    "sudo scripts/slurm-local.sh status": (
        "tests/test_slurm.py::test_the_tiny_dag_runs_on_slurm_and_a_failed_cell_says_why_and_resumes"
    ),
    "sudo scripts/slurm-local.sh down": (
        "tests/test_slurm.py::test_the_tiny_dag_runs_on_slurm_and_a_failed_cell_says_why_and_resumes"
    ),
    "pipeline models": "tests/test_models_and_distill.py::test_models_command_lists_a_model",
    "pipeline models --model mine=/path/to/model_dir": (
        "tests/test_models_and_distill.py::test_models_command_lists_a_model"
    ),
    "pipeline distill --layers 2": "tests/test_models_and_distill.py::test_distillation_on_a_tiny_teacher",
    "pipeline generate cell.json results/gen/cell.jsonl": "tests/test_generate_job.py::test_generate_command",
    "pipeline speed cell.json results/gen/cell.jsonl --timing-file timing.json": (
        "tests/test_workflow.py::test_a_changed_timing_setting_re_judges_cells_without_generating_again"
    ),
    "pipeline score results/gen/humaneval.jsonl --task humaneval": "tests/test_tasks.py::test_score_command",
    "pipeline score gsm8k.jsonl --task gsm8k --data-dir ../shared/data": "tests/test_tasks.py::test_score_command",
    "SPECENS_DATA_DIR=../shared/data pipeline lm-eval --model specens --model_args "
    "method=we_se,models=smollm2-135m-instruct+smollm2-draft-l2,gamma=1+4,lambda=0.5 --tasks gsm8k_local "
    "--include_path tasks/lm_eval --limit 5": "tests/test_lm_eval.py::test_the_docs_example_runs_as_written",
}
# The benchmark programs: the test that runs each (a quick run; the documented runs are recorded measurements).
PROGRAMS = {
    "pipeline.bench": (
        bench.main,
        "tests/test_bundled_model.py::test_benchmark_runs_prints_every_method_and_records_the_run",
    ),
    "pipeline.bench.runners": (
        runner_bench.main,
        "tests/test_runner_bench.py::test_runner_bench_reports_costs_and_oracle_pairs",
    ),
    "pipeline.bench.automaton": (
        automaton_bench.main,
        "tests/test_proposers.py::test_the_automaton_benchmark_prints_its_table",
    ),
    "pipeline.bench.positions": (
        positions_bench.main,
        "tests/test_bundled_model.py::test_the_positions_study_prints_how_often_each_proposer_holds_the_token",
    ),
    "pipeline.bench.coverage": (
        coverage_study.main,
        "tests/test_speed.py::test_the_coverage_study_reruns_the_null_cell_and_counts_the_intervals_that_cover_one",
    ),
}


def without_code(text: str) -> str:
    """Markdown text with fenced blocks and inline code spans blanked (links and headings there are not)."""
    text = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    return re.sub(r"`[^`\n]*`", "``", text)


def github_anchor(heading: str) -> str:
    """GitHub's id for a heading: lower case, punctuation but hyphens and underscores dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: Counter[str] = Counter()
    found = set()
    text = FENCE.sub("", path.read_text())
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, re.M):
        anchor = github_anchor(heading)
        found.add(anchor if not seen[anchor] else f"{anchor}-{seen[anchor]}")
        seen[anchor] += 1
    return found


def relative_links(path: Path) -> list[str]:
    targets = re.findall(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", without_code(path.read_text()))
    return [t for t in targets if not re.match(r"^[a-z][a-z0-9+.-]*:", t)]  # http:, https:, mailto: ...


def broken_link(source: Path, target: str) -> str | None:
    name, _, anchor = target.partition("#")
    path = (source.parent / name).resolve() if name else source
    if not path.exists():
        return f"{source.name}: {target}: no such file"
    if anchor and path.suffix == ".md" and anchor not in anchors(path):
        return f"{source.name}: {target}: no heading with that anchor in {path.name}"
    return None


def shell_commands(path: Path) -> list[str]:
    commands = []
    for lang, body in FENCE.findall(path.read_text()):
        if lang not in SHELL:
            continue
        for line in body.replace("\\\n", " ").splitlines():
            line = re.sub(r"(^|\s)#.*$", "", line).strip()
            if line:
                commands.append(" ".join(line.split()))
    return commands


def program(command: str) -> tuple[str, list[str]] | None:
    """('pipeline' | a module, its arguments) for a command of the pipeline's own programs, else None."""
    words = shlex.split(command)
    while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):  # environment assignments
        words.pop(0)
    if words and words[0] in ("pipeline", ".venv/bin/pipeline"):
        return "pipeline", words[1:]
    if len(words) > 2 and words[0] in ("python", "python3", ".venv/bin/python") and words[1] == "-m":
        return words[2], words[3:]
    return None


def all_commands() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in DOCS:
        for command in shell_commands(path):
            found.setdefault(command, []).append(path.name)
    return found


def test_the_readme_is_a_short_guide_that_links_every_page():
    text = README.read_text()
    assert len(text.splitlines()) <= 200, "README.md is a guide of at most about 200 lines: move detail to docs/"
    assert "make run" in text and "make test" in text
    listed = re.findall(r"^- \[[^\]]+\]\((docs/[^)#]+\.md)\): \S.*$", text, re.M)
    pages = {p.relative_to(ROOT).as_posix() for p in DOCS[1:]}
    assert pages <= set(listed), (
        f"docs pages without a '- [Title](docs/x.md): one sentence' line: {pages - set(listed)}"
    )


def test_the_readme_keeps_commit_hashes_and_long_lines_out_and_its_quick_start_short():
    """The README is a guide, not a timing log: no line over 120 characters, no commit hash (the history of the
    figures lives in docs/speed.md and tests/README.md), a Quick start of a few commands with one time each."""
    text = README.read_text()
    long = [f"{i}: {len(line)}" for i, line in enumerate(text.splitlines(), 1) if len(line) > 120]
    assert not long, f"README lines over 120 characters: {long}"
    hashes = re.findall(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b", without_code(text))
    assert not hashes, f"commit hashes in the README (history goes to docs/speed.md): {hashes}"
    quick = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    assert len(quick.strip().splitlines()) <= 40
    times = re.findall(r"^\| `make [\w-]+` \| .* \| (.+) \|$", quick, re.M)
    assert len(times) == 3 and all(re.fullmatch(r"\d+ min( \d+ s)?", t) for t in times), times


def test_the_readme_check_finds_a_hash_and_a_long_line():
    assert re.findall(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b", "at 4462c0b, 2026 and decade") == [
        "4462c0b"
    ]


def test_github_anchors_follow_githubs_rule():
    assert github_anchor("Peers: transformers' own methods") == "peers-transformers-own-methods"
    assert (
        github_anchor("`gac`, `gac_p`, `gac_sd`, `gac_se` (gated ensemble)") == "gac-gac_p-gac_sd-gac_se-gated-ensemble"
    )
    assert github_anchor("τ and acceptance, by the field's names") == "τ-and-acceptance-by-the-fields-names"
    assert github_anchor("Install and run") == "install-and-run"


def test_every_relative_link_resolves():
    links = [(path, target) for path in DOCS for target in relative_links(path)]
    assert len(links) > 30  # the pages link each other: a parser that finds none is broken
    broken = [problem for path, target in links if (problem := broken_link(path, target))]
    assert not broken, "\n".join(broken)


def test_a_broken_link_or_anchor_is_found(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n## A section\n\n[ok](#a-section) [bad](#nowhere) [gone](missing.md) `[code](x.md)`\n")
    found = relative_links(page)
    assert found == ["#a-section", "#nowhere", "missing.md"]
    assert [broken_link(page, t) is None for t in found] == [True, False, False]


def test_every_shell_command_is_run_by_a_test_or_marked():
    found = all_commands()
    assert "make run" in found and "make test" in found
    unaccounted = [c for c in found if c not in COMMANDS and (program(c) or ("", []))[0] not in PROGRAMS]
    assert not unaccounted, "commands in the docs that no test runs (add them to COMMANDS):\n" + "\n".join(unaccounted)
    stale = [c for c in COMMANDS if c not in found]
    assert not stale, "COMMANDS lists commands no page has any more:\n" + "\n".join(stale)
    for command, how in [*COMMANDS.items(), *((p, t) for p, (_, t) in PROGRAMS.items())]:
        if how.startswith(("gpu: ", "cluster: ", "suite: ")):
            continue
        file, _, name = how.partition("::")
        assert re.search(rf"^def {name}\(", (ROOT / file).read_text(), re.M), f"{command}: {how} does not exist"


def test_the_pipeline_commands_parse_as_written():
    """Every `pipeline` command in the docs has subcommand and options the command line accepts."""
    seen = 0
    for command in all_commands():
        found = program(command)
        if not found or found[0] != "pipeline" or not found[1] or found[1][0] in ("--help", "lm-eval"):
            continue
        cli.PARSER.parse_args(found[1])  # argparse exits on an unknown subcommand or option
        seen += 1
    assert seen >= 8


class Parsed(Exception):
    pass


def test_the_benchmark_commands_parse_as_written(monkeypatch):
    """The recorded runs' commands take minutes; their arguments are checked by the programs' own parsers."""
    parse = argparse.ArgumentParser.parse_args

    def stop_after_parsing(self, args=None, namespace=None):
        raise Parsed(parse(self, args, namespace))

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", stop_after_parsing)
    seen = Counter()
    for command in all_commands():
        found = program(command)
        if found and found[0] in PROGRAMS:
            with pytest.raises(Parsed):
                PROGRAMS[found[0]][0](found[1])
            seen[found[0]] += 1
    assert seen["pipeline.bench"] >= 5 and seen["pipeline.bench.runners"] >= 2
    with pytest.raises(SystemExit):  # an option the program does not know is refused
        bench.main(["--no-such-option"])


def test_the_readmes_cheap_commands_run_as_written(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--help"])
    assert exit_.value.code == 0 and "preflight" in capsys.readouterr().out
    assert cli.main(["grid", str(ROOT / "config" / "default.yaml")]) == 0
    captured = capsys.readouterr()
    cells = len(captured.out.split())
    assert f"{cells} cells" in captured.err
    stated = re.search(r"the null cell \((\d+) cells\)", README.read_text())
    assert stated and int(stated[1]) == cells, "the README's count of the default grid's cells is stale"


def test_the_readmes_own_model_pair_passes_the_config_check(tmp_path, monkeypatch, capsys):
    """The README's YAML example is a valid config: its cells are listed (hub models are checked only offline)."""
    block = next(body for lang, body in FENCE.findall(README.read_text()) if lang == "yaml")
    config = yaml.safe_load(block)
    assert {"models", "grids", "datasets"} <= set(config)
    path = tmp_path / "my.yaml"
    path.write_text(block)
    for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(key, raising=False)
    assert cli.main(["grid", str(path)]) == 0
    cells = without_null(capsys.readouterr().out.split())
    assert cells == [
        "humaneval/qwen/we-T1",
        "humaneval/qwen/we_sd-T1-g2",
        "humaneval/qwen/we_sd-T1-g4",
        "humaneval/qwen/we_se-T1-g1-2",
        "humaneval/qwen/we_se-T1-g1-4",
    ]
    assert "5 cells" in README.read_text()


def test_the_benchmarks_page_is_generated_from_the_records():
    assert (ROOT / "docs" / "benchmarks.md").read_text() == benchmarks_doc.render_page(), (
        "run python -m pipeline.bench.doc"
    )
    assert benchmarks_doc.main(["--check"]) == 0
    text = benchmarks_doc.render_page()
    for record in benchmarks_doc.records():
        assert f"`benchmarks/{record.relative_to(benchmarks_doc.RECORDS).as_posix()}`" in text
    # a figure of the reference run, as the record holds it (speed-up 1.4824, interval 1.376..1.604)
    assert "| we T=1 | `we_sd g=2` | 23.2 | 1.48x [1.38, 1.60] | 62.7% | 1.97 | 2.1% | - |" in text


def test_a_record_without_a_note_is_one_line(tmp_path, monkeypatch, capsys):
    (tmp_path / "runners").mkdir()
    (tmp_path / "20990101T000000Z-abc.json").write_text("{}")
    (tmp_path / "notes.yaml").write_text("records: {}\n")
    monkeypatch.setattr(benchmarks_doc, "RECORDS", tmp_path)
    monkeypatch.setattr(benchmarks_doc, "NOTES", tmp_path / "notes.yaml")
    assert benchmarks_doc.main(["--check"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "records without a note: ['20990101T000000Z-abc.json']" in err
