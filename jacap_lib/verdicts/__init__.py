"""The statistics of a verdict, once: paired per-document ratios, bootstrap intervals, Wilcoxon, McNemar and Holm,
power and detectable ratios (:mod:`.intervals`); the statistics the jobs compute from the rows of the committed files
(:mod:`.rows`); the kind of a verdict and its count (:mod:`.words`); how many digits an estimate and its interval
get (:mod:`.precision`)."""
