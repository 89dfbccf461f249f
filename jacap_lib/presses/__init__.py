"""kvpress presses of the book, one press per file (kvpress layout), and the method registry.

* :class:`~.jacap_context.JacapPress` — the library's default: Jacap's score on the queries of a second reading of
  the context (kvpress KVzip's reconstruction pass), its budget spread across heads and layers; the tune rule's
  choice, at several times the cost of a prefill;
* :class:`~.jacap.JacapPromptPress` — the prompt press, Algorithm 1 on the prompt's own queries as a kvpress
  ``ScorerPress`` (only ``score()``; kvpress does the hooks, the top-k per KV head and the cache update; one prefill,
  usable in every kvpress wrapper); ``JacapPromptPress(centre="tempered")`` is Algorithm 1 as published, its default
  centre is the observed attention of the recent queries;
* the Jacap variants, each a registry name beginning with ``jacap_prompt`` (:mod:`.variants` lists them: e.g.
  ``jacap_ablate``, one component of Algorithm 1 swapped at a time, with the one-knob table ``ONE_KNOB``;
  ``jacap_ea``, Jacap with Expected Attention's summary of the queries to come; a press with new scoring
  logic has its own file);
* :mod:`.registry` — one name per method, Jacap's and kvpress's baselines alike: :func:`~.registry.list_methods`,
  :func:`~.registry.build_press` (``build_press("jacap_prompt", 0.5)`` is ``JacapPromptPress(0.5)``), method specs
  ``name[key=value,...]`` (:func:`~.registry.press_from_spec`) and :func:`~.registry.changed_options` (what two
  specs' presses differ in);
* presses that are not registry methods, the one-knob swaps of the critique's anatomy:
  :class:`~jacap_lib.measure.instruments.ProtectedPress` (any kvpress scorer under Jacap's sinks + window protection),
  :class:`~jacap_lib.measure.instruments.JacapWindowAttentionPress` (Jacap's centre replaced by SnapKV's window attention of the last
  prompt queries) and :class:`~jacap_lib.measure.instruments.JacapGivenStatisticsPress` (the query statistics handed in,
  e.g. the oracle moments of the queries after the prompt).
"""
