"""Draft training: bounded by steps and seeded (the same weights beside a busy process), the distribution losses
(``kl``, ``tvd``) tied to the acceptance rule they stand for, and the recipe refused in one line."""

from __future__ import annotations

import copy
import importlib
import json
import subprocess
import sys

import pytest
import torch

from pipeline.decoding.verify import verify_sampled
from pipeline.models import ModelError, ModelSpec, Recipe, distill, load
from pipeline.models.distill import draft_name, train_draft
from pipeline.models.loading import truncated_copy
from pipeline.models.resolve import recipe_for
from pipeline.models.restricted import RestrictedHeadLM
from pipeline.models.sources import cache_stem
from pipeline.models.teacher import Example, teacher_data
from pipeline.models.training import acceptance, draft_loss, fit

teacher_module = importlib.import_module("pipeline.models.teacher")
training_module = importlib.import_module("pipeline.models.training")
TINY = dict(layers=1, head_tokens=64, prompts=4, new_tokens=8, source_chunks=2, chunk_tokens=64, eval_prompts=2)


def test_training_runs_its_steps_however_slow_the_clock(monkeypatch):
    """Every step of the recipe is taken even when each one seems to take an hour: no time bound."""
    clock = iter(range(0, 10**9, 3600))
    monkeypatch.setattr(training_module.time, "perf_counter", lambda: float(next(clock)))
    layer = torch.nn.Linear(3, 2)
    examples = [(torch.randn(4, 3), torch.tensor([0, 1, 1, 0]))]
    calls = []

    def loss(example, step):
        calls.append(1)
        return torch.nn.functional.cross_entropy(layer(example[0]), example[1])

    facts = fit(layer, list(layer.parameters()), examples, Recipe(steps=37, warmup=2), loss, "test")
    assert facts["steps"] == 37 and len(calls) == 37 and facts["threads"] == torch.get_num_threads()


def test_a_loss_that_is_not_finite_stops_training_at_once_in_one_line():
    """A recipe whose loss is NaN from its first step cannot train: ``fit`` (drafts, students and heads alike) stops
    at that step with one line, before anything is saved or cached, not after its steps with a head that is
    refused only when next loaded."""
    layer = torch.nn.Linear(3, 2)
    calls = []

    def loss(example, step):
        calls.append(step)
        return layer(example[0]).sum() * float("nan")

    with pytest.raises(ModelError, match=r"^train head: the loss is nan at step 0 of 37; nothing was saved"):
        fit(layer, list(layer.parameters()), [(torch.randn(4, 3), None)], Recipe(steps=37), loss, "train head")
    assert calls == [0]


