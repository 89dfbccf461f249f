"""The report: the sentences and tables the book prints, built from the experiments' numbers. Only the book and the
command line import it (``tests/test_layers.py`` checks it).

:mod:`.findings` (the dev evaluation's findings, ``findings.md``), :mod:`.answer` (the landing page's answer,
``answer.md``), :mod:`.confirm` (the confirmatory summary in sentences), :mod:`.landing` (the landing page's plane),
:mod:`.plane` and :mod:`.field` (the facts and KVzip chapters' lines), :mod:`.jobs` (the summary jobs followed by
the report they feed, as the command line runs them)."""
