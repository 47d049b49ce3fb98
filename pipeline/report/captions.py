"""Each table's caption, written once: ``aggregate`` formats them with a run's figures (its confidence, whether
the grid has transformers' methods, the paper cited) above each table in summary.md, and the Snakemake report's
captions of the tables it shows (``workflow/report/<table>.rst``) are generated from them:

    python -m pipeline.report.captions            # rewrite workflow/report/<table>.rst
    python -m pipeline.report.captions --check    # exit 1 when one is not what CAPTIONS give
"""

from __future__ import annotations

import argparse
import re
import sys

from .. import ROOT
from ..files import write_atomic

DATASETS_NOTE = (
    "One column per dataset, no mean over them; `spec_bench` is Spec-Bench's Overall, every prompt of its six "
    "categories pooled (each category: spec_bench_categories). The CSV adds per dataset γ, τ, tokens/s and flags.\n"
)
PEERS = (  # the speed-up table's caption, when the grid has transformers' own methods
    "`hf_*`: transformers' own `generate` (assisted generation, prompt lookup, `assistant_ensemble_weight`) "
    "with the model set's draft and the same gamma; transformers cannot take a restricted head, so they "
    "run on a set with a full-head draft, and the table's other rows of that set use the same draft.\n"
)
CAPTIONS = {  # {conf}: the speed-ups' confidence
    "speedup_vs_standard": (
        "Tokens/s over the cell's standard method (the ensemble for `*_sd`/`*_se`, the large model for `sd`), "
        "measured side by side in the same job; best over the gamma sweep (the best of several noisy estimates "
        "leans high: read the interval); {conf} interval in brackets. " + DATASETS_NOTE + "{peers}"
    ),
    "paper_vs_ours": (
        "The speed-ups {citation} reports (config/paper_reported.yaml, with where each is stated) "
        "beside ours over the standard method [{conf} interval]; a figure not transcribed stays empty.\n"
    ),
    "ours_vs_peers": (
        "Ours over other engines' methods: each cell's side-by-side speed-up over its standard method "
        "divided by the peer's over its own, prompts paired ({conf} interval over prompts): transformers' "
        "`hf_*` over our large model's decoding, vLLM's `vllm_*` over vLLM's (`vllm`), so an engine's own "
        "kernels cancel. A peer marked `not exact` does not sample its standard method's distribution at that T "
        "(`hf_assisted_ensemble`, `vllm_sd`: docs/exactness.md, docs/vllm.md).\n"
    ),
    "ours_vs_vllm": (
        "Ours against vLLM on the same model set, prompts and machine, in tokens/s: our `sd` over vLLM's "
        "speculation, and the large model decoded by us (its runs beside `sd`) over the same model decoded by "
        "vLLM (its runs beside its speculation). These are different jobs, not runs side by side: whatever else "
        "the machine did between them is in the ratio, and the {conf} interval covers the "
        "prompts only. Above 1: ours is faster.\n"
    ),
    "speedup_vs_large": (
        "Not comparable: tokens/s over the large model's own cell, which ran in another job (prompts paired by id), "
        "so not measured side by side. Whatever the machine did differently between the two jobs is in every "
        "figure, unmarked, and the {conf} interval covers the prompts only. The null row measures that drift for "
        "this run: the large model's runs in the null cell's job over the same model's own cell, which would read "
        "1.00x without it. Quote speedup_vs_standard. " + DATASETS_NOTE
    ),
    "quality": (
        "Every task metric of each cell's outputs, under its own name (pass@1, acc, ...), with its 95% interval "
        "over examples [low, high]: Wilson's for a proportion, else a bootstrap (docs/quality.md). Intervals "
        "that overlap read as no significant difference.\n"
    ),
    "likelihood": (
        "Multiple-choice tasks scored by log-likelihood through lm-eval, once per distinct distribution rather "
        "than per cell: a lossless accelerated method (`sd`, `*_sd`, `*_se`, `*_me`, the peers) draws from its "
        "standard method's distribution and shares its figures (methods: the cells it stands for); scored at "
        "temperature 1 whatever the cells' T. acc: the answer with the highest log-likelihood; acc_norm: per "
        "character; n questions; 95% Wilson interval [low, high]. `- large`: an ensemble's figure minus its large "
        "model's on the same questions, with a paired 95% bootstrap interval: excluding 0, the ensemble differs "
        "significantly (docs/quality.md).\n"
    ),
    "acceptance": (
        "τ: mean accepted length, tokens emitted per forward of the large model (the verifier's own token "
        "included; autoregressive decoding = 1.00); τ by model: the same per model of the set, in order. "
        "Acceptance: accepted over verified proposals (of the grid's `proposer`); ceiling: the "
        "mean over the emitted tokens' positions of the target's largest probability, the most a one-hot "
        "proposer (lookup, suffix, recycle) can be accepted at that temperature (1 at T=0; a proposer that draws "
        "from a distribution of its own, a draft, can pass it); draft acceptance: accepted over proposed "
        "(vLLM's); per position: the acceptance rate of the 1st, 2nd, ... token of a verified block.\n"
    ),
    "exactness": (
        "T=0 cells: the share of samples whose tokens equal the baseline's (Spec-Bench's equality check); each "
        "mismatch attributed to numerics (a near-tie in a float64 recompute at the first divergent token) or a "
        "bug (unchecked: the float64 recompute could not run, see the cell's .speed.json). In float32/float64 "
        "on a CPU every sample is expected to match.\n"
    ),
    "predicted_vs_measured": (
        "Predicted: the method's forwards priced at each model's measured cost of one forward (a forward of k "
        "tokens assumed as cheap as one, the loop free); measured: side by side. Overhead: share of wall time "
        "outside model forwards. Proposal cost: the seconds the named proposers (lookup, suffix, recycle, and a "
        "feature head's eagle) spent per drafted token, over the seconds of one forward of the large model. Union: "
        "for members with different tokenizers, the size of the union vocabulary and the seconds spent mapping the "
        "members' rows into it over the cell's samples (part of the overhead; blank for one shared vocabulary).\n"
    ),
    "spec_bench_categories": (
        "Spec-Bench's six categories: speed-up over the standard method [{conf} interval], and τ; Overall: "
        "the cell's figure over all its prompts pooled (Spec-Bench's Overall).\n"
    ),
    "drafts": (
        "The distilled models the grid uses (docs/proposers.md), each trained for a fixed number of steps from a "
        "seed (the same weights on any machine with the same library versions and threads): its loss (ce: the "
        "teacher's argmax; kl, tvd: its whole distribution), how often it agrees with its teacher's greedy token "
        "on held-out HumanEval continuations (T=0: greedy acceptance; a student: equal pieces), its expected "
        "acceptance at T=1 (the sum of min(p, q)), alone and with prompt lookup first, and the seconds taken.\n"
    ),
    "beside": (
        "Every process that took CPU time (20 ms or more) while a generation job timed a run, by what it is "
        "(`pipeline <command>`: a job of this workflow): in how many cells and timed samples, how many of those "
        "were interfered with (the run's own wait for a CPU or its preemptions over their thresholds) and its "
        "CPU seconds in them; the first row counts every timed sample (a pair where the cell has a baseline; a "
        "cell made of another's side-by-side runs is counted with its source, once). "
        "Every job but generation runs at nice 19, so beside a timed run it takes a spare core or waits "
        '(docs/speed.md, "Interference").\n'
    ),
    "flags": (
        "Cells whose speed-up should not be trusted as it stands: interval wider than the bound, too many pairs "
        "interfered with after re-measuring, samples timed on different machines, or a measured speed-up far "
        "from the cost model's prediction. Run them again on a quiet machine (delete their generations).\n"
    ),
}