def busy(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def test_the_same_recipe_makes_the_same_weights_beside_a_busy_process(tiny_dir, tmp_path):
    recipe = Recipe(**TINY, steps=12, loss="kl")
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # the job's own thread count does not matter: a distillation fixes its own
    quiet = distill(load(tiny_dir, pack=False)[0], load(tiny_dir)[1], tmp_path / "quiet", recipe, "tiny")
    torch.set_num_threads(before)
    competitors = busy(2)
    try:
        loaded = distill(load(tiny_dir, pack=False)[0], load(tiny_dir)[1], tmp_path / "loaded", recipe, "tiny")
        assert all(p.poll() is None for p in competitors)  # they competed for the whole run
    finally:
        for p in competitors:
            p.kill()
            p.wait()
    for name in ("model.safetensors", "head_tokens.json"):
        assert (quiet / name).read_bytes() == (loaded / name).read_bytes(), name
    facts = [json.loads((d / "draft.json").read_text()) for d in (quiet, loaded)]
    for f in facts:
        assert f["steps"] == 12 and f["threads"] == training_module.TRAIN_THREADS and f["versions"]["torch"]
    timeless = [{k: v for k, v in f.items() if "seconds" not in k} for f in facts]
    assert timeless[0] == timeless[1]  # loss, acceptance, everything but the clock


def test_drafts_of_one_teachers_data_share_it_and_train_the_same_weights(tiny_dir, tmp_path, monkeypatch):
    """The teacher's data is made once for drafts that differ only in what it does not read (here: the loss and
    the steps), and a draft trained from the stored data has the weights it has when the data is made afresh."""
    store = tmp_path / "data.pt"
    made = []
    real = teacher_module.teacher_data
    monkeypatch.setattr(teacher_module, "teacher_data", lambda *a: made.append(1) or real(*a))
    first, second = Recipe(**TINY, steps=6, loss="kl"), Recipe(**TINY, steps=9, loss="ce")
    assert teacher_module.data_name(ModelSpec("tiny", source=str(tiny_dir)), first) == teacher_module.data_name(
        ModelSpec("tiny", source=str(tiny_dir)), second
    )
    assert teacher_module.data_name(ModelSpec("tiny", source=str(tiny_dir)), first) != teacher_module.data_name(
        ModelSpec("tiny", source=str(tiny_dir)), Recipe(**{**TINY, "prompts": 5})
    )
    # named otherwise in a config, the same model's data and drafts are the same cache entries; a directory whose
    # name is no config name (too long for a file name with its suffix, spaces, a leading dot) is made one
    odd = tmp_path / (".odd model " + "x" * 240)
    odd.mkdir()
    (odd / "config.json").write_text("{}")
    assert cache_stem(ModelSpec("x", source=str(odd))) == "odd-model-" + "x" * 90
    for name in (teacher_module.data_name, draft_name):
        assert name(ModelSpec("tiny", source=str(tiny_dir)), first) == name(ModelSpec("x", source=str(tiny_dir)), first)
    dirs = {}
    for name, recipe, kept in [("a", first, store), ("b", second, store), ("fresh", second, None)]:
        teacher, tokenizer = load(tiny_dir, pack=False)
        dirs[name] = distill(teacher, tokenizer, tmp_path / name, recipe, "tiny", data_store=kept)
    assert len(made) == 2 and store.exists()  # the first draft made it, the second read it, the last made its own
    for name in ("model.safetensors", "head_tokens.json"):
        assert (dirs["b"] / name).read_bytes() == (dirs["fresh"] / name).read_bytes(), name


def test_the_teachers_data_reads_no_recipe_setting_its_cache_name_leaves_out(tiny_dir):
    """Drafts share the teacher's data by ``data_name``, a hash of ``DATA_FIELDS``: a setting that ``teacher_data``
    read beyond them would make drafts of different data share one file."""
    read = set()

    class Spy:
        def __init__(self, recipe):
            self.recipe = recipe

        def __getattr__(self, name):
            read.add(name)
            return getattr(self.recipe, name)

    teacher, tokenizer = load(tiny_dir, pack=False)
    teacher_data(teacher, tokenizer, Spy(Recipe(**TINY)))
    assert read and read <= set(teacher_module.DATA_FIELDS), read - set(teacher_module.DATA_FIELDS)


def rows(vocab: int, kept: int, positions: int, seed: int = 0):
    """Teacher probabilities over ``vocab`` ids (some mass outside the first ``kept``) and draft logits."""
    g = torch.Generator().manual_seed(seed)
    p = (3 * torch.randn(positions, vocab, generator=g, dtype=torch.float64)).softmax(-1)
    z = (2 * torch.randn(positions, kept, generator=g, dtype=torch.float64)).requires_grad_(True)
    labels = p[:, :kept].argmax(-1)
    example = Example(torch.zeros(1, positions, dtype=torch.long), labels, torch.arange(positions), p[:, :kept].log())
    return p, z, example


def test_tvd_loss_is_the_rejection_rate_of_speculative_sampling():
    """1 - tvd is how often the decoder's own acceptance rule keeps a token the draft sampled, the teacher's
    mass outside the head included (the draft can never propose there)."""
    p, z, example = rows(vocab=40, kept=15, positions=3)
    loss = draft_loss("tvd", z, example)
    q = torch.zeros_like(p)
    q[:, :15] = z.detach().softmax(-1)
    expected = 1 - torch.minimum(p, q).sum(-1).mean()
    assert abs(loss.item() - float(expected)) < 1e-12
    g = torch.Generator().manual_seed(1)
    trials, kept = 6000, 0
    for row in range(3):
        for _ in range(trials):
            token = torch.multinomial(q[row], 1, generator=g)
            n, _ = verify_sampled(p[row : row + 1], token, [q[row]], g)
            kept += n
    rejected, loss = 1 - kept / (3 * trials), loss.item()
    assert abs(rejected - loss) < 5 * (loss * (1 - loss) / (3 * trials)) ** 0.5 + 1e-9


def test_kl_loss_is_least_at_the_teacher_renormalised_on_the_head():
    p, z, example = rows(vocab=40, kept=15, positions=4)
    at_teacher = example.logp.clone().requires_grad_(True)  # logits = log p: softmax gives p / p(head)
    best = draft_loss("kl", at_teacher, example)
    best.backward()
    assert at_teacher.grad.abs().max() < 1e-12
    assert draft_loss("kl", z, example).item() > best.item() + 1e-3
    head_mass = p[:, :15].sum(-1)
    assert abs(best.item() - float((head_mass * head_mass.log()).mean())) < 1e-12  # the head's unavoidable part


@pytest.fixture(scope="module")
def tiny_data(tiny_dir):
    teacher, tokenizer = load(tiny_dir, pack=False)
    with torch.no_grad():
        teacher.model.norm.weight *= 20  # a random tiny model is near uniform: this one is sure of itself
    recipe = Recipe(**{**TINY, "head_tokens": 0})
    base = truncated_copy(teacher, 1)
    return base, teacher_data(teacher, tokenizer, recipe)


def test_teacher_data_restricts_the_distribution_to_the_head(tiny_data):
    _, data = tiny_data
    assert data.kept == sorted(data.kept) and data.examples and data.held
    for e in data.examples:
        assert e.logp.shape == (len(e.rows), len(data.kept))
        assert (e.logp.exp().sum(-1) <= 1 + 1e-3).all()
        labelled, best = e.labels[e.rows], e.logp.max(-1).values
        at_label = e.logp.gather(-1, labelled.clamp(min=0).unsqueeze(-1))[:, 0]
        assert ((at_label >= best - 2e-2) | (labelled < 0)).all()  # the argmax label, up to float16 storage


@pytest.mark.parametrize("loss", ["kl", "tvd"])
def test_distribution_losses_raise_acceptance_at_t1(tiny_data, loss):
    base, data = tiny_data
    before = acceptance(RestrictedHeadLM(copy.deepcopy(base), data.kept), data.held)["acceptance_t1"]
    draft, facts = train_draft(copy.deepcopy(base), data, Recipe(**{**TINY, "head_tokens": 0}, steps=40, loss=loss))
    assert facts["acceptance_t1"] > before + 0.01 and facts["final_loss"] >= 0
    assert 0 <= facts["agreement"] <= facts["agreement_with_lookup"] <= 1


def test_a_learning_curve_is_measured_every_50_steps(tiny_data):
    base, data = tiny_data
    _, facts = train_draft(copy.deepcopy(base), data, Recipe(**TINY, steps=60, loss="ce"), curve=True)
    assert [c["step"] for c in facts["curve"]] == [50, 60]
    assert facts["curve"][-1]["acceptance_t1"] == facts["acceptance_t1"]


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"loss": "mse"}, "distill loss='mse' for a draft: accepted: ce, kl, tvd"),
        ({"steps": 0}, "distill steps=0 for a draft: expected an integer of 1 or more"),
        ({"lr": float("nan")}, r"distill lr=nan for a draft: expected a number in \(0, 1\]"),
        ({"max_train_seconds": 60}, "distill settings for 'd': unknown key 'max_train_seconds'; accepted: layers, "),
        ({"loss": "kl", "tokenizer": {"vocab": 512}}, "distill loss='kl' for 'd': a student with a tokenizer"),
    ],
)
def test_a_recipe_that_cannot_train_is_refused_in_one_line(settings, message):
    with pytest.raises(ModelError, match=message) as err:
        recipe_for({"teacher": "t", **settings}, "d")
    assert "\n" not in str(err.value)


