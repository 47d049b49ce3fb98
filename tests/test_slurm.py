"""The workflow on a real SLURM cluster: one node on this machine (scripts/slurm-local.sh), the tiny DAG
submitted through snakemake-executor-plugin-slurm with the production profile, every job by sbatch."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml

from pipeline.report.status import ERROR_LINE
from tests.tiny_dag import ROOT, check_tables, job_counts, snakemake, tiny_config

SCRIPT = ROOT / "scripts" / "slurm-local.sh"
PROFILE = ROOT / "workflow" / "profiles" / "slurm"
# what a one-node cluster needs on top of the profile: jobs of seconds, so status checks every 2 s
# (the plugin's first check waits 40 s, and every DAG level would wait as long)
LOCAL_CLUSTER_ARGS = ["--slurm-init-seconds-before-status-checks", "2", "--seconds-between-status-checks", "2"]
CELL = "cell_generate_score_speed"  # the group job of a cell, named by its group and rules
CELL_REQUEST = ["-p gpu", "--gpus=1", "--cpus-per-task=8", "--mem 64000"]  # a cell: generation, judging, scoring


def free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def cluster_script(command: str, env: dict, user: str | None = None) -> subprocess.CompletedProcess:
    if user:  # the script on stdin: the checkout may sit under a directory only its owner can traverse
        cmd = ["runuser", "-u", user, "--", "bash", "-s", command]
        return subprocess.run(cmd, input=SCRIPT.read_text(), capture_output=True, text=True, env=env, timeout=600)
    return subprocess.run(["bash", str(SCRIPT), command], capture_output=True, text=True, env=env, timeout=600)


def cluster_env(state: Path, ports: list[int]) -> dict:
    return {
        **os.environ,
        "SPECENS_SLURM_DIR": str(state),
        "SPECENS_SLURMCTLD_PORT": str(ports[0]),
        "SPECENS_SLURMD_PORT": str(ports[1]),
        "SLURM_CONF": str(state / "slurm.conf"),
    }


def log_tails(state: Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text()[-1500:]}" for p in sorted((state / "log").glob("*.log")))


@pytest.fixture(scope="module")
def slurm_cluster():
    """A private one-node cluster (own directory, own ports), stopped and removed afterwards."""
    state = Path(tempfile.mkdtemp(prefix="specens-slurm-"))
    env = cluster_env(state, free_ports(2))
    up = cluster_script("up", env)
    try:
        if up.returncode == 3:
            pytest.skip(f"no SLURM cluster here: {up.stderr.strip()}")
        assert up.returncode == 0, up.stdout + up.stderr + log_tails(state)
        yield env
    finally:
        down = cluster_script("down", env)
        shutil.rmtree(state, ignore_errors=True)
        assert down.returncode == 0, down.stdout + down.stderr


def sbatch_calls(output: str) -> list[tuple[str, str]]:
    """(rule, or group and its rules, sbatch command line) of each submission in a verbose run's output."""
    calls = re.findall(r"sbatch call: (sbatch .*)", output)
    return [(re.search(r"--comment '?rule_([a-z_]+?)(?:_wildcards_|'|\s|$)", c).group(1), c) for c in calls]


def slurm_states(output: str, env: dict) -> Counter:
    """The final SLURM state of each job of a run, as squeue has it (finished jobs stay MinJobAge seconds)."""
    run_id = re.search(r"SLURM run ID: (\S+)", output).group(1)
    squeue = ["squeue", "--states=all", "--noheader", "--format=%T", "--name", run_id]
    return Counter(subprocess.run(squeue, capture_output=True, text=True, env=env, check=True).stdout.split())


def check_submissions(output: str, env: dict, expected: dict[str, int], failed: int = 0) -> None:
    """Each submission went through sbatch with its rule's (or group's) request, and SLURM ran it to its end."""
    calls = sbatch_calls(output)
    assert Counter(rule for rule, _ in calls) == expected
    for rule, call in calls:
        if rule == CELL:
            for part in CELL_REQUEST:
                assert part in call, (part, call)
        else:
            assert " -p cpu" in call and "--gpus" not in call, call
    assert len(re.findall(r"has been submitted with SLURM jobid \d+", output)) == len(calls)
    states = Counter({"COMPLETED": len(calls) - failed, "FAILED": failed})
    assert slurm_states(output, env) == +states  # + drops a zero count


