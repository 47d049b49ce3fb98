"""Model sources, clear errors, tokenizer checks and draft distillation on a tiny teacher."""

from __future__ import annotations

import json

import pytest
import torch
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from transformers import PreTrainedTokenizerFast

from pipeline import cli
from pipeline.decoding import generate
from pipeline.models import (
    BUNDLED,
    ModelError,
    ModelSpec,
    Recipe,
    bundled_dir,
    bundled_gguf,
    check_tokenizers,
    distill,
    load,
    load_set,
    resolve,
)
from pipeline.models.restricted import RestrictedHeadLM


def test_local_directory_source(tiny_dir):
    assert resolve(ModelSpec("tiny", str(tiny_dir))) == tiny_dir
    model, tok = load(tiny_dir)
    assert model.config.num_hidden_layers == 2 and len(tok) == model.config.vocab_size


def test_model_path_from_environment_and_dotenv(tiny_dir, monkeypatch, tmp_path):
    monkeypatch.setenv("MODEL_PATH", str(tiny_dir.parent))
    assert resolve(ModelSpec("tiny")) == tiny_dir
    monkeypatch.delenv("MODEL_PATH")
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".env").write_text(f"MODEL_PATH='{tiny_dir.parent}'\n")
    assert resolve(ModelSpec("tiny")) == tiny_dir


def test_bundled_and_gguf_sources():
    assert resolve(ModelSpec(BUNDLED)) == bundled_dir()
    assert resolve(ModelSpec("anything", "bundled")) == bundled_dir()
    assert resolve(ModelSpec(BUNDLED, str(bundled_gguf()))) == bundled_dir()


def test_clear_errors(tmp_path, monkeypatch):
    monkeypatch.delenv("MODEL_PATH", raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelError, match="model directory .*missing not found"):
        resolve(ModelSpec("m", str(tmp_path / "missing")))
    with pytest.raises(ModelError, match="no config.json"):
        resolve(ModelSpec("m", str(tmp_path)))
    with pytest.raises(ModelError, match="GGUF file .* not found"):
        resolve(ModelSpec("m", str(tmp_path / "x.gguf")))
    with pytest.raises(ModelError, match="MODEL_PATH is not set"):
        resolve(ModelSpec("llama-2-7b"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(ModelError, match="hub id 'meta-llama/Llama-2-7b-hf' is not in the local hub cache"):
        resolve(ModelSpec("meta-llama/Llama-2-7b-hf"))
    with pytest.raises(ModelError, match="dtype='fp8'"):
        ModelSpec("m", dtype="fp8").resolved_dtype()


def test_mismatched_tokenizers_are_refused(smol_tokenizer, tiny_dir):
    other = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel({"a": 0, "b": 1, "[UNK]": 2}, "[UNK]")))
    with pytest.raises(ModelError, match=r"'smol' \(vocabulary of 49152\) and 'other' \(vocabulary of 3\)"):
        check_tokenizers(["smol", "other"], [smol_tokenizer, other])
    models, _ = load_set([ModelSpec("tiny", str(tiny_dir)), ModelSpec(BUNDLED)])
    assert len(models) == 2


def test_models_command_lists_a_model(tiny_dir, capsys):
    assert cli.main(["models", "--model", f"tiny={tiny_dir}"]) == 0
    row = capsys.readouterr().out.strip().splitlines()[-1]
    assert row.startswith("| tiny |") and "| 49152 |" in row and "| float32 | cpu |" in row
    assert cli.main(["models", "--model", f"gone={tiny_dir}/nope"]) == 2


@pytest.fixture(scope="module")
def tiny_draft(tiny_dir, tmp_path_factory):
    teacher, tok = load(tiny_dir, pack=False)
    recipe = Recipe(
        layers=1,
        head_tokens=64,
        prompts=4,
        new_tokens=8,
        source_chunks=2,
        chunk_tokens=64,
        steps=5,
        eval_prompts=2,
        batch=4,
    )
    out = distill(teacher, tok, tmp_path_factory.mktemp("drafts") / "tiny-draft", recipe, "tiny")
    return teacher, out


def test_distillation_on_a_tiny_teacher(tiny_draft):
    teacher, out = tiny_draft
    meta = json.loads((out / "draft.json").read_text())
    assert meta["teacher"] == "tiny" and meta["steps"] == 5 and meta["recipe"]["layers"] == 1
    assert 0 <= meta["agreement"] <= meta["agreement_with_lookup"] <= 1 and meta["eval_tokens"] > 0
    assert len(json.loads((out / "head_tokens.json").read_text())) == 64
    draft, _ = load(out)
    assert isinstance(draft, RestrictedHeadLM) and len(draft.base.model.layers) == 1
    # embeddings and head are the teacher's, untouched
    assert torch.equal(draft.base.get_input_embeddings().weight, teacher.get_input_embeddings().weight)


def test_restricted_draft_is_a_lossless_proposer_but_not_a_cd_amateur(tiny_draft):
    teacher, out = tiny_draft
    draft, _ = load(out)
    prompt = [10, 20, 30, 10, 20]
    base = generate([teacher, draft], prompt, "large_model", max_new_tokens=12).token_ids
    for kind in ("draft", "lookup+draft"):
        sd = generate([teacher, draft], prompt, "sd", gamma=3, max_new_tokens=12, method_args={"proposer": kind})
        assert sd.token_ids == base
    we = generate([teacher, draft], prompt, "we", max_new_tokens=12, method_args={"lambda": 0.5}).token_ids
    se = generate([teacher, draft], prompt, "we_se", gamma=[1, 3], max_new_tokens=12, method_args={"lambda": 0.5})
    assert se.token_ids == we
    assert all(t in set(draft.kept.tolist()) for t in generate([draft], prompt, "large_model").token_ids)
    with pytest.raises(ValueError, match="'cd_se' needs full-vocabulary logits, but model 1 has a restricted"):
        generate([teacher, draft], prompt, "cd_se")
    full, _ = load(out, full_head=True)
    assert generate([teacher, full], prompt, "cd", max_new_tokens=3).token_ids


def test_packed_linear_layers_match_and_copy(tiny_dir):
    import copy

    from pipeline.models.cpu_kernels import PackedLinear, available

    if not available():
        pytest.skip("oneDNN is not available in this torch build")
    plain, _ = load(tiny_dir, pack=False)
    packed, _ = load(tiny_dir)  # float32 on the CPU: packed by default
    assert any(isinstance(m, PackedLinear) for m in packed.modules())
    ids = torch.tensor([[5, 17, 300, 2, 9]])
    with torch.no_grad():
        expected = plain(ids).logits
        assert torch.allclose(packed(ids).logits, expected, atol=1e-4)
        assert torch.allclose(copy.deepcopy(packed)(ids).logits, expected, atol=1e-4)
