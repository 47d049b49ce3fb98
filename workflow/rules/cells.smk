# The grid as files: one cell file per cell (its settings for the jobs, its dimensions for W&B and
# the tables), and grid.json, the index of the current config's cells. A changed cell rewrites its
# file, and the cell's jobs rerun from it; the other cells' files stay as they are.
# The files hold CellFile.to_json() (pipeline/experiment/cell.py); the run directives are left as they are, since
# Snakemake reruns a rule whose code changed, and with it every cell of a results directory.


rule cell:
    output:
        CELL_FILE,
    log:
        str(PATHS.log("cells", "{cell}")),
    localrule: True
    params:
        entry=lambda w: json.dumps(CELLS[w.cell].to_json(), sort_keys=True),
    run:
        write_json(output[0], parse_json(params.entry, "cell entry"), log[0])


rule grid:
    input:
        [CELL_FILE.format(cell=c) for c in CELLS],
    output:
        str(PATHS.grid),
    log:
        str(PATHS.log("grid")),
    localrule: True
    run:
        write_json(output[0], [read_user_json(f, "cell file", links=False)["dims"] for f in input], log[0])