# The tables the report shows (rule aggregate's table_report), each captioned by workflow/report/<table>.rst;
# what follows the caption there (the speed-up table shows its HTML inline).
REPORTED = {
    "speedup_vs_standard": "\n.. raw:: html\n   :file: {{ snakemake.output.speedup_html }}\n",
    "speedup_vs_large": "",
    "quality": "",
    "likelihood": "",
    "acceptance": "",
    "flags": "",
}
REPORT_DIR = ROOT / "workflow" / "report"
# the confidence of the run's intervals, as the report's Jinja renders it from the config (the schema's default
# when the config leaves it out)
CONFIDENCE = '{{{{ "%.0f%%" % (((snakemake.config.get("timing") or {{}}).get("confidence") or {default}) * 100) }}}}'


def report_caption(name: str) -> str:
    """The report's caption of table ``name``: its caption in reStructuredText (Markdown's code spans as literals),
    the confidence left to the report's config, transformers' note and the citation in general words."""
    from ..experiment.config import load_schema

    default = load_schema()["properties"]["timing"]["properties"]["confidence"]["default"]
    text = CAPTIONS[name].format(conf=CONFIDENCE.format(default=default), peers="", citation="the paper")
    text = re.sub(r"`([^`]+)`", r"``\1``", text)
    return text + REPORTED[name]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.report.captions", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare workflow/report/<table>.rst, write nothing")
    args = parser.parse_args(argv)
    stale = []
    for name in REPORTED:
        page, text = REPORT_DIR / f"{name}.rst", report_caption(name)
        if args.check:
            if not page.exists() or page.read_text() != text:
                stale.append(page)
        else:
            write_atomic(page, text)
            print(page)
    for page in stale:
        print(f"{page} is out of date (CAPTIONS changed): run python -m pipeline.report.captions", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
