"""The preflight: every problem of a config's models and model sets, at once, from config.json and tokenizer files.

Model directories hold the public config.json of real models (their published values) and a tiny tokenizer
built here: no weights anywhere, so nothing could be loaded even by mistake.
"""

from __future__ import annotations

import json
import time
from argparse import Namespace
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.experiment import preflight
from pipeline.experiment.config import check_config
from pipeline.experiment.grid import expand_cells
from pipeline.models import files as model_files

LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_act": "silu", "rms_norm_eps": 1e-5}
QWEN2 = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_act": "silu", "rms_norm_eps": 1e-6}
QWEN2 |= {"rope_theta": 1000000.0, "tie_word_embeddings": True, "vocab_size": 151936, "max_position_embeddings": 32768}
PUBLIC_CONFIGS = {  # config.json of the hub repositories (shape keys)
    "meta-llama/Llama-2-7b-hf": LLAMA
    | {
        "hidden_size": 4096,
        "intermediate_size": 11008,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "vocab_size": 32000,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": False,
    },
    "JackFram/llama-68m": LLAMA
    | {
        "hidden_size": 768,
        "intermediate_size": 3072,
        "num_hidden_layers": 2,
        "num_attention_heads": 12,
        "vocab_size": 32000,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": False,
    },
    "Qwen/Qwen2.5-0.5B": QWEN2
    | {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14}
    | {"num_key_value_heads": 2},
    "Qwen/Qwen2.5-1.5B": QWEN2
    | {"hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28, "num_attention_heads": 12}
    | {"num_key_value_heads": 2},
    "Qwen/Qwen2.5-3B": QWEN2
    | {"hidden_size": 2048, "intermediate_size": 11008, "num_hidden_layers": 36, "num_attention_heads": 16}
    | {"num_key_value_heads": 2},
    "facebook/opt-125m": {
        "model_type": "opt",
        "architectures": ["OPTForCausalLM"],
        "hidden_size": 768,
        "ffn_dim": 3072,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "vocab_size": 50272,
        "max_position_embeddings": 2048,
        "word_embed_proj_dim": 768,
        "do_layer_norm_before": True,
    },
}
PUBLIC_PARAMETERS = {  # as the model cards and safetensors indexes give them
    "meta-llama/Llama-2-7b-hf": 6_738_415_616,
    "JackFram/llama-68m": 68_030_208,
    "Qwen/Qwen2.5-0.5B": 494_032_768,
    "Qwen/Qwen2.5-1.5B": 1_543_714_304,
    "Qwen/Qwen2.5-3B": 3_085_938_688,
    "facebook/opt-125m": 125_239_296,
}
CHAT = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


def tiny_tokenizer(path: Path, words: list[str], chat: bool = False) -> None:
    """A word-level tokenizer of ``words`` (tokenizer.json), with a chat template or none."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(["<unk>", *words])}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHAT} if chat else {}))


def model_dir(root: Path, name: str, repo: str, words: list[str] | None, chat: bool = False) -> Path:
    """``root/name`` holding the public config.json of ``repo`` and a tiny tokenizer (None: no tokenizer)."""
    path = root / name
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(PUBLIC_CONFIGS[repo]))
    if words is not None:
        tiny_tokenizer(path, words, chat)
    return path


LLAMA_WORDS, QWEN_WORDS = ["a", "b", "c"], ["x", "y", "z", "w"]


@pytest.fixture
def model_path(tmp_path, monkeypatch):
    """MODEL_PATH with Llama-2-7B (a chat template), Llama-68M, three Qwen2.5 sizes (one without a
    tokenizer, one with another tokenizer) and OPT-125M; the hub offline."""
    root = tmp_path / "models"
    model_dir(root, "llama-2-7b", "meta-llama/Llama-2-7b-hf", LLAMA_WORDS, chat=True)
    model_dir(root, "llama-68m", "JackFram/llama-68m", LLAMA_WORDS)
    model_dir(root, "Qwen2.5-0.5B", "Qwen/Qwen2.5-0.5B", QWEN_WORDS, chat=True)  # found by its repo's name
    model_dir(root, "qwen2.5-1.5b", "Qwen/Qwen2.5-1.5B", None)  # config.json only
    model_dir(root, "qwen2.5-3b", "Qwen/Qwen2.5-3B", ["x", "y", "q"], chat=True)  # same size, another tokenizer
    model_dir(root, "opt-125m", "facebook/opt-125m", ["o"])
    (model_dir(root, "opt-torn", "facebook/opt-125m", None) / "tokenizer.json").write_text('{"model": ')
    monkeypatch.setenv("MODEL_PATH", str(root))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty hub cache
    return root


ONE_TOKENIZER = ("llama+qwen", "qwen+qwen3b")  # members of different tokenizers: run with a method that needs one


def config_of(model_sets: dict[str, list[str]], models: dict, chat: bool = False) -> dict:
    """A grid of the sets; those of ``ONE_TOKENIZER`` under contrastive decoding (other ensembles run over the union
    of their vocabularies)."""
    grids = [
        {"name": name, "model_sets": sets, "methods": methods}
        for name, sets, methods in (
            ("g", {k: v for k, v in model_sets.items() if k not in ONE_TOKENIZER}, ["large_model", "we", "we_sd"]),
            ("c", {k: v for k, v in model_sets.items() if k in ONE_TOKENIZER}, ["large_model", "cd"]),
        )
        if sets
    ]
    return check_config({"models": models, "grids": grids, "datasets": {"humaneval": {"size": 5, "chat": chat}}})


BAD = {
    "llama-2-7b": {"source": "meta-llama/Llama-2-7b-hf", "dtype": "float32"},  # 27 GB
    "qwen2.5-0.5b": {"source": "Qwen/Qwen2.5-0.5B"},
    "qwen2.5-1.5b": {"source": "Qwen/Qwen2.5-1.5B"},
    "qwen2.5-3b": {"source": "Qwen/Qwen2.5-3B"},
    "llama-13b": {"source": "meta-llama/Llama-2-13b-hf"},  # nowhere
    "mistral-7b": {"source": "mistralai/Mistral-7B-v0.1"},  # nowhere
    "opt-125m": {"source": "facebook/opt-125m"},
    "opt-draft": {"distill": {"teacher": "opt-125m", "layers": 1}},
    "opt-torn": {},  # a tokenizer.json cut short
}
BAD_SETS = {
    "llama+qwen": ["llama-2-7b", "qwen2.5-0.5b"],  # vocabularies of 32000 and 151936
    "qwen+qwen3b": ["qwen2.5-0.5b", "qwen2.5-3b"],  # one size, two tokenizers
    "qwen+1.5b": ["qwen2.5-0.5b", "qwen2.5-1.5b"],  # no tokenizer
    "13b+mistral": ["llama-13b", "mistral-7b"],  # two models missing
    "opt+draft": ["opt-125m", "opt-draft"],  # a draft to be distilled: fine
    "opt+torn": ["opt-125m", "opt-torn"],
}


def test_every_problem_is_found_at_once_before_any_job(model_path, tmp_path, capsys):
    from pipeline.experiment.checks import main as check_main

    config = config_of(BAD_SETS, BAD, chat=True)
    infos, problems = preflight.run(config, expand_cells(config), gpu="a10g")
    expected = {
        "vocabulary of 32000 and 'qwen2.5-0.5b' of 151936": "llama+qwen",
        "'qwen2.5-0.5b' and 'qwen2.5-3b' have different tokenizers (vocabularies of 5 and 4 tokens)": "qwen+qwen3b",
        f"{model_path / 'qwen2.5-1.5b'} has no tokenizer": "qwen2.5-1.5b",
        "models.llama-13b: hub id 'meta-llama/Llama-2-13b-hf' is not in the local hub cache": "looked in",
        "models.mistral-7b: hub id 'mistralai/Mistral-7B-v0.1'": f"{model_path / 'Mistral-7B-v0.1'}",
        "chat is true but model 'opt-125m' has no chat template": "humaneval",
        f"models.opt-torn: its tokenizer in {model_path / 'opt-torn'} cannot be read: Exception: ": "EOF",
        "chat is true but model 'opt-draft' has no chat template": "humaneval",  # its teacher's tokenizer
        "set 'llama+qwen' needs": "llama-2-7b 29.2 GB in float32",  # 26.95 GB, KV: 2 x 32 x 4096 x 2176 x 4 B
        "set 'llama-2-7b' needs 30.7 GB": "one a10g (24 GB)",  # its large_model cells, +1.5 GB of CUDA context
    }
    for words, also in expected.items():
        found = [p for p in problems if words in p and also in p]
        assert len(found) == 1, (words, "\n".join(problems))
    assert len(problems) == len(expected), "\n".join(problems)
    assert all("\n" not in p for p in problems)
    assert infos["opt-draft"].where == "will be distilled from opt-125m" and not infos["opt-draft"].problems
    assert infos["opt-draft"].parameters < infos["opt-125m"].parameters  # one layer of twelve
    assert infos["qwen2.5-0.5b"].where == "MODEL_PATH/Qwen2.5-0.5B"
    assert infos["llama-2-7b"].parameters == PUBLIC_PARAMETERS["meta-llama/Llama-2-7b-hf"]
    assert infos["opt-125m"].parameters == PUBLIC_PARAMETERS["facebook/opt-125m"]

    path = tmp_path / "config.yaml"  # the config check Snakemake runs: all of them too, without the GPU's memory
    path.write_text(yaml.safe_dump({k: config[k] for k in ("models", "grids", "datasets")}))
    assert check_main([str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {len(expected) - 2} problems before any job:\n"), err
    assert all(any(words in line for line in err.splitlines()) for words in list(expected)[:-2]), err


def test_a_good_set_passes_and_the_command_prints_where_each_model_resolves(model_path, tmp_path, capsys):
    from pipeline.cli import main

    path = tmp_path / "config.yaml"
    models = {"llama-2-7b": {"source": "meta-llama/Llama-2-7b-hf"}, "llama-68m": {"source": "JackFram/llama-68m"}}
    config = config_of({"pair": ["llama-2-7b", "llama-68m"]}, models)
    path.write_text(yaml.safe_dump({k: config[k] for k in ("models", "grids", "datasets")}))
    assert main(["preflight", str(path), "--gpu", "a100-40gb"]) == 0
    out, err = capsys.readouterr()
    assert "| llama-68m | MODEL_PATH/llama-68m | 0.07B | 32000 | 4 tokens | no | 0.1 GB bfloat16 |" in out, out
    assert "| llama-2-7b | MODEL_PATH/llama-2-7b | 6.74B | 32000 | 4 tokens | yes | 13.5 GB bfloat16 |" in out, out
    assert "2 models, 2 model sets" in out and "no problems found" in err  # the large model alone is a set


def test_restricted_draft_directories_are_refused_where_a_method_needs_the_full_head(model_path, tmp_path):
    draft = model_dir(model_path, "draft-68m", "JackFram/llama-68m", LLAMA_WORDS)
    (draft / "head_tokens.json").write_text(json.dumps([0, 1, 2]))
    models = {"llama-2-7b": {"source": "meta-llama/Llama-2-7b-hf"}, "draft-68m": {"source": str(draft)}}
    config = check_config(
        {
            "models": models,
            "grids": [{"name": "cd", "model_sets": {"p": ["llama-2-7b", "draft-68m"]}, "methods": ["cd"]}],
            "datasets": {"humaneval": {"size": 5}},
        }
    )
    _, problems = preflight.run(config, expand_cells(config))
    assert len(problems) == 1 and "restricted output head" in problems[0] and "full_head: true" in problems[0]
    config["models"]["draft-68m"]["full_head"] = True
    assert preflight.run(config, expand_cells(config))[1] == []


def test_heads_padded_to_other_sizes_over_one_tokenizer_are_one_vocabulary(model_path):
    """Qwen2.5-7B's head (152,064 rows) beside Qwen2.5-0.5B's (151,936) over one tokenizer: every method of ours
    runs (the padding is cropped: tests/test_padded_heads.py), transformers' assisted generation is refused."""
    seven = model_dir(model_path, "qwen2.5-7b", "Qwen/Qwen2.5-0.5B", QWEN_WORDS)
    shape = {"hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28}
    config_json = PUBLIC_CONFIGS["Qwen/Qwen2.5-0.5B"] | shape | {"num_key_value_heads": 4, "vocab_size": 152064}
    (seven / "config.json").write_text(json.dumps(config_json | {"tie_word_embeddings": False}))
    models = {"qwen2.5-7b": {"source": str(seven)}, "qwen2.5-0.5b": {"source": "Qwen/Qwen2.5-0.5B"}}
    methods = ["large_model", "sd", "we", "we_sd", "cd", "cd_sd", "hf_assisted"]
    grid = {"name": "qwen", "model_sets": {"pair": list(models)}, "methods": methods}
    config = check_config({"models": models, "grids": [grid], "datasets": {"humaneval": {"size": 5}}})
    infos, problems = preflight.run(config, expand_cells(config))
    assert infos["qwen2.5-7b"].vocab_size == 152064 and infos["qwen2.5-0.5b"].vocab_size == 151936
    assert problems == [
        "grid 'qwen', set 'pair': 'hf_assisted' runs transformers' assisted generation, which needs heads of one "
        "size (these have 152064, 151936 rows); our own methods crop the padding and run this set"
    ]
    other = model_dir(model_path, "qwen2.5-7b-other", "Qwen/Qwen2.5-0.5B", ["x", "y", "v"])  # another tokenizer:
    (other / "config.json").write_text((seven / "config.json").read_text())  # contrastive decoding needs one
    config["models"]["qwen2.5-7b"]["source"] = str(other)
    problems = preflight.run(config, expand_cells(config))[1]
    assert any("'cd' needs one shared tokenizer" in p for p in problems), problems


def test_profile_gpu_model_sets_the_memory_checked(model_path, tmp_path, capsys):
    from pipeline import cli
    from pipeline.cli.setup import cmd_preflight

    path = tmp_path / "config.yaml"
    config = config_of({"pair": ["llama-2-7b", "llama-68m"]}, {k: {} for k in ("llama-2-7b", "llama-68m")})
    path.write_text(yaml.safe_dump({k: config[k] for k in ("models", "grids", "datasets")}))
    profile = tmp_path / "profile.yaml"
    profile.write_text(yaml.safe_dump({"set-resources": {"generate": {"gpu": 1, "gpu_model": "rtx_4090"}}}))
    args = Namespace(config=path, gpu=None, profile=profile)
    assert cmd_preflight(args) == 0
    assert "GPU memory against one rtx4090" in capsys.readouterr().out
    profile.write_text(yaml.safe_dump({"set-resources": {"generate": {"gpu_model": "h100", "mem_mb": 12000}}}))
    assert cmd_preflight(args) == 1  # 13.5 GB of Llama-2-7B's weights pass through 12 GB of host memory
    assert "error: set 'pair': llama-2-7b loads 13.5 GB of weights (bfloat16) through host memory but a " in (
        capsys.readouterr().err
    )
    assert cli.main(["preflight", str(path), "--gpu", "tpu"]) == 2
    assert capsys.readouterr().err.startswith("error: GPU 'tpu' is not in the table; accepted: a100-40gb, ")
    for resources, says in (  # a profile's values that name no GPU, or are no mapping: one line, not ignored
        ({"set-resources": {"generate": {"gpu_model": 5}}}, "gpu_model=5 is not a GPU name"),
        ({"set-resources": ["generate"]}, 'set-resources is ["generate"], expected a mapping'),
        ({"set-resources": {"generate": ["gpu_model"]}}, "set-resources.generate is not a mapping"),
    ):
        profile.write_text(yaml.safe_dump(resources))
        assert cli.main(["preflight", str(path), "--profile", str(profile)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"error: profile {profile}: ") and says in err and "\n" not in err, err


@pytest.mark.parametrize("repo", list(PUBLIC_PARAMETERS))
def test_parameters_are_counted_from_config_json_shapes_alone(repo):
    assert model_files.count_parameters(PUBLIC_CONFIGS[repo])[0] == PUBLIC_PARAMETERS[repo]


def test_an_architecture_transformers_does_not_know_is_one_line():
    from pipeline.models import ModelError

    with pytest.raises(ModelError, match=r"^config.json of model_type 'gpt-9': ValueError: .*gpt-9"):
        model_files.count_parameters({"model_type": "gpt-9", "hidden_size": 8})


def test_snakemake_stops_before_any_job_with_every_problem(model_path, tmp_path):
    from tests.tiny_dag import said, snakemake

    sets = {k: BAD_SETS[k] for k in ("llama+qwen", "qwen+1.5b")}
    config = config_of(sets, {m: BAD[m] for ms in sets.values() for m in ms} | {"llama-2-7b": {}})
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({k: config[k] for k in ("models", "grids", "datasets")} | {"results": "out"}))
    run = snakemake(tmp_path, "-n", "--configfile", str(path))
    lines = said(run)
    assert run.returncode != 0 and lines[0] == "error: 2 problems before any job:", lines
    assert "has no tokenizer" in lines[1] and "vocabulary of 32000 and 'qwen2.5-0.5b' of 151936" in lines[2]
    assert len(lines) == 3 and not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "change, said",
    [
        ({"vocab_size": "49152"}, 'vocab_size="49152" is not accepted'),
        ({"hidden_size": True}, "hidden_size=true is not accepted"),
        ({"num_attention_heads": 0}, "num_attention_heads=0 is not accepted"),
        ({"num_hidden_layers": 1_000_000}, "num_hidden_layers=1000000 is not accepted"),
        ({"num_hidden_layers": -2}, "num_hidden_layers=-2 is not accepted"),
        ({"intermediate_size": 16.5}, "intermediate_size=16.5 is not accepted"),
        ({"vocab_size": None}, "'vocab_size' is a required property"),
        ({"model_type": None}, "'model_type' is a required property"),
    ],
)
def test_a_config_json_that_cannot_describe_a_model_is_one_line_and_builds_nothing(tmp_path, change, said):
    config = {**PUBLIC_CONFIGS["meta-llama/Llama-2-7b-hf"], **change}
    config = {k: v for k, v in config.items() if v is not None}
    (tmp_path / "config.json").write_text(json.dumps(config))
    start = time.perf_counter()
    info = model_files.read_dir(model_files.ModelInfo("m", ""), tmp_path)
    assert info.config is None and info.parameters is None and time.perf_counter() - start < 5
    assert any(said in p for p in info.problems), info.problems
    assert all("\n" not in p and f"{tmp_path}/config.json" in p for p in info.problems)


@pytest.mark.parametrize("text", [b"\xff\xfe\x00", b"[1, 2]", b"null", b'"a"'])
def test_a_config_json_that_is_not_an_object_is_one_line(tmp_path, text):
    (tmp_path / "config.json").write_bytes(text)
    info = model_files.read_dir(model_files.ModelInfo("m", ""), tmp_path)
    assert info.config is None and len(info.problems) >= 1 and all("\n" not in p for p in info.problems)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)
