"""The decoder as an lm-eval model, on the local task YAMLs, offline."""

from __future__ import annotations

import json
import math
import re
import shlex
from pathlib import Path

import pytest
import torch

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
REPO = Path(__file__).resolve().parents[1]
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason="needs the shared benchmark data")

# A multiple-choice task (log-likelihoods) on the local MMLU copy, in lm-eval's own YAML terms
MMLU_YAML = """task: mmlu_lm_eval_test
dataset_path: json
dataset_kwargs: {{data_files: {{validation: "{data}/mmlu/validation.jsonl"}}}}
test_split: validation
output_type: multiple_choice
doc_to_text: "{{{{question.strip()}}}}\\nA. {{{{choices[0]}}}}\\nB. {{{{choices[1]}}}}\\n\\
  C. {{{{choices[2]}}}}\\nD. {{{{choices[3]}}}}\\nAnswer:"
doc_to_choice: ["A", "B", "C", "D"]
doc_to_target: answer
metric_list:
  - metric: acc
metadata: {{version: 1.0}}
"""

REQUESTS = [
    ("The cat sat on", " the mat."),
    ("Question: what is 2 + 2?\nAnswer:", " 4"),
    ("", "Hello world"),  # empty context: the prefix token stands in
    ("One two three four five six", " seven eight nine ten eleven"),  # longer than max_length below: cut left
]


def _offline(monkeypatch):
    monkeypatch.setenv("SPECENS_DATA_DIR", str(DATA))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _instances(kind: str, args: list[tuple]) -> list:
    from lm_eval.api.instance import Instance

    return [Instance(kind, {}, a, i) for i, a in enumerate(args)]


def _run(argv: list[str]) -> int:
    from pipeline.cli import main

    return main(["lm-eval", *argv])


@needs_data
@pytest.mark.parametrize(
    "task,metric",
    [
        ("gsm8k_local", "exact_match,strict-match"),
        pytest.param("humaneval_local", "pass@1,none", marks=pytest.mark.exhaustive),  # make test: one task's turn
    ],
)
def test_lm_eval_generates_through_the_decoder(tiny_dir, tmp_path, monkeypatch, task, metric):
    _offline(monkeypatch)
    model_args = f"method=we_se,models=a={tiny_dir}+b={tiny_dir},gamma=1+2,lambda=0.5,max_gen_toks=8"
    out = tmp_path / "out"
    argv = ["--model", "specens", "--model_args", model_args, "--tasks", task]
    argv += ["--include_path", str(REPO / "tasks" / "lm_eval"), "--limit", "2", "--output_path", str(out)]
    assert _run(argv) == 0
    results = json.loads(next(out.rglob("results_*.json")).read_text())["results"][task]
    assert 0.0 <= results[metric] <= 1.0


def docs_example() -> list[str]:
    """docs/scoring.md's lm-eval example, as a list of words (environment assignments first)."""
    text = (REPO / "docs" / "scoring.md").read_text()
    section = text[text.index("## lm-eval") :]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    return shlex.split(block.replace("\\\n", " "))


@needs_data
@pytest.mark.integration  # the documented command end to end, lm-eval's CLI and the default config
def test_the_docs_example_runs_as_written(tiny_dir, tiny_dir2, tmp_path, monkeypatch):
    """docs/scoring.md's command, its --limit made 1: its model names resolve by the default config (a tiny
    model stands in for each once resolved, so no draft is distilled here)."""
    import importlib

    from pipeline.models import BUNDLED, locate

    resolve = importlib.import_module("pipeline.models.resolve")  # the module (the package re-exports its function)

    words = docs_example()
    env = {}
    while "=" in words[0]:
        key, _, value = words.pop(0).partition("=")
        env[key] = value
    assert words[:2] == ["pipeline", "lm-eval"]
    _offline(monkeypatch)
    for key, value in env.items():
        monkeypatch.setenv(key, str((REPO / value).resolve()) if key == "SPECENS_DATA_DIR" else value)
    assert Path(env["SPECENS_DATA_DIR"]).resolve() == (REPO / "../shared/data").resolve()
    resolved = []

    def stand_in(spec, cache=None):
        kind, _ = locate(spec)  # the name must be one the default config defines (nothing is built)
        resolved.append((spec.name, kind))
        return tiny_dir if spec.name == BUNDLED else tiny_dir2

    monkeypatch.setattr(resolve, "resolve", stand_in)
    argv = words[2:]
    argv[argv.index("--limit") + 1] = "1"
    argv[argv.index("--model_args") + 1] += ",max_gen_toks=4"
    monkeypatch.chdir(REPO)
    assert _run([*argv, "--output_path", str(tmp_path / "out")]) == 0
    assert [kind for _, kind in resolved] == ["bundled", "distill"]
    assert next((tmp_path / "out").rglob("results_*.json"))


