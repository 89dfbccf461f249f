"""The experiments: one module per job that measures with :mod:`jacap_lib.measure` and writes ``data/``, each with
its summary. They return numbers, never prose (the sentences are :mod:`jacap_lib.report`'s).

* the evaluation protocol and its tune / dev runs: :mod:`.protocol` (a package); the confirmatory study:
  :mod:`.confirm` (a package); the frozen candidates: :mod:`.candidates`; the dev record: :mod:`.record`;
* experiments on the tune and dev documents: :mod:`.ablation`, :mod:`.anatomy`, :mod:`.ladder` (prompt press to
  KVzip), :mod:`.needle`, :mod:`.field` (the whole field beside KVzip), :mod:`.plane` (the KL–retrieval plane);
* on the bundled model: :mod:`.decomposition`, :mod:`.diagnostics`, :mod:`.live` (the live chapter's KL table),
  :mod:`.serving` and :mod:`.decoding_comparison` (Algorithm 2), :mod:`.timing` and :mod:`.bench` (speed);
* shared: :mod:`.job` (the one shape of a job), :mod:`.names` (how the book names a setting), :mod:`.protection`
  (where protection fills a budget), :mod:`.defaults` (recorded options against today's defaults), :mod:`.corpus`
  (the builder of the benchmark's texts)."""
