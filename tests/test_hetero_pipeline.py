"""Model sets with different tokenizers in the workflow: a student with a tokenizer of its own (trained on a tiny
teacher), the config check and preflight of mixed-tokenizer sets, the default config's hetero grid, the union's
figures in speed summaries, and (where the union decoder is present) a generation job and lm-eval over such a set."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
import yaml
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from pipeline.experiment.checks import local_problems
from pipeline.experiment.config import ConfigError, check_config
from pipeline.experiment.grid import expand_cells
from pipeline.measure.speed import summarize
from pipeline.models import ModelSpec, load
from pipeline.models.student import StudentRecipe, distill_student, recipe_from, student_model, train_tokenizer

from .conftest import save_tiny, without_null

ROOT = Path(__file__).resolve().parent.parent
TINY_RECIPE = StudentRecipe(layers=1, vocab=400, prompts=4, new_tokens=8, source_files=2, steps=4, eval_prompts=2)


@pytest.fixture(scope="module")
def student(tiny_dir, tmp_path_factory):
    """A student of the tiny teacher with a 400-token tokenizer of its own, a few steps of training."""
    teacher, tok = load(tiny_dir, pack=False)
    out = distill_student(teacher, tok, tmp_path_factory.mktemp("students") / "tiny-student", TINY_RECIPE, "tiny")
    return teacher, tok, out


def test_a_student_with_its_own_tokenizer_loads_as_a_plain_model(student):
    teacher, teacher_tok, out = student
    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out)
    assert len(tok) == 400 and model.config.vocab_size == 400 and len(model.model.layers) == 1
    assert tok.eos_token == teacher_tok.eos_token and tok.eos_token_id == model.config.eos_token_id
    assert tok.chat_template == teacher_tok.chat_template  # a chat-rendered prompt means the same to both
    text = "def add(a, b):\n    return a + b  # ünïcode\n<|im_end|>"
    ids = tok(text).input_ids
    assert tok.decode(ids) == text and ids[-1] == tok.eos_token_id  # byte-level: every text round-trips
    assert tok.get_vocab() != teacher_tok.get_vocab()
    meta = json.loads((out / "draft.json").read_text())
    assert meta["teacher"] == "tiny" and meta["kind"] == "student" and meta["recipe"]["vocab"] == 400
    assert meta["steps"] == 4 and meta["vocab"] == 400 and meta["eval_positions"] > 0
    assert 0 <= meta["agreement"] <= meta["agreement_prefix"] <= 1
    loaded, _ = load(out)  # the pipeline's loader: a plain model, its whole head
    assert loaded(torch.tensor([ids])).logits.shape == (1, len(ids), 400)


def test_student_embeddings_start_as_the_teachers_mean_over_each_tokens_string(tiny_dir):
    from pipeline.models.loading import truncated_copy

    teacher, teacher_tok = load(tiny_dir, pack=False)
    tok = train_tokenizer(["def main():\n    return 0\n" * 50, "import os, sys\n" * 50], 300, teacher_tok)
    model = student_model(truncated_copy(teacher, 1), teacher, teacher_tok, tok)
    table = teacher.get_input_embeddings().weight
    for i in (tok.convert_tokens_to_ids("Ġreturn"), tok.convert_tokens_to_ids("a"), tok.eos_token_id):
        piece = tok.decode([i]) if i != tok.eos_token_id else tok.eos_token
        expected = table[teacher_tok(piece, add_special_tokens=False).input_ids].mean(0)
        assert torch.allclose(model.get_input_embeddings().weight[i], expected)
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight  # a tied head


def test_a_student_recipe_is_read_from_the_config_and_refused_in_one_line():
    recipe = recipe_from({"teacher": "x", "layers": 2, "tokenizer": {"vocab": 1024}, "steps": 10}, "s")
    assert (recipe.vocab, recipe.layers, recipe.steps) == (1024, 2, 10)
    for bad, said in (
        ({"tokenizer": {"size": 10}}, "accepted: {vocab: <number of tokens>}"),
        ({"tokenizer": {"vocab": 12}}, "expected an integer of 300 or more"),
        ({"tokenizer": {"vocab": 512}, "head_tokens": 5}, "unexpected keyword argument 'head_tokens'"),
    ):
        with pytest.raises(Exception, match="'s'") as err:
            recipe_from(bad, "s")
        assert said in str(err.value) and "\n" not in str(err.value)


# ---- the config check ----------------------------------------------------------------------------


def hetero_config(tmp_path: Path, models: dict, methods: list[str], sets: dict | None = None) -> dict:
    return {
        "results": str(tmp_path / "results"),
        "models": models,
        "grids": [
            {
                "name": "h",
                "model_sets": sets or {"pair": list(models)[:2]},
                "methods": methods,
                "temperature": [1.0],
                "gamma": [2],
                "method_args": {"lambda": 0.5},
                "proposer": "draft",
            }
        ],
        "datasets": {"humaneval": {"size": 2}},
        "wandb": {"mode": "disabled"},
    }


STUDENT = {"distill": {"teacher": "smollm2-135m-instruct", "layers": 1, "tokenizer": {"vocab": 512}}}


def test_a_set_with_a_student_of_its_own_tokenizer_passes_the_config_check(tmp_path):
    config = check_config(hetero_config(tmp_path, {"smollm2-135m-instruct": {}, "st": STUDENT}, ["we", "we_sd"]))
    cells = expand_cells(config)
    assert without_null(cells) == ["humaneval/pair/we-T1", "humaneval/pair/we_sd-T1-g2"]
    student = cells["humaneval/pair/we_sd-T1-g2"].cell.to_json()["models"][1]
    assert student["distill"]["tokenizer"] == {"vocab": 512} and "full_head" not in student
    _, problems = local_problems(config, cells)
    assert problems == []  # the student is not distilled yet: its tokenizer is checked by the job


@pytest.mark.parametrize("method", ["cd", "cd_sd", "cd_se", "hf_assisted"])
def test_one_tokenizer_methods_on_a_mixed_set_are_refused_in_one_line(tmp_path, method):
    config = check_config(hetero_config(tmp_path, {"smollm2-135m-instruct": {}, "st": STUDENT}, ["we", method]))
    with pytest.raises(ConfigError) as err:
        expand_cells(config)
    text = str(err.value)
    assert "\n" not in text and f"{method!r} needs one shared tokenizer" in text
    assert "'smollm2-135m-instruct', 'st' tokenize differently" in text


def test_a_tree_on_a_mixed_set_is_refused_in_one_line(tmp_path):
    raw = hetero_config(tmp_path, {"smollm2-135m-instruct": {}, "st": STUDENT}, ["we", "we_sd"])
    raw["grids"][0]["tree"] = [None, [2, 1]]
    with pytest.raises(ConfigError) as err:
        expand_cells(check_config(raw))
    text = str(err.value)
    assert "\n" not in text and "token trees run over one shared vocabulary" in text and "'st'" in text


def wordlevel_dir(path: Path) -> Path:
    """A tiny model whose tokenizer knows a handful of words: it cannot spell most other tokenizers' strings."""
    words = {w: i for i, w in enumerate(["<unk>", "</s>", "def", "return", "a", "b"])}
    tok = Tokenizer(WordLevel(words, "<unk>"))
    tok.pre_tokenizer = Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="</s>")
    return save_tiny(path, fast)


