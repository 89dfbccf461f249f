"""Results: the files under ``data/`` — where they are (:mod:`.paths`), what produced them
(:mod:`.provenance`), their one shape (:mod:`.files`), one loader per file (:mod:`.loaders`), the one
shape of a job (:mod:`.job`), and the jobs that run :mod:`jacap_lib.measure` and write them
(:mod:`.evaluation` with its protocol :mod:`.protocol` and statistics :mod:`.verdicts`, :mod:`.decomposition`, :mod:`.diagnostics`, :mod:`.live`,
:mod:`.serving`, :mod:`.decoding_comparison`, :mod:`.texts`, :mod:`.timing`, :mod:`.needle`, :mod:`.ablation`,
:mod:`.anatomy`). Speed tables: :mod:`.bench`. How many digits an estimate gets: :mod:`.precision`. The findings
sentences generated from the summary files: :mod:`.findings`. Which recorded press options of a file differ from
today's defaults, and whether the file says why: :mod:`.defaults`."""