def test_every_nth_on_policy_prompt_can_be_a_chat_turn(smol_tokenizer):
    from pipeline.models.teacher import as_chat_turns

    prompts = [f"def f{i}():\n" for i in range(5)]
    turned = as_chat_turns(prompts, smol_tokenizer, 2)
    assert [t == p for t, p in zip(turned, prompts)] == [True, False, True, False, True]
    assert "def f1():" in turned[1] and turned[1].startswith("<|im_start|>") and turned[1] != prompts[1]
    assert as_chat_turns(prompts, smol_tokenizer, 0) == prompts


def test_the_shared_teacher_data_cache_writes_through_no_link_and_makes_again_what_is_not_its_record(
    tiny_dir, tmp_path, capsys
):
    """The model cache may be shared (a cluster's): a symbolic link planted at the teacher data's old temporary
    name or at its lock, a hard link or a pipe at the lock, never has its target written (the lock is one line,
    no hang); a stored file that is valid torch but not a teacher-data record, or holds ids outside the
    vocabulary, is made again with a warning naming why, not a traceback, and gives what a fresh one gives."""
    import os

    from pipeline.errors import UserError
    from pipeline.models.teacher import stored_teacher_data

    teacher, tokenizer = load(tiny_dir, pack=False)
    recipe, store = Recipe(**TINY), tmp_path / "cache" / "data.pt"
    store.parent.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("precious")
    lock = store.parent / f".{store.name}.lock"
    (store.parent / f".{store.name}.tmp").symlink_to(victim)
    for plant, says in (
        (lambda: lock.symlink_to(victim), "it is a symbolic link"),
        (lambda: os.link(victim, lock), "it is a hard link to another file"),
        (lambda: os.mkfifo(lock), "it is a pipe with no reader"),
    ):
        plant()
        with pytest.raises(UserError, match=f"cannot write the cache lock of data.pt {lock}: {says}"):
            stored_teacher_data(teacher, tokenizer, recipe, store)
        lock.unlink()
        assert victim.read_text() == "precious" and not store.exists()
    made = stored_teacher_data(teacher, tokenizer, recipe, store)
    assert victim.read_text() == "precious" and store.is_file()
    saved = torch.load(store, weights_only=True)
    foreign = [(ids + len(tokenizer), *rest) for ids, *rest in saved["examples"]]
    for content, why in (({"foo": 1}, "not a teacher-data record"), ({**saved, "examples": foreign}, "outside")):
        torch.save(content, store)
        again = stored_teacher_data(teacher, tokenizer, recipe, store)
        out = capsys.readouterr().out
        assert f"warning: {store} cannot be read (" in out and why in out and "made again" in out
        assert [e.ids.tolist() for e in again.examples] == [e.ids.tolist() for e in made.examples]
    read = stored_teacher_data(teacher, tokenizer, recipe, store)  # and the file made again is read, as it was
    assert "warning" not in capsys.readouterr().out and read.kept == made.kept


