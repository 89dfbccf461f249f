r"""Exercises of every chapter, through one checker.

    from jacap_lib import exercises
    exercises.question("capacity.2")         # the question, with the tolerance the checker applies
    exercises.data("capacity.2")             # the inputs the question talks about (a dict)
    exercises.check("capacity.2", answer)    # a Verdict: truthy when right, a hint naming the slip when not

**Ids follow chapter labels, not numbers.** An exercise id is ``"<chapter label>.<n>"``: the label
written above the chapter's title (``(capacity)=``) and the exercise's position in its chapter. Moving
a chapter changes its rendered number but neither its label nor its exercise ids, so nothing drifts
(``tests/test_exercises.py`` checks that every chapter module's label is a chapter's title label and
that every id a chapter checks exists and belongs to that chapter).

**One module per chapter.** ``jacap_lib/exercises/<label with - as _>.py`` defines ``CHAPTER`` (the
label) and ``EXERCISES``, a list of :class:`Exercise` in the order the chapter asks them. An exercise
holds the question text, ``expected`` (a function computing the answer from the library — never a typed
number), a grader built with :func:`number`, :func:`integer`, :func:`tensor` or :func:`custom` (each
states its tolerance, which :func:`question` appends to the text), optionally ``data`` (a function
returning a dict of inputs) and ``given`` (names of objects of the chapter's own run that ``check``
must be passed, e.g. ``check("live-eviction.1", answer, inspection=insp)``; ``expected`` then
receives them). Import the module below and add it to ``_MODULES``.

**Verdicts.** ``None`` (or ``...``) as the answer means "not attempted": the verdict shows the
question. A wrong answer gets a hint; in the book build (``JACAP_BOOK_BUILD`` set) a wrong answer
raises ``AssertionError`` — the solutions execute in the build, so a solution that stops being right
fails the build, while a reader's unanswered cell never does.

**The pattern in a chapter** (MyST source, ``book/chapters/NN_slug.md``): the question in an
admonition titled by the exercise's number within the chapter, a reader cell, the worked solution in
a dropdown, and the solution's code in a hidden cell that executes in the build::

    ```{admonition} Exercise 2
    With `A, w, u` from `exercises.data("capacity.2")`, compute ... (say what to return).
    ```

    ```{code-cell} ipython3
    answer = None  # your number
    exercises.check("capacity.2", answer)
    ```

    :::{admonition} Solution 2
    :class: dropdown
    The derivation, in words and formulas.
    :::

    ```{code-cell} ipython3
    :tags: [hide-cell]
    d = exercises.data("capacity.2")
    gain = ...                           # the solution's code
    exercises.check("capacity.2", gain)  # fails the build if the solution is wrong
    ```
"""
from __future__ import annotations

from . import (algorithm1, baselines, capacity, critique, error_decomposition, facts, failure_cases,
               fair_comparison, kv_memory, kvpress_usage, kvzip, leverage, live_eviction, roadmap, serving,
               softmax_jacobian)
from ._core import Exercise, Verdict, custom, integer, number, tensor

__all__ = ["check", "data", "question", "ids", "get", "CHAPTERS", "Exercise", "Verdict",
           "number", "integer", "tensor", "custom"]

_MODULES = (kv_memory, softmax_jacobian, capacity, leverage, roadmap, algorithm1, live_eviction, serving, kvpress_usage,
            fair_comparison, baselines, facts, critique, error_decomposition, failure_cases, kvzip)
#: the chapter modules, in book order (module name = chapter label with "-" replaced by "_")
CHAPTERS = tuple(m.__name__.rpartition(".")[2] for m in _MODULES)


def _load() -> dict[str, Exercise]:
    registry: dict[str, Exercise] = {}
    for name, module in zip(CHAPTERS, _MODULES):
        if module.CHAPTER.replace("-", "_") != name:
            raise RuntimeError(f"exercises/{name}.py declares CHAPTER = {module.CHAPTER!r}; "
                               f"the module must be named after its chapter label")
        for n, exercise in enumerate(module.EXERCISES, start=1):
            exercise.id = f"{module.CHAPTER}.{n}"
            registry[exercise.id] = exercise
    return registry


_REGISTRY: dict[str, Exercise] = _load()


def ids(chapter: str | None = None) -> list[str]:
    """All exercise ids, or those of the chapter labelled ``chapter``, in book order."""
    return [i for i in _REGISTRY if chapter is None or i.rpartition(".")[0] == chapter]


def get(exercise_id: str) -> Exercise:
    if exercise_id not in _REGISTRY:
        raise ValueError(f"exercise_id {exercise_id!r} is unknown; ids are '<chapter label>.<n>', "
                         f"one of {list(_REGISTRY)}")
    return _REGISTRY[exercise_id]


def question(exercise_id: str) -> str:
    """The question and the tolerance its checker applies."""
    ex = get(exercise_id)
    given = f" Check it with check({exercise_id!r}, answer, {', '.join(f'{g}=...' for g in ex.given)})." \
        if ex.given else ""
    return f"{ex.question}{given} Tolerance: {ex.grade.tolerance}."


def data(exercise_id: str) -> dict:
    """The inputs of an exercise that talks about given tensors (``ValueError`` for the others)."""
    ex = get(exercise_id)
    if ex.data is None:
        raise ValueError(f"exercise {exercise_id} has no data; everything is in its question")
    return ex.data()


def check(exercise_id: str, answer, **given) -> Verdict:
    """Grade ``answer`` and say why it is wrong. ``None`` = not attempted yet (shows the question)."""
    from .._env import in_book_build

    ex = get(exercise_id)
    if set(given) != set(ex.given):
        need = ", ".join(f"{g}=..." for g in ex.given) or "nothing besides the answer"
        raise ValueError(f"check({exercise_id!r}, answer, ...) needs {need}; got {sorted(given) or 'none'}")
    if answer is None or answer is Ellipsis:
        return Verdict(exercise_id, False, f"Exercise {exercise_id}: {question(exercise_id)}\n"
                                           "Replace None with your answer and run the cell again.")
    correct, hint = ex.grade(answer, ex.expected(**given))
    if correct:
        return Verdict(exercise_id, True, f"Exercise {exercise_id}: correct (tolerance: {ex.grade.tolerance}).")
    verdict = Verdict(exercise_id, False, f"Exercise {exercise_id}: not yet. {hint}".rstrip())
    if in_book_build():
        raise AssertionError(f"a solution in the book is wrong — {verdict.message}")
    return verdict