def test_sets_told_apart_by_their_files(tmp_path, tiny_dir, student):
    """Two directories with different tokenizers: cd is refused by the preflight; a joinable pair passes."""
    models = {"big": {"source": str(tiny_dir)}, "own": {"source": str(student[2])}}
    config = check_config(hetero_config(tmp_path, models, ["we", "cd"]))
    cells = expand_cells(config)  # the config alone does not tell: both are plain directories
    _, problems = local_problems(config, cells)
    assert len(problems) == 1 and "\n" not in problems[0]
    assert "'cd' needs one shared tokenizer but 'big' has a vocabulary of 49152 and 'own' of 400" in problems[0]
    config = check_config(hetero_config(tmp_path, models, ["we", "we_me"]))
    assert local_problems(config, expand_cells(config))[1] == []


def test_a_set_that_cannot_be_joined_is_refused_in_one_line(tmp_path, tiny_dir):
    models = {"big": {"source": str(tiny_dir)}, "words": {"source": str(wordlevel_dir(tmp_path / "words"))}}
    config = check_config(hetero_config(tmp_path, models, ["we"]))
    _, problems = local_problems(config, expand_cells(config))
    assert len(problems) == 1 and "\n" not in problems[0]
    assert problems[0].startswith("grid 'h', set 'pair': words cannot encode")


# ---- the default config's hetero grid -------------------------------------------------------------


def test_the_default_configs_hetero_grid():
    raw = yaml.safe_load((ROOT / "config" / "default.yaml").read_text())
    cells = expand_cells(check_config(copy.deepcopy(raw)))
    hetero = {k: v for k, v in cells.items() if v.dims.grid == "hetero"}
    assert sorted(hetero) == [
        "humaneval/smol+v4k/we-T1",
        "humaneval/smol+v4k/we_me_sd-T1-g2",
        "humaneval/smol+v4k/we_sd-T1-g2",
        "humaneval/smol+v4k/we_se-T1-g1-2",
    ]
    for cell_id, entry in hetero.items():
        cell = entry.cell.to_json()
        assert [m["name"] for m in cell["models"]] == ["smollm2-135m-instruct", "smollm2-student-v4k"]
        assert cell["models"][1]["distill"]["tokenizer"] == {"vocab": 4096}
        assert cell["size"] == 10 and cell["chat"] and cell["temperature"] == 1.0
        assert cell["method_args"]["lambda"] == 0.5
        assert cell.get("baseline") == (None if cell_id.endswith("/we-T1") else "we")  # timed against we