def test_specens_is_declared_in_the_harness_plugin_group():
    import tomllib
    from importlib.metadata import EntryPoint

    from pipeline.job.lm_eval_model import SpecEnsLM

    points = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"]["lm_eval.models"]
    assert EntryPoint("specens", points["specens"], "lm_eval.models").load() is SpecEnsLM


@pytest.mark.parametrize("method,models", [("large_model", 1), ("sd", 2)])
def test_loglikelihood_equals_lm_evals_hf_model(tiny_dir, tiny_dir2, method, models):
    """The large model's log-likelihoods (and rolling ones, over several windows) as lm-eval's ``hf``."""
    from lm_eval.models.huggingface import HFLM

    from pipeline.job.lm_eval_model import SpecEnsLM

    hf = HFLM(pretrained=str(tiny_dir), device="cpu", batch_size=1, max_length=8)
    names = f"a={tiny_dir}" + (f"+b={tiny_dir2}" if models == 2 else "")
    ours = SpecEnsLM(models=names, method=method, max_length=8)
    theirs, mine = (
        hf.loglikelihood(_instances("loglikelihood", REQUESTS)),
        ours.loglikelihood(_instances("loglikelihood", REQUESTS)),
    )
    assert [g for _, g in mine] == [g for _, g in theirs]
    assert [ll for ll, _ in mine] == pytest.approx([ll for ll, _ in theirs], abs=1e-4)
    texts = [("One two three four five six seven eight nine ten eleven twelve thirteen.",)]
    rolling = _instances("loglikelihood_rolling", texts)
    assert ours.loglikelihood_rolling(rolling) == pytest.approx(hf.loglikelihood_rolling(rolling), abs=1e-4)


