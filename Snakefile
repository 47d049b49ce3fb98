"""The experiment grid: model sets x methods x datasets x temperature x gamma.

    snakemake --cores 2                              # the embedded default (config/default.yaml)
    snakemake --cores 2 --configfile config/my.yaml  # your grid (replaces the default)
    snakemake -n                                     # list the jobs
    snakemake --workflow-profile workflow/profiles/slurm --configfile config/paper.yaml

Each cell is one generation job (GPU on a cluster; a SLURM job array with the
slurm profile) and one judge group (speed and scoring, CPU; several cells per
submission); W&B logging (local), aggregation into tables and plots, and the
analysis notebook follow. The rules live in workflow/rules/, one concern per
file. When a job fails, the workflow ends by printing each failed cell's cause
in one line (`python -m pipeline status RESULTS` prints the same at any time).
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


onerror:
    from pipeline.status import failure_lines

    for line in failure_lines(RESULTS):
        print(line, file=sys.stderr)
