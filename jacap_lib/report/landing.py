"""The landing page's KL–retrieval plane, from the same source as its answer (:mod:`jacap_lib.report.answer`).

:func:`plane_points` gives the confirmatory run's points once its KL rows and a needle mode are complete, and the
whole field on the dev documents until then; each point's ``split`` says which (the figure's note prints it).
"""
from __future__ import annotations

from pathlib import Path

__all__ = ["plane_points"]


def plane_points(eval_dir=None, mode: str = "after") -> list[dict]:
    """The points of :func:`jacap_lib.viz.plane.kl_retrieval_figure` for the landing page: the confirmatory run's
    (:func:`jacap_lib.experiments.confirm.groups.plane_points`) once its KL rows and its needle run in ``mode`` are
    complete in ``eval_dir`` (default ``data/results/eval``), else the whole field on the dev documents
    (:func:`jacap_lib.experiments.field.field_points`); ``[]`` when neither is there."""
    from jacap_lib.experiments.confirm.groups import plane_points as confirm_points
    from jacap_lib.experiments.field import field_points
    from jacap_lib.results.loaders import load_confirm_summary, load_field_summary
    from jacap_lib.results.paths import data_path

    d = Path(eval_dir) if eval_dir is not None else data_path("results", "eval", must_exist=False)
    confirm = load_confirm_summary(d, part="kl")
    points = confirm_points(confirm, mode) if confirm is not None else []
    field_path = d / "peers" / "field_summary.json"
    if points or not field_path.exists():
        return points
    return field_points(load_field_summary(field_path), mode)