def slurm_config(tiny_dir: Path, draft: Path) -> dict:
    """The tiny models, two cells (the target alone, and sd with an identical draft): every rule, five SLURM
    submissions over two runs. Each starts Snakemake twice (sbatch, then srun) on top of its own work: the
    whole tiny DAG would take minutes here."""
    config = tiny_config(tiny_dir, draft, wandb_mode="disabled")
    config["models"] = {"tiny": {"source": str(tiny_dir)}, "tiny-copy": {"source": str(draft)}}
    config["timing"] = {"null": False}  # SLURM's part: the null cell is one more cell (tests/test_speed.py)
    pair = {"pair": ["tiny", "tiny-copy"]}
    config["grids"] = [{"name": "pairs", "model_sets": pair, "methods": ["large_model", "sd"]}]
    config["notebook"] = False
    config["datasets"], config["max_new_tokens"] = {"humaneval": {"size": 24}}, 32  # long enough to requeue mid-way
    return config


def test_the_tiny_dag_runs_on_slurm_and_a_failed_cell_says_why_and_resumes(slurm_cluster, tiny_dir, tmp_path):
    """A cell's generation, judging and scoring as one group job; one cell fails (its draft's weights are
    damaged after its preparation) and the workflow's output and `pipeline status` say why in one line. The
    run that resumes it is preempted: the profile asks SLURM to requeue (sbatch --requeue), the cell's job is
    requeued mid-way (scontrol requeue), starts again, resumes from its journal, and finishes with every sample
    once; its speed record says which run generated how many."""
    env = slurm_cluster
    draft = tmp_path / "draft"
    shutil.copytree(tiny_dir, draft)
    (draft / "model.safetensors").write_bytes(b"not a model")
    config = slurm_config(tiny_dir, draft)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    record = tmp_path / "results" / "models" / "tiny-copy.json"  # prepared earlier, damaged since
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps({"name": "tiny-copy", "path": str(draft)}))
    args = ["--workflow-profile", str(PROFILE), *LOCAL_CLUSTER_ARGS, "--verbose"]
    args += ["--configfile", str(tmp_path / "config.yaml")]

    first = snakemake(tmp_path, *args, timeout=400, env=env)
    out = first.stdout + first.stderr
    assert first.returncode != 0, out[-3000:]
    assert "Error in group cell" in out, out[-3000:]  # the cell's SLURM job failed
    failed = "humaneval/pair/sd-T0-g2"
    log = tmp_path / "results" / "logs" / "generate" / f"{failed}.log"
    cause = [line for line in log.read_text().splitlines() if ERROR_LINE.search(line.strip())][-1].strip()
    assert f"cell {failed}: generate: {cause}" in out, out[-3000:]  # the one-line cause, in the terminal
    status = subprocess.run(
        [sys.executable, "-m", "pipeline", "status", str(tmp_path / "results")],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert f"failed  {failed}: generate: {cause}" in status.stdout, status.stdout + status.stderr
    assert status.stdout.startswith("2 cells: 1 done, 0 running, 1 failed"), status.stdout
    # a submission per cell: the one that did not fail generated, judged and scored
    check_submissions(out, env, {"prepare_model": 1, CELL: 2}, failed=1)
    done = sorted((tmp_path / "results" / "generations" / "humaneval" / "tiny").glob("*"))
    assert len(done) == 5  # .jsonl, .meta.json, .speed.json, .scores.jsonl, .summary.json
    kept = {p: p.stat().st_mtime_ns for p in done}

    shutil.rmtree(draft)
    shutil.copytree(tiny_dir, draft)
    code, out, requeued, seen = run_and_requeue(tmp_path, args, env)
    assert code == 0 and requeued is not None, out[-4000:]
    # the rerun resumes: the failed cell and what waited on it, nothing of the target's cell again
    assert job_counts(out) == {"generate": 1, "speed": 1, "score": 1, "aggregate": 1, "all": 1}
    check_submissions(out, env, {CELL: 1, "report_aggregate": 1})
    assert {p: p.stat().st_mtime_ns for p in done} == kept
    check_tables(tmp_path / "results", config)
    assert " --requeue" in next(call for rule, call in sbatch_calls(out) if rule == CELL)
    samples = tmp_path / "results" / "generations" / f"{failed}.jsonl"
    ids = [json.loads(line)["id"] for line in samples.read_text().splitlines()]
    assert len(ids) == 24 and len(set(ids)) == 24  # every sample, each once
    runs = json.loads(samples.with_name(samples.stem + ".speed.json").read_text())["runs"]
    assert [(r["slurm_job"], r["restarts"]) for r in runs] == [(requeued, 0), (requeued, 1)], runs
    assert runs[0]["samples"] >= seen >= 2 and sum(r["samples"] for r in runs) == 24  # nothing generated twice

    # up again changes nothing
    pid = (Path(env["SPECENS_SLURM_DIR"]) / "slurmctld.pid").read_text()
    again = cluster_script("up", env)
    assert again.returncode == 0 and "already up" in again.stdout
    assert (Path(env["SPECENS_SLURM_DIR"]) / "slurmctld.pid").read_text() == pid
    status = cluster_script("status", env)
    assert status.returncode == 0 and "slurmd running" in status.stdout and "node localnode: idle" in status.stdout


def test_the_cluster_script_says_in_one_line_why_it_cannot_run(tmp_path):
    """Refusals come before anything is installed or started: no cluster is needed, none is touched."""

    def refused(run: subprocess.CompletedProcess, reason: str) -> None:
        lines = run.stderr.strip().splitlines()
        assert run.returncode == 3 and len(lines) == 1 and reason in lines[0], (run.stdout, run.stderr)

    env = cluster_env(tmp_path / "cluster", free_ports(2))
    if os.geteuid() == 0:
        refused(cluster_script("up", env, user="nobody"), "needs root")
    else:
        refused(cluster_script("up", env), "needs root")
        return
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        refused(cluster_script("up", {**env, "SPECENS_SLURMCTLD_PORT": str(port)}), f"port {port} is taken")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("not the cluster's")
    refused(cluster_script("up", {**env, "SPECENS_SLURM_DIR": str(tmp_path / "mine")}), "was not made by this script")
    assert (tmp_path / "mine" / "notes.txt").exists()
    down = cluster_script("down", env)
    assert down.returncode == 0 and "not running" in down.stdout
    assert not (tmp_path / "cluster").exists()


def run_and_requeue(workdir: Path, args: list[str], env: dict, after: int = 2) -> tuple[int, str, str, int]:
    """A workflow run whose cell job is requeued by SLURM (``scontrol requeue``, as a preemption or a node failure
    does) once its journal holds ``after`` samples: the return code, the output, the job and the samples then."""
    cmd = [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "-d", str(workdir), *args]
    log = workdir / "requeued-run.log"  # a file, not a pipe: a verbose run would fill a pipe nobody reads
    run = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, text=True, env=env)
    journal_dir, requeued, seen = workdir / "results" / "journal", None, 0
    try:
        deadline = time.monotonic() + 300
        while requeued is None and run.poll() is None and time.monotonic() < deadline:
            seen = sum(p.read_bytes().count(b"\n") for p in journal_dir.rglob("*.jsonl")) if journal_dir.exists() else 0
            if seen >= after:
                squeue = ["squeue", "-h", "-t", "RUNNING", "-o", "%i %k"]
                jobs = subprocess.run(squeue, capture_output=True, text=True, env=env).stdout.splitlines()
                running = [line.split()[0] for line in jobs if f"rule_{CELL}" in line]  # none: asked again
                if running:
                    requeued = running[0]
                    subprocess.run(["scontrol", "requeue", requeued], check=True, env=env, capture_output=True)
                    release_when_pending(requeued, env)
            time.sleep(0.05)
        run.wait(timeout=400)
    finally:
        if run.poll() is None:
            run.kill()
    return run.returncode, log.read_text(), requeued, seen


def release_when_pending(job: str, env: dict) -> None:
    """SLURM holds a requeued job for about two minutes (pending, reason BeginTime) before it may start again;
    make it eligible at once, as an administrator would (``scontrol update StartTime=now``)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        shown = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True, env=env).stdout
        if "JobState=PENDING" in shown:
            subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], env=env, capture_output=True)
            return
        time.sleep(0.5)
