"""The confirmatory study: the plan, committed before any row (:mod:`.plan`); the run, once, on the fresh documents
(:mod:`.run`); the summary, the plan's verdicts and nothing else (:mod:`.summary`); its numbers grouped for the book
(:mod:`.groups`)."""