def test_a_cache_directory_that_is_a_link_is_replaced_and_what_it_points_to_kept(tmp_path):
    """A finished draft (or head, or converted model) takes its directory's place whole; where that name is a
    symbolic link (planted, or left by a user), the link goes and the directory it pointed to is left as it was."""
    from pipeline.models.cache import write_dir

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "model.safetensors").write_text("someone else's")
    out = tmp_path / "cache" / "drafts" / "d"
    out.parent.mkdir(parents=True)
    out.symlink_to(elsewhere, target_is_directory=True)
    write_dir(out, lambda tmp: (tmp / "model.safetensors").write_text("ours"), {"draft.json": "{}"})
    assert not out.is_symlink() and (out / "model.safetensors").read_text() == "ours"
    assert (out / "draft.json").read_text() == "{}" and [p.name for p in elsewhere.iterdir()] == ["model.safetensors"]
    assert (elsewhere / "model.safetensors").read_text() == "someone else's"


def test_a_draft_is_trained_in_float32_whatever_its_teachers_dtype(tiny_dir, tmp_path, monkeypatch):
    """A teacher the config runs in bfloat16 (a GPU's default) is loaded in float32 to distil from: a draft
    trained in bfloat16 loses AdamW's small steps. Its saved weights are float32."""
    from safetensors import safe_open

    from pipeline.models.resolve import ensure_draft

    monkeypatch.setenv("SPECENS_CACHE", str(tmp_path / "cache"))
    spec = ModelSpec("tiny", source=str(tiny_dir), dtype="bfloat16", device="cpu")
    out = ensure_draft(spec, Recipe(**TINY, steps=3), out_dir=tmp_path / "draft")
    with safe_open(out / "model.safetensors", "pt") as saved:
        dtypes = {saved.get_tensor(name).dtype for name in saved.keys()}  # noqa: SIM118 (safe_open is not iterable)
    assert dtypes == {torch.float32}


