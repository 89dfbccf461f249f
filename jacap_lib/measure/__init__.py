"""Measurements on a model (compute only; the jobs that write ``data/`` are in :mod:`jacap_lib.results`):
quality under compression (:mod:`.quality`: compressed forward, next-token KL, one grid cell), needle
retrieval (:mod:`.passkey`), error decomposition (:mod:`.decomposition`), failure cases (:mod:`.failures`),
eviction inspection (:mod:`.eviction`), teacher-forced decoding (:mod:`.replay`), Algorithm 2 on a generation
(:mod:`.serving`), Algorithm 2 against
kvpress ``DecodingPress`` (:mod:`.decoding_compare`), registry presses inside kvpress wrappers (:mod:`.kvpress_grid`), two presses' kept sets compared
(:mod:`.anatomy`) and the presses it measures with, one step of Jacap changed (:mod:`.instruments`), mechanism and
query-statistics diagnostics (:mod:`.diagnostics`), and speed (:mod:`.timing`: timers, scoring cost, end-to-end
cost)."""
