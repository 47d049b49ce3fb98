"""Results are never lost or silently wrong: the generation job's samples, values checked before use, W&B retries,
file modes (the journal's own recovery: test_journal.py)."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from pipeline.experiment.cell import Cell
from pipeline.files import write_atomic
from pipeline.job.generate import run_cell
from pipeline.models import ModelSpec
from tests.conftest import cell_entry
from tests.tiny_dag import said

ROOT = Path(__file__).resolve().parent.parent


def test_the_generation_job_keeps_every_good_sample_and_writes_each_id_once(tiny_dir, tmp_path, capsys):
    cell = Cell(
        models=[ModelSpec("a", str(tiny_dir)), ModelSpec("b", str(tiny_dir))],
        method="we_sd",
        task="humaneval",
        size=5,
        max_new_tokens=3,
        baseline="we",
    )
    out, journal = tmp_path / "gen" / "cell.jsonl", tmp_path / "journal" / "cell-x.jsonl"
    run_cell(cell, out, progress=False, journal=journal)
    good = out.read_bytes().splitlines()
    ids = [json.loads(line)["id"] for line in good]
    # a crash left a journal with: two good samples, a corrupt line between them, a duplicate, a foreign
    # id, a sample of another cell (no baseline record), and a complete last line with no newline
    no_baseline = json.loads(good[3])
    del no_baseline["baseline"]
    journal.write_bytes(
        b"\n".join(
            [
                good[0],
                b"{garbage",
                good[2],
                good[0],
                b'{"id": "other/1", "output": ""}',
                json.dumps(no_baseline).encode(),
            ]
        )
        + b"\n"
        + good[4]
    )
    out.unlink()
    run_cell(cell, out, progress=False, journal=journal)
    final = out.read_bytes().splitlines()
    assert [json.loads(line)["id"] for line in final] == ids  # each id once, in the task's order
    for i in (0, 2, 4):
        assert final[i] == good[i]  # kept byte for byte, not generated again
    assert not journal.exists()
    rejected = [json.loads(line) for line in Path(f"{journal}.rejected").read_text().splitlines()]
    assert [r["line"] for r in rejected] == [2, 4, 5, 6]
    assert "no 'baseline' record" in rejected[3]["reason"]
    assert capsys.readouterr().err.count("moved to") == 4


def test_unwritable_output_or_journal_directories_get_one_line(tiny_dir, tmp_path, capsys, monkeypatch):
    from pipeline.cli import main

    cell = str(tmp_path / "cell.json")
    Path(cell).write_text(
        json.dumps(
            {
                "cell": {
                    "models": [{"name": "a", "source": str(tiny_dir)}],
                    "method": "large_model",
                    "task": "humaneval",
                    "size": 1,
                    "max_new_tokens": 2,
                }
            }
        )
    )
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    assert main(["generate", cell, str(blocker / "out.jsonl")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: cannot write to directory {blocker}: Not a directory; choose a writable location"
    assert main(["generate", cell, str(tmp_path / "ok.jsonl"), "--journal-dir", str(blocker / "j")]) == 2
    assert "cannot write to directory" in capsys.readouterr().err and not (tmp_path / "ok.jsonl").exists()

    # a directory without write permission (root ignores modes, so the refusal is simulated at the OS call)
    locked = tmp_path / "locked"
    locked.mkdir()
    real = tempfile.mkstemp

    def mkstemp(*args, dir=None, **kwargs):
        if dir is not None and Path(dir).resolve() == locked.resolve():
            raise PermissionError(13, "Permission denied")
        return real(*args, dir=dir, **kwargs)

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    assert main(["generate", cell, str(locked / "out.jsonl")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: cannot write to directory {locked}: Permission denied; choose a writable location"
    )


# ---- values checked before use -------------------------------------------------------------------

DEFAULT = (ROOT / "config" / "default.yaml").read_text()
BAD_CONFIGS = {
    "temperature NaN": (("temperature: [1.0]", "temperature: [.nan]"), "grids[0].temperature[0]: nan"),
    "temperature inf": (("temperature: [1.0]", "temperature: [.inf]"), "grids[0].temperature[0]: inf"),
    "alpha NaN": (("alpha: 0.1", "alpha: .nan"), "grids[3].method_args.alpha: nan"),
    "alpha inf": (("alpha: 0.1", "alpha: .inf"), "grids[3].method_args.alpha: inf"),
    "weights NaN": (("{lambda: 0.5}", "{weights: [.nan, 1]}"), "grids[0].method_args.weights[0]: nan"),
    "weights overflow": (("{lambda: 0.5}", "{weights: [1.0e+308, 1.0e+308]}"), "sum must be positive and finite"),
    "negative weight": (("{lambda: 0.5}", "{weights: [-1, 2]}"), "finite non-negative numbers"),
    "lambda outside": (("lambda: 0.5", "lambda: 1.5"), "lambda=1.5 is outside the accepted range [0, 1]"),
    "duplicate set name": (
        (
            "      smol+l2: [smollm2-135m-instruct, smollm2-draft-l2]",
            "      smol+l2: [smollm2-135m-instruct, smollm2-draft-l2]\n      smol+l2: [smollm2-135m-instruct]",
        ),
        "config key 'smol+l2' is given twice (line 25 of",
    ),
    "results at the root": (("results: results", 'results: "/"'), "results: '/' is a filesystem root"),
    "results a file": (("results: results", 'results: "/etc/hostname"'), "is a file, not a directory"),
    "results in /proc": (("results: results", 'results: "/proc/self"'), "is under the system's proc/"),
    "results in the project's notebooks": (
        ("results: results", f'results: "{ROOT}/notebooks/out"'),
        "is the project's own notebooks/, whose files the workflow would overwrite",
    ),
    "results the project itself": (
        ("results: results", f'results: "{ROOT}"'),
        "is the project's own directory, whose files the workflow would overwrite",
    ),
    "model name that is a path": (
        ("smollm2-draft-l2", "../../../elsewhere/x"),
        'models: "../../../elsewhere/x" is not accepted',
    ),
    "set name that is a path": (("      smol+l2:", "      ..:"), 'grids[0].model_sets: ".." is not accepted'),
    "max_new_tokens float": (("max_new_tokens: 64", "max_new_tokens: 4.0"), "max_new_tokens: 4.0 is not accepted"),
    "max_new_tokens bool": (("max_new_tokens: 64", "max_new_tokens: true"), "max_new_tokens: true is not accepted"),
    "top_p NaN": (("notebook: true", "notebook: true\ntop_p: .nan"), "top_p: nan is not accepted"),
    "size beyond the split": (("size: 10", "size: 999999"), "size=999999 for task 'humaneval': the split has only 164"),
    "missing model directory": (("{source: bundled}", "{source: /nonexistent/model}"), "/nonexistent/model not found"),
    "missing data directory": (("data_dir: null", "data_dir: /nonexistent/data"), "data_dir: directory '/nonexistent"),
    "unknown teacher": (
        ("teacher: smollm2-135m-instruct, layers: 2", "teacher: gpt-9, layers: 2"),
        "distill.teacher: 'gpt-9' is not a model of this config",
    ),
    "a head on a restricted-head draft": (
        ("layers: 2}\n", "layers: 2}\n    eagle: {steps: 10}\n"),
        "'smollm2-draft-l2' is a draft distilled with a restricted head, which a feature head cannot read",
    ),
    "a head of a million layers": (
        ("{source: bundled}", "{source: bundled, eagle: {layers: 1000000}}"),
        "feature head layers=1000000: expected 1 to 8",
    ),
    "unknown distill key": (("layers: 2}", "layers: 2, colour: red}"), "distill: unknown key 'colour'"),
    "seed beyond range": (
        ("notebook: true", "notebook: true\nseed: 1180591620717411303424"),
        "seed: 1180591620717411303424",
    ),
}


@pytest.mark.parametrize("case", list(BAD_CONFIGS))
def test_every_bad_config_value_is_one_line_naming_it(case, tmp_path, capsys):
    from pipeline.experiment.checks import main

    (old, new), words = BAD_CONFIGS[case]
    assert old in DEFAULT
    path = tmp_path / "config.yaml"
    path.write_text(DEFAULT.replace(old, new, 1))
    assert main([str(path)]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], err


@pytest.mark.parametrize(
    "case",
    [  # each a Snakemake start (12 s): make test runs one, CI all three
        pytest.param("duplicate set name", marks=pytest.mark.exhaustive),
        pytest.param("temperature NaN", marks=pytest.mark.exhaustive),
        "results at the root",
    ],
)
def test_snakemake_refuses_bad_values_before_any_job(case, tmp_path):
    (old, new), words = BAD_CONFIGS[case]
    config = tmp_path / "config.yaml"
    config.write_text(DEFAULT.replace(old, new, 1))
    cmd = [
        sys.executable,
        "-m",
        "snakemake",
        "-s",
        str(ROOT / "Snakefile"),
        "-d",
        str(tmp_path / "w"),
        "--cores",
        "1",
        "--configfile",
        str(config),
    ]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    lines = said(run)
    assert run.returncode != 0 and len(lines) == 1 and words in lines[0], lines
    assert not (tmp_path / "w" / "results").exists()


def test_a_cell_with_a_bad_value_stops_before_any_model_loads(tiny_dir, tmp_path, capsys):
    from pipeline.cli import main

    base = {"models": [{"name": "a", "source": str(tiny_dir)}], "method": "large_model", "task": "humaneval"}
    for change, words in [
        ({"max_new_tokens": 4.0}, "max_new_tokens=4.0"),
        ({"temperature": float("nan")}, "temperature=nan"),
        ({"top_p": float("nan")}, "top_p=nan"),
        ({"size": 999999}, "the split has only 164"),
        ({"seed": 2**70}, "seed=1180591620717411303424"),
    ]:
        out, cell = tmp_path / "out.jsonl", tmp_path / "cell.json"
        cell.write_text(json.dumps({"cell": {**base, **change}}))
        assert main(["generate", str(cell), str(out)]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and words in lines[0], lines
        assert not out.exists()


# ---- W&B ----------------------------------------------------------------------------------------------


@pytest.fixture()
def scored_cell(tmp_path):
    samples = tmp_path / "cell.jsonl"
    stats = {"new_tokens": 4, "wall_time_s": 0.5, "tau": None}
    samples.write_text(json.dumps({"id": "a", "output": "x", "stats": stats}) + "\n")
    samples.with_suffix(".speed.json").write_text(json.dumps({"samples": 1, "tokens_per_s": 8.0}))
    return samples


def test_an_unreachable_server_costs_seconds_keeps_an_offline_copy_and_is_retried(scored_cell, tmp_path, monkeypatch):
    from pipeline.report import tracking

    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.delenv("WANDB_MODE", raising=False)
    status, failed = tmp_path / "cell.wandb.json", tmp_path / "cell.wandb.failed.json"
    start = time.perf_counter()
    with pytest.raises(tracking.WandbFailed, match="next workflow run tries again") as err:
        tracking.log_cell(scored_cell, status, cell_entry("c"), mode="auto", wandb_dir=tmp_path, init_timeout=3)
    assert time.perf_counter() - start < 30  # W&B's own default waits 90 s
    assert "\n" not in str(err.value)
    assert not status.exists()  # not done: the workflow runs this job again
    record = json.loads(failed.read_text())
    assert record["status"] == "failed" and record["mode"] == "online"
    copy = Path(record["offline_copy"])
    assert copy.name.startswith("offline-run-") and list(copy.glob("*.wandb"))  # something to `wandb sync`
    runs = list((tmp_path / "wandb").glob("*run-*"))
    assert runs == [copy]  # the failed online attempt left no stub

    # the next run reaches the server: the online run replaces the offline copy (nothing synced twice)
    monkeypatch.setattr(tracking, "_log_run", lambda *a, **k: ("abc", tmp_path / "wandb" / "run-x-abc"))
    outcome = tracking.log_cell(scored_cell, status, cell_entry("c"), mode="online", wandb_dir=tmp_path)
    assert outcome["status"] == "ok" and json.loads(status.read_text())["run_id"] == "abc"
    assert not copy.exists() and not failed.exists()


@pytest.mark.parametrize("named", ["elsewhere", "../elsewhere", "wandb/offline-run-link"])
def test_an_offline_copy_named_outside_wandbs_own_runs_is_never_removed(scored_cell, tmp_path, monkeypatch, named):
    """The failure record's ``offline_copy`` is a path read from a results directory: only a run directory of
    W&B's own (``wandb/offline-run-*``, not a link) is removed when a later run succeeds; a path elsewhere, or a
    link named like one, leaves what it names as it was."""
    from pipeline.report import tracking

    victim = tmp_path / "elsewhere"
    (victim / "precious").mkdir(parents=True)
    work = tmp_path / "work"
    (work / "wandb").mkdir(parents=True)
    if named.endswith("link"):
        (work / named).symlink_to(victim, target_is_directory=True)
    status, failed = work / "cell.wandb.json", work / "cell.wandb.failed.json"
    named_path = victim if named == "elsewhere" else work / named  # absolute, climbing out, a link
    failed.write_text(json.dumps({"status": "failed", "offline_copy": str(named_path)}))
    monkeypatch.setattr(tracking, "_log_run", lambda *a, **k: ("abc", work / "wandb" / "run-x-abc"))
    assert tracking.log_cell(scored_cell, status, cell_entry("c"), mode="online", wandb_dir=work)["status"] == "ok"
    assert (victim / "precious").is_dir() and not failed.exists()


def test_the_wandb_command_fails_in_one_line_so_the_job_is_retried(scored_cell, tmp_path, monkeypatch, capsys):
    import wandb

    from pipeline.cli import main

    def unreachable(*args, **kwargs):
        raise ConnectionError("api.wandb.ai unreachable\nsecond line")

    monkeypatch.setattr(wandb, "init", unreachable)
    before = scored_cell.read_bytes()
    status = tmp_path / "cell.wandb.json"
    cell_file = tmp_path / "cell-file.json"
    cell_entry("c").write(cell_file)
    code = main(
        [
            "wandb-log",
            str(scored_cell),
            str(status),
            "--cell-file",
            str(cell_file),
            "--mode",
            "offline",
            "--dir",
            str(tmp_path),
        ]
    )
    assert code == 1 and not status.exists()
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [
        "error: W&B logging failed for c: ConnectionError: api.wandb.ai unreachable; results/ is unaffected; "
        "the next workflow run tries again"
    ]
    assert scored_cell.read_bytes() == before


# ---- file modes -------------------------------------------------------------------------------------


@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o027, 0o640), (0o002, 0o664)])
def test_result_files_get_the_mode_the_umask_gives(tmp_path, mask, mode):
    old = os.umask(mask)
    try:
        write_atomic(tmp_path / "x.json", "{}")
        (tmp_path / "plain.json").write_text("{}")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "x.json").stat().st_mode) == mode
    assert stat.S_IMODE((tmp_path / "plain.json").stat().st_mode) == mode


def test_datasets_only_on_the_hub_are_checked_when_the_job_runs_unless_offline(tmp_path, monkeypatch):
    from pipeline.experiment.checks import check_local
    from pipeline.experiment.config import ConfigError, check_config
    from pipeline.experiment.grid import expand_cells

    config = check_config(
        {
            "models": {"smollm2-135m-instruct": {"source": "bundled"}},
            "grids": [{"name": "g", "model_sets": {"s": ["smollm2-135m-instruct"]}, "methods": ["large_model"]}],
            "datasets": {"gsm8k": {"size": 5}},
            "data_dir": str(tmp_path),  # no gsm8k/ in it
        }
    )
    cells = expand_cells(config)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    check_local(config, cells)  # online: the job fetches it
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    with pytest.raises(ConfigError, match=r"datasets.gsm8k: no data for task 'gsm8k'.*gsm8k/test.jsonl not found"):
        check_local(config, cells)


def alias_bomb(levels: int = 9) -> str:
    """A YAML alias bomb: a few hundred bytes that expand to 9**levels values."""
    lines = ["a0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, levels)]
    return "\n".join(lines) + f"\ngrids: [{{name: g, model_sets: {{s: [m]}}, methods: [sd], gamma: *a{levels - 1}}}]\n"


@pytest.mark.parametrize(
    "text, message",
    [
        (alias_bomb(), "926,177,128 values once its aliases are expanded; a config holds at most 100,000 values"),
        ("x: " + "[" * 5000 + "]" * 5000 + "\n", "nested too deep to read; a config nests at most 64 deep"),
        ("x: " + "[" * 70 + "]" * 70 + "\n", "nested 71 deep; a config holds at most"),
        ("seed: " + "9" * 5000 + "\n", "an integer of thousands of digits"),
        ("max_new_tokens: " + "9" * 30 + "\n", "config key max_new_tokens: " + "9" * 30 + " is not accepted"),
        ("a: &a [*a]\n", "an alias refers to a value that contains it"),
    ],
    ids=["alias bomb", "5000 deep", "71 deep", "5000 digits", "30 digits", "itself"],
)
def test_a_config_too_large_deep_or_odd_to_read_is_one_line_at_once(tmp_path, text, message):
    from pipeline.experiment.config import ConfigError
    from pipeline.experiment.config_file import load_config_file

    path = tmp_path / "c.yaml"
    path.write_text(text)
    start = time.perf_counter()
    with pytest.raises(ConfigError, match=re.escape(message)) as err:
        load_config_file(path)
    assert time.perf_counter() - start < 5 and "\n" not in str(err.value)


def test_yaml_merge_keys_are_read_and_a_key_of_the_mapping_overrides_them(tmp_path):
    from pipeline.experiment.config import ConfigError
    from pipeline.experiment.config_file import load_config_file

    path = tmp_path / "c.yaml"
    path.write_text("base: &b {size: 3, chat: false}\ndatasets:\n  humaneval:\n    <<: *b\n    chat: true\n")
    assert load_config_file(path)["datasets"] == {"humaneval": {"size": 3, "chat": True}}
    path.write_text("datasets:\n  humaneval: {size: 3, size: 4}\n")
    with pytest.raises(ConfigError, match="config key 'size' is given twice"):
        load_config_file(path)
