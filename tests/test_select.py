"""select_keep against a brute-force rule: protected positions (fitted to the budget), then the highest scores."""
import warnings

import pytest
import torch

from jacap_lib import select_keep


def brute(scores, budget, n_sink, window):
    """Sinks first (the earliest `budget` of them if even they do not fit), then the most recent window tokens
    that fit the budget left, then the highest scores."""
    n = len(scores)
    sinks = list(range(min(n_sink, n)))[:budget]
    recent = [i for i in range(n - 1, max(n - window, 0) - 1, -1) if i not in sinks][: budget - len(sinks)]
    protected = set(sinks) | set(recent)
    rest = sorted((i for i in range(n) if i not in protected), key=lambda i: -float(scores[i]))
    return sorted(protected | set(rest[: budget - len(protected)]))


@pytest.mark.parametrize("n,budget,n_sink,window", [(50, 10, 4, 0), (50, 10, 4, 6), (20, 19, 0, 0), (9, 9, 4, 8),
                                                  (30, 5, 5, 0), (12, 7, 3, 4), (10, 6, 8, 8), (12, 7, 3, 8),
                                                  (12, 7, 0, 9), (20, 2, 4, 4)])
def test_matches_brute_force(n, budget, n_sink, window):
    """A budget below the protected set follows the press's rule (sinks, then the window shrunk), warned."""
    g = torch.Generator().manual_seed(n * 31 + budget)
    scores = torch.randn(3, 2, n, generator=g)
    tight = budget < n and budget < len(set(range(min(n_sink, n))) | set(range(max(n - window, 0), n)))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        keep = select_keep(scores, budget, n_sink=n_sink, window=window)
    said = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(said) == int(tight), said
    if tight:
        assert ("only the first" in said[0]) == (budget < n_sink), said
    assert keep.dtype == torch.long and keep.shape == (3, 2, min(budget, n))
    for i in range(3):
        for j in range(2):
            assert keep[i, j].tolist() == brute(scores[i, j], budget, n_sink, window)


def test_budget_at_least_n_keeps_everything():
    s = torch.randn(2, 7)
    assert select_keep(s, 7).tolist() == [list(range(7))] * 2
    assert select_keep(s, 100, n_sink=50).tolist() == [list(range(7))] * 2


def test_protected_tokens_win_over_infinite_scores():
    s = torch.tensor([0.0, 0.0, float("inf"), float("inf"), 1.0, 0.0])
    assert select_keep(s, 3, n_sink=2).tolist() == [0, 1, 2] or select_keep(s, 3, n_sink=2).tolist() == [0, 1, 3]
    s = torch.full((6,), float("inf"))
    assert select_keep(s, 3, n_sink=1, window=1)[[0, -1]].tolist() == [0, 5]


@pytest.mark.parametrize("kw,arg", [({"budget": -1}, "budget"),
                                    ({"budget": 3, "n_sink": -1}, "n_sink"), ({"budget": 3, "window": 1.5}, "window"),
                                    ({"budget": 2.0}, "budget")])
def test_bad_arguments(kw, arg):
    budget = kw.pop("budget")
    with pytest.raises(ValueError, match=arg):
        select_keep(torch.randn(10), budget, **kw)


def test_nan_and_empty_scores_are_errors():
    with pytest.raises(ValueError, match="NaN"):
        select_keep(torch.tensor([0.0, float("nan"), 1.0]), 2, n_sink=0)
    with pytest.raises(ValueError, match="N = 0"):
        select_keep(torch.zeros(0), 1)
