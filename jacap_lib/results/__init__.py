"""Data access: the files under ``data/`` — where they are (:mod:`.paths`), their one shape (:mod:`.files`), what
produced them (:mod:`.provenance`), one loader per results file (:mod:`.loaders`) and the benchmark's texts,
sha256-checked (:mod:`.texts`). The jobs that write these files are :mod:`jacap_lib.experiments`; the statistics
are :mod:`jacap_lib.verdicts`; the sentences the book prints are :mod:`jacap_lib.report`."""
