"""Autograded exercises of the theory chapters.

    from jacap_lib import exercises
    exercises.check("01.1", my_matrix)      # prints a verdict and a hint; returns a CheckResult
    exercises.data("01.3")                  # the inputs an exercise talks about

Every expected answer is computed here from :mod:`jacap_lib.theory` / :mod:`jacap_lib.scoring`
(never typed in). Wrong answers that match a common slip (a missing factor 2, ½ or 1/√d,
query heads instead of KV heads, GB instead of GiB, ...) get a message naming the slip.

``None`` means "not attempted" and only prints the question. In the book build
(``JACAP_BOOK_BUILD`` set), any other wrong answer raises ``AssertionError``: the solutions
run in the build, so a solution that stops being right fails the build.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from jacap_lib import theory as T
from jacap_lib._env import in_book_build
from jacap_lib import examples as EX
from jacap_lib import memory as MEM

__all__ = ["check", "data", "question", "EXERCISES", "CheckResult"]


@dataclass
class CheckResult:
    exercise: str
    correct: bool
    message: str

    def __bool__(self):
        return self.correct

    def __repr__(self):
        return self.message

    _repr_pretty_ = lambda self, p, cycle: p.text(self.message)  # noqa: E731


@dataclass
class Exercise:
    question: str
    expected: Callable[[], object]
    grade: Callable[[object, object], tuple]  # (answer, expected) -> (correct, hint)
    data: Callable[[], dict] | None = None


def _t(x):
    return torch.as_tensor(x, dtype=torch.float64)


def _close(a, b, rtol=1e-6, atol=1e-9) -> bool:
    a, b = _t(a), _t(b)
    return a.shape == b.shape and bool(torch.allclose(a, b, rtol=rtol, atol=atol))


def _number(answer) -> float:
    try:
        return float(answer)
    except (TypeError, ValueError):
        raise ValueError(f"answer must be a number, got {type(answer).__name__}: {answer!r}") from None


def _grade_number(slips: dict, rtol: float = 1e-4):
    """Grade a scalar; ``slips`` maps a factor f to a hint shown when answer ≈ f * expected."""

    def grade(answer, expected):
        a = _number(answer)
        if math.isclose(a, expected, rel_tol=rtol, abs_tol=1e-9):
            return True, ""
        for factor, hint in slips.items():
            if math.isclose(a, factor * expected, rel_tol=max(rtol, 1e-3)):
                return False, hint
        return False, f"{a:.6g} is off by a factor {a / expected:.4g} if expected is nonzero." if expected else ""

    return grade


# ----------------------------------------------------------------------------- chapter 00
_SMOL = dict(layers=30, kv_heads=3, head_dim=64)  # bundled SmolLM2-135M (tests read it from the GGUF header)
_LLAMA8 = MEM.MODEL_KV_CONFIGS["Llama-3.1-8B"]
_LLAMA70 = MEM.MODEL_KV_CONFIGS["Llama-3.1-70B"]


def _e001():
    return MEM.kv_cache_bytes(_LLAMA8["layers"], 1, _LLAMA8["kv_heads"], 131072, _LLAMA8["head_dim"], 2) / MEM.GIB


def _e002():
    per_token = MEM.kv_cache_bytes(_SMOL["layers"], 1, _SMOL["kv_heads"], 1, _SMOL["head_dim"], 2)
    return math.floor(MEM.GIB / per_token)


def _grade_e002(answer, expected):
    a = _number(answer)
    if a == expected:
        return True, ""
    if math.isclose(a, expected, rel_tol=1e-3):
        return False, "Close: round *down* — a partial token does not fit."
    if math.isclose(a, expected * 2, rel_tol=1e-3):
        return False, "Twice too many: each token stores a key AND a value (the factor 2)."
    if math.isclose(a, expected / 3, rel_tol=1e-3):
        return False, "Three times too few: use the 3 KV heads, not the 9 query heads (GQA shares KV heads)."
    if math.isclose(a, expected * 1e9 / MEM.GIB, rel_tol=1e-3):
        return False, "You used 1 GB = 10^9 bytes; the question asks for 1 GiB = 2^30 bytes."
    return False, "Bytes per token = 2 * L * H_kv * d_h * s; divide 2^30 by it and round down."


def _e003():
    kept = MEM.kept_tokens(131072, 0.9)
    return MEM.kv_cache_bytes(_LLAMA70["layers"], 1, _LLAMA70["kv_heads"], kept, _LLAMA70["head_dim"], 2) / MEM.GIB


# ----------------------------------------------------------------------------- chapter 01
_ALPHA_011 = (0.7, 0.2, 0.1)


def _grade_e011(answer, expected):
    a = _t(answer)
    if a.shape != expected.shape:
        return False, f"S is n x n = {tuple(expected.shape)} for n = 3 probabilities; got shape {tuple(a.shape)}."
    if _close(a, expected):
        return True, ""
    alpha = _t(_ALPHA_011)
    if _close(a, torch.diag(alpha)):
        return False, "That is Diag(alpha) alone: subtract the outer product alpha alpha^T (competition)."
    if _close(a, torch.diag(alpha) + torch.outer(alpha, alpha)):
        return False, "Sign slip: S = Diag(alpha) - alpha alpha^T (the off-diagonal entries are negative)."
    if not _close(a.sum(-1), torch.zeros(3), atol=1e-6):
        return False, "Each row of S must sum to 0 (S·1 = 0: adding a constant to every logit changes nothing)."
    return False, "Diagonal entries are alpha_i (1 - alpha_i); off-diagonal ones are -alpha_i alpha_j."


def _grade_e012(answer, expected):
    try:
        a_star, r_max = (float(v) for v in answer)
    except (TypeError, ValueError):
        raise ValueError("answer must be a pair (alpha_star, rho_max)") from None
    ok_a, ok_r = math.isclose(a_star, expected[0], abs_tol=1e-6), math.isclose(r_max, expected[1], abs_tol=1e-6)
    if ok_a and ok_r:
        return True, ""
    if ok_a:
        return False, "Right alpha; now evaluate alpha (1 - alpha) there."
    return False, "Set the derivative of alpha (1 - alpha) to zero: 1 - 2 alpha = 0."


def _data_e013():
    g = torch.Generator().manual_seed(13)
    return dict(K=torch.randn(4, 3, generator=g, dtype=torch.float64),
                U=torch.randn(2, 4, generator=g, dtype=torch.float64),
                mu=torch.randn(3, generator=g, dtype=torch.float64))


def _e013():
    d = _data_e013()
    return T.attention_jacobian(d["K"], d["U"], d["mu"])


def _grade_e013(answer, expected):
    a = _t(answer)
    if a.shape == expected.shape[::-1] and _close(a.T, expected):
        return False, "Transposed: J maps a query perturbation (d,) to an output change (d_out,), so J is (d_out, d)."
    if a.shape != expected.shape:
        return False, f"J must have shape (d_out, d) = {tuple(expected.shape)}; got {tuple(a.shape)}."
    if _close(a, expected):
        return True, ""
    d = _data_e013()
    if _close(a, expected * math.sqrt(d["K"].shape[-1])):
        return False, "Off by sqrt(d): the logits are K q / sqrt(d), so dz/dq = K / sqrt(d)."
    alpha = torch.softmax(d["K"] @ d["mu"] / math.sqrt(3), 0)
    if _close(a, d["U"] @ torch.diag(alpha) @ d["K"] / math.sqrt(3)):
        return False, "You used Diag(alpha) for dalpha/dz; the softmax Jacobian also has -alpha alpha^T."
    return False, "Chain rule: J = U S K / sqrt(d) with S at alpha = softmax(K mu / sqrt(d)). Check with torch.autograd."


# ----------------------------------------------------------------------------- chapter 02
def _e021():
    evals = lambda *v: T.capacity_from_eigenvalues(_t(v))  # noqa: E731
    return float(evals(5.0, 5.0) - evals(10.0, 0.0))


def _data_e022():
    return dict(A=_t([[2.0, 0.5], [0.5, 1.0]]), w=0.8, u=_t([1.0, -2.0]))


def _e022():
    d = _data_e022()
    A1 = d["A"] + d["w"] * torch.outer(d["u"], d["u"])
    return float(torch.logdet(A1) - torch.logdet(d["A"]))


def _grade_e022(answer, expected):
    a = _number(answer)
    if math.isclose(a, expected, rel_tol=1e-6):
        return True, ""
    if math.isclose(a, math.expm1(expected), rel_tol=1e-6):
        return False, "That is w u^T A^-1 u; the log-det gain is log(1 + w u^T A^-1 u)."
    d = _data_e022()
    if math.isclose(a, math.log1p(d["w"] * float(d["u"] @ d["A"] @ d["u"])), rel_tol=1e-6):
        return False, "Use the inverse: the lemma has u^T A^-1 u, not u^T A u."
    if math.isclose(a, expected / 2, rel_tol=1e-6):
        return False, "The question asks for the change of log det itself (no factor 1/2)."
    return False, "Matrix determinant lemma: det(A + w u u^T) = det(A) (1 + w u^T A^-1 u)."


def _e023():
    return float(T.capacity_from_eigenvalues(_t([5.0 / 4.0, 5.0 / 4.0])))


def _grade_e023(answer, expected):
    a = _number(answer)
    if math.isclose(a, expected, rel_tol=1e-6):
        return True, ""
    if math.isclose(a, float(T.capacity_from_eigenvalues(_t([2.5, 2.5]))), rel_tol=1e-6):
        return False, "You divided by sigma = 2; the whitened eigenvalues are lambda / sigma^2 = lambda / 4."
    if math.isclose(a, 2 * expected, rel_tol=1e-6):
        return False, "Missing the factor 1/2 in front of log det."
    if math.isclose(a, float(T.capacity_from_eigenvalues(_t([5.0, 5.0]))), rel_tol=1e-6):
        return False, "That is the sigma^2 = 1 capacity; divide the eigenvalues by sigma^2 = 4 first."
    return False, "Capacity = 1/2 sum log(1 + lambda_l / sigma^2) with lambda = (5, 5), sigma^2 = 4."


# ----------------------------------------------------------------------------- chapter 03
def _e031():
    return EX.leverage_example(EX.NOTE_U, EX.NOTE_W).score


def _grade_e031(answer, expected):
    a = _t(answer).flatten()
    if a.shape != expected.shape:
        return False, f"Give one score per direction: {expected.shape[0]} numbers."
    if _close(a, expected, rtol=1e-4):
        return True, ""
    ex = EX.leverage_example(EX.NOTE_U, EX.NOTE_W)
    if _close(a, ex.leverage, rtol=1e-4):
        return False, "Those are the leverages u_i^T A^-1 u_i; the score multiplies them by w_i."
    if _close(a, ex.weight, rtol=1e-4):
        return False, "Those are the weights alone: the score is w_i u_i^T A^-1 u_i with A = I + sum_j w_j u_j u_j^T."
    u, w = _t(EX.NOTE_U), _t(EX.NOTE_W)
    if _close(a, w * (u * u).sum(-1), rtol=1e-4):
        return False, "You used A = I (no inverse of the full Gram matrix); include sum_j w_j u_j u_j^T in A."
    return False, "Build A = I + sum_j w_j u_j u_j^T (2 x 2), then r_i = w_i u_i^T A^-1 u_i."


def _grade_e032(answer, expected):
    try:
        a = sorted(int(i) for i in answer)
    except (TypeError, ValueError):
        raise ValueError("answer must be the 1-based indices of the kept directions, e.g. {1, 2}") from None
    if a == expected:
        return True, ""
    if a == [1, 2]:
        return False, "{1, 2} has the largest weights but u1 and u2 nearly coincide: compare the log-dets."
    if a == [0, 2]:
        return False, "Use 1-based indices (u1, u2, u3)."
    return False, "Compute 1/2 log det(I + sum_{i in C} w_i u_i u_i^T) for each of the 3 pairs."


def _e032():
    return sorted(i + 1 for i in EX.leverage_example(EX.NOTE_U, EX.NOTE_W).exhaustive)


def _e033():
    """Smallest w3 with r_3 > r_2 (bisection on the score difference, which grows with w3)."""

    def gap(w3):
        s = EX.leverage_example(EX.NOTE_U, (1.0, 1.0, w3)).score
        return float(s[2] - s[1])

    lo, hi = 1e-6, 2.0
    if not gap(lo) < 0 < gap(hi):
        raise RuntimeError("exercise 03.3: the score gap does not change sign on (0, 2]")
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if gap(mid) < 0 else (lo, mid)
    return 0.5 * (lo + hi)


def _grade_e033(answer, expected):
    a = _number(answer)
    if math.isclose(a, expected, abs_tol=1e-3):
        return True, ""
    if a >= 1.0:
        return False, "Too large: u3 already wins at w3 = 0.7 < 1, because u2's leverage is diluted by u1."
    s = EX.leverage_example(EX.NOTE_U, (1.0, 1.0, a)).score
    side = "still below" if s[2] < s[1] else "already above"
    return False, f"At w3 = {a:.4g}, r_3 = {float(s[2]):.4f} is {side} r_2 = {float(s[1]):.4f}; bisect between 0 and 0.7."


EXERCISES: dict[str, Exercise] = {
    "00.1": Exercise(
        "KV cache (GiB, 1 GiB = 2^30 bytes) of Llama-3.1-8B (32 layers, 8 KV heads, head_dim 128) "
        "for one sequence of 131072 tokens in bf16.",
        _e001,
        _grade_number({0.5: "Half the answer: keys AND values are cached (the factor 2).",
                       4.0: "Four times too big: use the 8 KV heads, not the 32 query heads (GQA).",
                       8.0: "Eight times too big: s counts bytes (bf16 = 2 bytes), not bits.",
                       2**30 / 1e9: "You divided by 10^9 (GB); the question asks for GiB = 2^30 bytes.",
                       2.0: "Twice too big: bf16 is 2 bytes per scalar (or did you double the factor 2?)."})),
    "00.2": Exercise(
        "How many tokens of one sequence fit in 1 GiB of KV cache for the bundled SmolLM2-135M "
        "(30 layers, 3 KV heads, head_dim 64) in fp16? (an integer)",
        _e002, _grade_e002),
    "00.3": Exercise(
        "Llama-3.1-70B (80 layers, 8 KV heads, head_dim 128), bf16, 131072 tokens, compression ratio "
        "c = 0.9 (B = round((1 - c) N) tokens kept): how many GiB does the cache take after eviction?",
        _e003,
        _grade_number({9.0: "c is the fraction *removed*: 90% of 131072 tokens go, 10% stay.",
                       10.0: "That is the uncompressed cache; apply B = (1 - c) N.",
                       0.5: "Half: keys AND values (the factor 2)."}, rtol=1e-3)),
    "01.1": Exercise(
        "The softmax Jacobian S = dalpha/dz at alpha = (0.7, 0.2, 0.1), as a 3 x 3 matrix.",
        lambda: T.softmax_jacobian(_t(_ALPHA_011)), _grade_e011),
    "01.2": Exercise(
        "The probability alpha* where the sensitivity rho = alpha (1 - alpha) is largest, and that largest "
        "value: a pair (alpha_star, rho_max).",
        lambda: (0.5, float(T.softmax_jacobian(_t([0.5, 0.5]))[0, 0])), _grade_e012),
    "01.3": Exercise(
        "For K, U, mu = exercises.data('01.3') (K (4, 3), U (2, 4), mu (3,)), the Jacobian of "
        "f(q) = U softmax(K q / sqrt(d)) at q = mu (shape (2, 3)).",
        _e013, _grade_e013, _data_e013),
    "02.1": Exercise(
        "Capacity (1/2 sum log(1 + lambda)) of eigenvalues (5, 5) minus that of (10, 0), in nats.",
        _e021,
        _grade_number({2.0: "Twice the answer: the capacity has a factor 1/2 in front of log det.",
                       -1.0: "Sign: (5, 5) has the LARGER capacity — subtract (10, 0) from it."})),
    "02.2": Exercise(
        "For A, w, u = exercises.data('02.2'): log det(A + w u u^T) - log det(A).",
        _e022, _grade_e022, _data_e022),
    "02.3": Exercise(
        "Capacity of a channel with whitened-before-noise eigenvalues lambda = (5, 5) under isotropic "
        "noise Sigma = sigma^2 I with sigma = 2.",
        _e023, _grade_e023),
    "03.1": Exercise(
        "The Jacap scores r_i = w_i u_i^T A^-1 u_i of the note's example u1 = (1, 0), u2 = (0.95, 0.05), "
        "u3 = (0, 1), w = (1, 1, 0.7), A = I + sum_j w_j u_j u_j^T (three numbers).",
        _e031, _grade_e031),
    "03.2": Exercise(
        "Budget 2: which pair of directions has the largest capacity 1/2 log det(I + sum_{i in C} w_i u_i u_i^T)? "
        "Answer with 1-based indices, e.g. {1, 2}.",
        _e032, _grade_e032),
    "03.3": Exercise(
        "Keep u and w1 = w2 = 1. Find (to 1e-3) the weight w3 at which u3's score equals u2's score.",
        _e033, _grade_e033),
}


def _get(exercise_id: str) -> Exercise:
    if exercise_id not in EXERCISES:
        raise ValueError(f"exercise_id {exercise_id!r} is unknown; choose one of {sorted(EXERCISES)}")
    return EXERCISES[exercise_id]


def question(exercise_id: str) -> str:
    return _get(exercise_id).question


def data(exercise_id: str) -> dict:
    """The inputs of an exercise that talks about given tensors (``ValueError`` for the others)."""
    ex = _get(exercise_id)
    if ex.data is None:
        raise ValueError(f"exercise {exercise_id} has no data; everything is in its question")
    return ex.data()


def check(exercise_id: str, answer) -> CheckResult:
    """Grade ``answer`` and say why it is wrong. ``None`` = not attempted yet."""
    ex = _get(exercise_id)
    if answer is None or answer is Ellipsis:
        return CheckResult(exercise_id, False, f"Exercise {exercise_id}: {ex.question}\n"
                                               "Replace None with your answer and run the cell again.")
    correct, hint = ex.grade(answer, ex.expected())
    if correct:
        result = CheckResult(exercise_id, True, f"Exercise {exercise_id}: correct.")
    else:
        result = CheckResult(exercise_id, False, f"Exercise {exercise_id}: not yet. {hint}".rstrip())
        if in_book_build():
            raise AssertionError(f"a solution in the book is wrong — {result.message}")
    return result
