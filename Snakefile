"""The experiment grid: model sets x methods x datasets x temperature x gamma.

    snakemake --cores 2                              # the embedded default (config/default.yaml)
    snakemake --cores 2 --configfile config/my.yaml  # your grid (replaces the default)
    snakemake -n                                     # list the jobs
    snakemake --workflow-profile workflow/profiles/slurm --configfile config/paper.yaml

Each cell is one generation job (GPU on a cluster) and one scoring job (CPU);
W&B logging, aggregation into tables and plots, and the analysis notebook
follow. The rules live in workflow/rules/, one concern per file.
"""

include: "workflow/rules/common.smk"
include: "workflow/rules/cells.smk"
include: "workflow/rules/prepare.smk"
include: "workflow/rules/generate.smk"
include: "workflow/rules/speed.smk"
include: "workflow/rules/score.smk"
include: "workflow/rules/wandb.smk"
include: "workflow/rules/aggregate.smk"


rule all:
    input:
        final_outputs(),
    default_target: True