def _by_hand(dirs, context: str, continuation: str, combine) -> float:
    """The sum of log r(token) over the continuation, r formed from each model's own logits by ``combine``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(dirs[0])
    ctx, whole = tok.encode(context), tok.encode(context + continuation)
    cont = whole[len(ctx) :]
    logits = []
    for d in dirs:
        model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float64).eval()
        with torch.no_grad():
            logits.append(model(torch.tensor([whole])).logits[0, len(ctx) - 1 : -1])
    logr = combine(*logits)
    return float(sum(logr[i, t] for i, t in enumerate(cont)))


def _we(lam):  # r = (1 - lambda) p_1 + lambda p_2
    return lambda l1, l2: torch.log((1 - lam) * torch.softmax(l1, -1) + lam * torch.softmax(l2, -1))


def _cd(alpha, beta):  # r = softmax(l_1 - alpha l_2) over {v: p_1(v) >= beta max p_1}
    def combine(l1, l2):
        p1 = torch.softmax(l1, -1)
        scores = (l1 - alpha * l2).masked_fill(p1 < beta * p1.amax(-1, keepdim=True), float("-inf"))
        return torch.log_softmax(scores, -1)

    return combine


@pytest.mark.parametrize(
    "methods,args,combine",
    [
        (["we", "we_p", "we_sd", "we_se", "we_me", "hf_assisted_ensemble"], "lambda=0.3", _we(0.3)),
        (["cd", "cd_sd"], "alpha=0.5", _cd(0.5, 0.0)),
        (["cd"], "alpha=0.5,beta=0.6", _cd(0.5, 0.6)),  # the mask drops a third to half of the vocabulary
    ],
)
def test_ensemble_loglikelihood_by_hand(tiny_dir, tiny_dir2, methods, args, combine):
    from lm_eval.utils import simple_parse_args_string

    from pipeline.job.lm_eval_model import SpecEnsLM

    pairs = REQUESTS[:2]
    expected = [_by_hand([tiny_dir, tiny_dir2], c, x, combine) for c, x in pairs]
    assert all(math.isfinite(e) for e in expected)
    for method in methods:
        lm = SpecEnsLM(models=f"a={tiny_dir}+b={tiny_dir2}", method=method, **simple_parse_args_string(args))
        got = [ll for ll, _ in lm.loglikelihood(_instances("loglikelihood", pairs))]
        assert got == pytest.approx(expected, abs=1e-4), method


@needs_data
def test_a_multiple_choice_task_scores_as_lm_evals_hf_model(tiny_dir, tmp_path, monkeypatch):
    """End to end through ``pipeline lm-eval``, lm-eval's own ``hf`` model beside ``specens`` (the registry keeps
    both): MMLU's per-choice log-likelihoods agree."""
    _offline(monkeypatch)
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "mmlu_lm_eval_test.yaml").write_text(MMLU_YAML.format(data=DATA))
    scores = {}
    for model, args in [("hf", f"pretrained={tiny_dir}"), ("specens", f"models=a={tiny_dir}")]:
        out = tmp_path / model
        argv = ["--model", model, "--model_args", args, "--tasks", "mmlu_lm_eval_test", "--include_path", str(tasks)]
        assert _run([*argv, "--limit", "2", "--log_samples", "--output_path", str(out)]) == 0
        rows = [json.loads(line) for line in next(out.rglob("samples_*.jsonl")).read_text().splitlines()]
        scores[model] = [float(r[0]) for row in sorted(rows, key=lambda r: r["doc_id"]) for r in row["filtered_resps"]]
    assert len(scores["hf"]) == 8
    assert scores["specens"] == pytest.approx(scores["hf"], abs=1e-4)


def test_a_continuation_longer_than_the_window_is_one_clear_error(tiny_dir):
    from pipeline.errors import UserError
    from pipeline.job.lm_eval_model import SpecEnsLM

    lm = SpecEnsLM(models=f"a={tiny_dir}", max_length=3)
    with pytest.raises(UserError, match="continuation of 5 tokens: expected 1 to max_length=3"):
        lm._loglikelihood_tokens([(None, [1, 2], [3, 4, 5, 6, 7])])


BAD_MODEL_ARGS = [
    ("models=", "model_args models='': expected model names"),
    ("", "model_args models='': expected model names"),
    ("models=x,gamma=abc", "model_args gamma='abc': expected an integer >= 1, or one per model joined with +"),
    ("models=x,gamma=1+0", "model_args gamma='1+0'"),
    ("models=x,max_gen_toks=0", "model_args max_gen_toks="),
]


def test_bad_model_args_are_refused_in_one_line_before_any_model_loads(capsys):
    from pipeline.errors import UserError
    from pipeline.job.lm_eval_model import SpecEnsLM

    for model_args, message in BAD_MODEL_ARGS:
        args = dict(kv.split("=", 1) for kv in model_args.split(",") if kv)
        with pytest.raises(UserError, match=re.escape(message)):
            SpecEnsLM(**args)
    argv = ["--model", "specens", "--tasks", "gsm8k_local", "--include_path", str(REPO / "tasks" / "lm_eval")]
    assert _run([*argv, "--model_args", "models=x,gamma=abc"]) == 2  # through the command: one line
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and BAD_MODEL_ARGS[2][1] in errors[0] and "Traceback" not in err, err[-500:]