def test_union_figures_in_the_speed_summary():
    def row(union_size: int, union_map_s: float) -> dict:
        stats = {"new_tokens": 8, "wall_time_s": 1.0, "forward_time_s": 0.5, "models": [], "union_size": union_size}
        return {"stats": {**stats, "union_map_s": union_map_s}}

    mixed = summarize([row(5000, 0.01), row(5000, 0.02)])
    assert mixed.union_size == 5000 and mixed.union_map_s == pytest.approx(0.03)
    shared = summarize([row(0, 0.0)])
    assert shared.union_size is None and shared.union_map_s is None


# ---- over the union decoder -----------------------------------------------------------------------


def test_a_generation_job_over_a_mixed_set(student, tiny_dir, tmp_path):
    from pipeline.experiment.cell import Cell
    from pipeline.job.generate import run_cell

    cell = Cell(
        models=[ModelSpec("big", str(tiny_dir)), ModelSpec("own", str(student[2]))],
        method="we_sd",
        task="humaneval",
        size=2,
        gamma=2,
        max_new_tokens=6,
        temperature=1.0,
        chat=True,
        method_args={"lambda": 0.5, "proposer": "draft"},
        baseline="we",
        baseline_args={"lambda": 0.5},
    )
    summary = run_cell(cell, tmp_path / "g.jsonl", progress=False)
    rows = [json.loads(line) for line in (tmp_path / "g.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(r["stats"]["union_size"] > 400 for r in rows)
    for r in rows:  # union ids, one piece of text each: the output is their text
        assert len(r["pieces"]) == len(r["token_ids"]) == r["stats"]["new_tokens"]
        assert "".join(r["pieces"]).startswith(r["output"]) and r["baseline"]["stats"]["union_size"] > 400
    assert summary["union_size"] == rows[0]["stats"]["union_size"] and summary["union_map_s"] >= 0


def test_lm_eval_over_a_mixed_set(student, tiny_dir):
    from pipeline.errors import UserError
    from pipeline.job.lm_eval_model import SpecEnsLM

    lm = SpecEnsLM(models=f"big={tiny_dir}+own={student[2]}", method="we", **{"lambda": 0.5})
    with pytest.raises(UserError, match="different tokenizers") as err:
        lm._loglikelihood_tokens([(None, [1, 2], [3])])
    assert "\n" not in str(err.value)
    from lm_eval.api.instance import Instance

    request = Instance("generate_until", {}, ("def add(a, b):", {"until": ["\n\n"], "max_gen_toks": 5}), 0)
    assert isinstance(lm.generate_until([request])[0], str)


def test_string_agreement_of_an_oracle_student_is_prefix_consistent_everywhere(student):
    """A student that always predicts its own next token: its piece starts where the teacher's next token starts,
    so one is a prefix of the other at every shared boundary; they are equal exactly where both tokenize alike."""
    from types import SimpleNamespace

    from pipeline.models.student import string_agreement

    _, teacher_tok, out = student
    tok = AutoTokenizer.from_pretrained(out)
    prompt, cont = "def area(r):\n", '    """The area of a circle."""\n    return 3.14159 * r * r\n'
    held = [(teacher_tok(prompt).input_ids, teacher_tok(cont).input_ids)]

    def oracle(ids):
        ids = ids[0].tolist()
        nxt = torch.tensor(ids[1:] + [tok.eos_token_id])
        return SimpleNamespace(logits=torch.nn.functional.one_hot(nxt, len(tok)).float()[None])

    got = string_agreement(oracle, tok, teacher_tok, held)
    enc = tok(prompt + cont, return_offsets_mapping=True)
    student_at = {start: tok.decode([i]) for i, (start, _) in zip(enc.input_ids, enc.offset_mapping)}
    teacher_at, at = {}, len(prompt)
    for i in held[0][1]:
        teacher_at[at] = teacher_tok.decode([i])
        at += len(teacher_at[at])
    shared = [k for k in teacher_at if k in student_at and k > 0]
    assert got["eval_positions"] == len(shared) > 0 and got["agreement_prefix"] == 1.0
    assert got["agreement"] == round(sum(student_at[k] == teacher_at[k] for k in shared) / len(shared), 4) < 1


@pytest.mark.parametrize(
    "distill, said",
    [
        ({"tokenizer": {"vocab": 512}, "head_tokens": 5}, "unknown key 'head_tokens'; accepted: teacher, tokenizer"),
        ({"tokenizer": {"vocab": 100}}, "models.st.distill.tokenizer.vocab: 100 is not accepted"),
        ({"tokenizer": {"size": 512}}, "unknown config key 'size' in models.st.distill.tokenizer"),
        ({"tokenizer": {"vocab": 512}, "steps": 0}, "models.st.distill.steps: 0 is not accepted"),
    ],
)
def test_a_bad_student_recipe_is_one_config_line(tmp_path, distill, said):
    models = {"smollm2-135m-instruct": {}, "st": {"distill": {"teacher": "smollm2-135m-instruct", **distill}}}
    with pytest.raises(ConfigError) as err:
        check_config(hetero_config(tmp_path, models, ["we"]))
    assert said in str(err.value) and "\n" not in str(err.value)
