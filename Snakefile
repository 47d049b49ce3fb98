"""The experiment grid: model sets x methods x datasets x temperature x gamma.

    snakemake --cores 2                              # the embedded default (config/default.yaml)
    snakemake --cores 2 --configfile config/my.yaml  # your grid (replaces the default)
    snakemake -n                                     # list the jobs
    snakemake --workflow-profile workflow/profiles/slurm --configfile config/paper.yaml

Each cell's generation, speed judging and scoring run as one group job (with
the slurm profile: one GPU submission per cell); hub downloads and W&B
logging are local rules; aggregation into tables and plots and the analysis
notebook follow as one more group job. The rules live in workflow/rules/, one concern per
file. When a job fails, the workflow ends by printing each failed cell's cause
in one line (`python -m pipeline status RESULTS` prints the same at any time).
"""


include: "workflow/rules/common.smk"
include: "workflow/rules/cells.smk"
include: "workflow/rules/prepare.smk"
include: "workflow/rules/generate.smk"
include: "workflow/rules/speed.smk"
include: "workflow/rules/score.smk"
include: "workflow/rules/likelihood.smk"
include: "workflow/rules/wandb.smk"
include: "workflow/rules/aggregate.smk"


rule all:
    default_target: True
    input:
        final_outputs(),


onerror:
    from pipeline.report.status import failure_lines

    for line in failure_lines(RESULTS):
        print(line, file=sys.stderr)