SHAPE_KEYS = [
    "model_type",
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "head_dim",
    "max_position_embeddings",
    "tie_word_embeddings",
]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    changes=st.dictionaries(st.sampled_from(SHAPE_KEYS), JSON_VALUES, max_size=4),
    drop=st.sets(st.sampled_from(SHAPE_KEYS), max_size=2),
)
def test_any_config_json_is_read_or_refused_in_lines_never_a_traceback(tmp_path_factory, changes, drop):
    """Generated config.json dictionaries: each is accepted with shapes the preflight can count, or refused
    with one line per problem; never a traceback, a hang or a silent pass of a value outside its range."""
    path = tmp_path_factory.mktemp("m")
    config = {k: v for k, v in {**PUBLIC_CONFIGS["meta-llama/Llama-2-7b-hf"], **changes}.items() if k not in drop}
    (path / "config.json").write_text(json.dumps(config, default=str))
    info = model_files.read_dir(model_files.ModelInfo("m", ""), path)
    if info.config is None:
        assert info.problems and all("\n" not in p for p in info.problems)
    else:
        assert all(
            isinstance(info.config[k], int) and not isinstance(info.config[k], bool) and info.config[k] >= 1
            for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads")
        )


@pytest.mark.parametrize("text", ["[1, 2]", '"chat"', "3"])
def test_a_tokenizer_config_that_is_not_an_object_is_one_line(tmp_path, text):
    path = model_dir(tmp_path, "m", "meta-llama/Llama-2-7b-hf", LLAMA_WORDS)
    (path / "tokenizer_config.json").write_text(text)
    info = model_files.read_dir(model_files.ModelInfo("m", ""), path)
    assert info.problems == [
        f"config key models.m: {path}/tokenizer_config.json: (top level)={text} is not accepted (not of type 'object')"
    ]


@pytest.mark.parametrize(
    "text, said",
    [
        ("{not json", "Expecting property name"),
        ('{"chat_template": 5}', "chat_template=5 is not accepted (a Jinja template as a string, null, or a list"),
        ('{"chat_template": [{"name": "default"}]}', "is not accepted (a Jinja template"),
        ('{"model_max_length": "long"}', 'model_max_length="long" is not accepted'),
    ],
)
def test_a_tokenizer_config_that_is_not_json_or_of_other_types_is_one_line(tmp_path, text, said):
    """Before: not JSON passed the check silently (then 'no chat template'), a chat template that is not text was
    a TypeError traceback from Jinja."""
    path = model_dir(tmp_path, "m", "meta-llama/Llama-2-7b-hf", LLAMA_WORDS)
    (path / "tokenizer_config.json").write_text(text)
    info = model_files.read_dir(model_files.ModelInfo("m", ""), path)
    assert len(info.problems) == 1 and "\n" not in info.problems[0], info.problems
    assert (
        info.problems[0].startswith(f"config key models.m: {path}/tokenizer_config.json: ") and said in info.problems[0]
    )