def test_a_drafts_weights_and_head_are_checked_as_they_load(tiny_dir, tmp_path, monkeypatch):
    """A distilled draft whose weights hold NaN (it would propose nothing, silently) or whose head names ids outside
    the vocabulary (an IndexError deep in the head before) is one line when it loads."""
    from safetensors.torch import load_file, save_file

    from pipeline.models.resolve import ensure_draft

    monkeypatch.setenv("SPECENS_CACHE", str(tmp_path / "cache"))
    out = ensure_draft(ModelSpec("tiny", source=str(tiny_dir)), Recipe(**TINY, steps=2), out_dir=tmp_path / "draft")
    load(out, pack=False)  # as made: it loads
    heads = out / "head_tokens.json"
    kept = json.loads(heads.read_text())
    for bad, said in (
        ([*kept[:-1], 10**9], "distinct token ids below"),
        ([*kept[:-1], kept[0]], "distinct"),
        ("x", ""),
    ):
        heads.write_text(json.dumps(bad))
        with pytest.raises(ModelError, match=f"restricted head {heads}.*{said}") as err:
            load(out, pack=False)
        assert "\n" not in str(err.value)
    heads.write_text(json.dumps(kept))
    weights = load_file(out / "model.safetensors")
    name = sorted(weights)[0]
    weights[name][0] = float("nan")
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ModelError, match="its weight .* holds NaN or infinity; distil it again"):
        load(out, pack=False)


@pytest.mark.parametrize("name", ["../../x", "/etc/x", "a\0b", "n" * 300, "..", "/"])
def test_a_distilled_models_name_from_a_cell_file_never_names_a_file_outside_the_cache(name, tmp_path, monkeypatch):
    """A cell file or the command line gives a distilled model's name unchecked by the config's schema: whatever it
    is, the cache names made from it (its draft, head and teacher data, and their locks) are plain file names under
    the cache, never a path out of it (a name with '/' or NUL, '..', 300 characters)."""
    monkeypatch.setenv("SPECENS_CACHE", str(tmp_path / "cache"))
    spec = ModelSpec(name, distill={"teacher": "smollm2-135m-instruct", "layers": 1})
    stem = cache_stem(spec)
    assert stem and "/" not in stem and "\0" not in stem and len(stem) <= 100 and not stem.startswith(".")
    for made in (draft_name(spec, Recipe(**TINY)), teacher_module.data_name(spec, Recipe(**TINY))):
        path = (tmp_path / "cache" / "heads" / made).resolve()
        assert path.parent == (tmp_path / "cache" / "heads").resolve(), made
