"""The roadmap chapter's exercises: expected answers against independent computations, and the slips."""
import math

import torch

from jacap_lib import exercises as E


def test_roadmap_1_is_the_drop_of_logdet_and_names_the_second_copy_slip():
    d = E.data("roadmap.1")
    U, w = d["U"], d["weight"]
    A = torch.eye(3, dtype=torch.float64) + (U * w) @ U.T
    drop = torch.stack([torch.linalg.slogdet(A)[1] - torch.linalg.slogdet(A - w[i] * torch.outer(U[:, i], U[:, i]))[1]
                        for i in range(U.shape[1])])
    assert E.check("roadmap.1", drop)
    v = E.check("roadmap.1", torch.log1p(d["score"]))
    assert not v and "second copy" in v.message


def test_roadmap_2_single_token_score_is_below_one():
    assert E.check("roadmap.2", 6 / 7)
    v = E.check("roadmap.2", 6.0)
    assert not v and "A = I" in v.message


def test_roadmap_3_growth_factor():
    d = E.data("roadmap.3")
    p = torch.exp(d["z"] - d["z"].max())
    p = p / p.sum()
    share = float(p[d["kept"]].sum())
    assert E.check("roadmap.3", 1 / share)
    assert not E.check("roadmap.3", share)
    assert math.isclose(1 / share, E.get("roadmap.3").expected(), rel_tol=1e-12)
