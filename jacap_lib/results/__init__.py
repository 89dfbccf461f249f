"""Results: the files under ``data/`` — where they are (:mod:`.paths`), what produced them
(:mod:`.provenance`), their one shape (:mod:`.files`), one loader per file (:mod:`.loaders`), and the jobs
that run :mod:`jacap_lib.measure` and write them (:mod:`.quality`, :mod:`.decomposition`, :mod:`.live`,
:mod:`.serving`, :mod:`.texts`). Speed tables: :mod:`.bench`."""
