"""The Triton ragged-decode kernel against its torch contract and a float64 brute force.

Without a GPU the kernel runs in the Triton interpreter, which must be switched on before triton is first imported
(as in ``tests/test_kernels.py``): this module sets ``TRITON_INTERPRET=1`` when there is no CUDA; when an earlier test
module already imported triton, the in-process cases skip and ``test_cases_under_interpreter_subprocess`` reruns
this file in a fresh process. On a CUDA machine the same cases run compiled on the GPU; ``test_kernel_compiles_for_
hopper`` lowers the kernel to a sm_90 cubin without a GPU (catches interpreter-only code).
"""
import os

import torch  # noqa: E402 (torch does not import triton)

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import math  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

triton = pytest.importorskip("triton", reason="triton is not installed: the ragged-decode kernel cannot be tested")

from jacap_lib.cache.triton import ragged_decode_torch, triton_ragged_decode  # noqa: E402
from jacap_lib.scoring.triton.launch import interpreter_active  # noqa: E402

INTERPRETED = interpreter_active()
DEVICE = "cpu" if INTERPRETED else ("cuda" if torch.cuda.is_available() else None)
needs_kernel = pytest.mark.skipif(
    DEVICE is None, reason="triton was imported before TRITON_INTERPRET=1 was set and there is no GPU; "
    "test_cases_under_interpreter_subprocess runs these cases in a fresh process")
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="compiled-kernel case: needs a CUDA GPU")


def packed_case(lengths, d, dv, G, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor(lengths)
    T = int(lengths.sum())
    keys, values = torch.randn(T, d, generator=g), torch.randn(T, dv, generator=g)
    query = torch.randn(lengths.numel() * G, d, generator=g)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    return query.to(dtype), keys.to(dtype), values.to(dtype), offsets


def brute_force(query, keys, values, offsets, scale, G):
    out = torch.zeros(query.shape[0], values.shape[1], dtype=torch.float64)
    lse = torch.full((query.shape[0],), -math.inf, dtype=torch.float64)
    for p in range(query.shape[0]):
        a, b = int(offsets[p // G]), int(offsets[p // G + 1])
        if b > a:
            s = (keys[a:b].double() @ query[p].double()) * scale
            lse[p] = torch.logsumexp(s, 0)
            out[p] = torch.softmax(s, 0) @ values[a:b].double()
    return out, lse


CASES = [  # (per-head lengths, d, d_v, G): empty heads, a head shorter than a tile, several tiles, d not a power of 2
    ([5, 0, 130, 64], 16, 16, 3),
    ([1, 77], 64, 64, 1),
    ([200, 3, 0], 24, 40, 2),
]


@needs_kernel
@pytest.mark.parametrize("lengths,d,dv,G", CASES)
def test_kernel_equals_torch_and_brute_force(lengths, d, dv, G):
    query, keys, values, offsets = packed_case(lengths, d, dv, G, seed=len(lengths) + d)
    dev = DEVICE
    scale = d ** -0.5
    out, lse = triton_ragged_decode(query.to(dev), keys.to(dev), values.to(dev), offsets.to(dev), scale, block_n=32)
    ref_out, ref_lse = ragged_decode_torch(query, keys, values, offsets, scale)
    want_out, want_lse = brute_force(query, keys, values, offsets, scale, G)
    torch.testing.assert_close(out.cpu().double(), want_out, atol=1e-5, rtol=0)
    torch.testing.assert_close(ref_out.double(), want_out, atol=1e-5, rtol=0)
    finite = torch.isfinite(want_lse)
    assert torch.equal(torch.isfinite(lse.cpu()), finite) and torch.equal(torch.isfinite(ref_lse), finite)
    torch.testing.assert_close(lse.cpu().double()[finite], want_lse[finite], atol=1e-5, rtol=0)
    assert (out.cpu()[~finite] == 0).all()  # a head with no kept entry: output 0, lse -inf


@needs_kernel
def test_kernel_reads_bf16_and_accumulates_in_float32():
    query, keys, values, offsets = packed_case([40, 9], 32, 32, 2, seed=3, dtype=torch.bfloat16)
    out, lse = triton_ragged_decode(query.to(DEVICE), keys.to(DEVICE), values.to(DEVICE), offsets.to(DEVICE), 0.2)
    want_out, want_lse = brute_force(query, keys, values, offsets, 0.2, 2)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.cpu().double(), want_out, atol=1e-4, rtol=0)
    torch.testing.assert_close(lse.cpu().double(), want_lse, atol=1e-4, rtol=0)


@needs_kernel
def test_ragged_attention_decode_path_equals_the_torch_loop():
    """The attention's one-token path with the kernel for the packed part equals its per-head torch loop."""
    from jacap_lib.cache import RaggedLayer
    from jacap_lib.cache.attention import ragged_attention_torch

    g = torch.Generator().manual_seed(5)
    keys, values = torch.randn(2, 3, 50, 16, generator=g), torch.randn(2, 3, 50, 16, generator=g)
    keep = torch.rand(2, 3, 50, generator=g) < 0.4
    keep[1, 2] = False
    layer = RaggedLayer.from_dense(keys.to(DEVICE), values.to(DEVICE), keep.to(DEVICE))
    layer.update(torch.randn(2, 3, 3, 16, generator=g).to(DEVICE), torch.randn(2, 3, 3, 16, generator=g).to(DEVICE))
    k, v = layer.update(torch.randn(2, 3, 1, 16, generator=g).to(DEVICE),
                        torch.randn(2, 3, 1, 16, generator=g).to(DEVICE))
    query = torch.randn(2, 6, 1, 16, generator=g).to(DEVICE)
    loop = ragged_attention_torch(query, k, v, 0.25)
    kernel = ragged_attention_torch(query, k, v, 0.25,
                                    decode_kernel=lambda *a: triton_ragged_decode(*a, block_n=16))
    torch.testing.assert_close(kernel, loop, atol=1e-5, rtol=0)


def test_bad_shapes_are_refused():
    query, keys, values, offsets = packed_case([3, 4], 8, 8, 2, seed=0)
    with pytest.raises(ValueError, match="multiple of the heads"):
        ragged_decode_torch(query[:3], keys, values, offsets, 1.0)
    with pytest.raises(ValueError, match="must be"):
        ragged_decode_torch(query[None], keys, values, offsets, 1.0)


@needs_gpu
def test_compiled_kernel_on_gpu_long_heads():
    query, keys, values, offsets = packed_case([4096, 1, 3000], 128, 128, 4, seed=9)
    out, lse = triton_ragged_decode(query.cuda(), keys.cuda(), values.cuda(), offsets.cuda(), 128 ** -0.5)
    want_out, want_lse = brute_force(query, keys, values, offsets, 128 ** -0.5, 4)
    torch.testing.assert_close(out.cpu().double(), want_out, atol=1e-5, rtol=0)


@pytest.mark.skipif(INTERPRETED or DEVICE == "cuda", reason="the cases already run in this process")
def test_cases_under_interpreter_subprocess():
    """Run this file in a fresh process with TRITON_INTERPRET=1 set before triton is imported."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__], env=env,
                          capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1], timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and " skipped" in proc.stdout


SM90_COMPILE = r"""
import inspect, triton
from triton.compiler import ASTSource
from triton.backends.compiler import GPUTarget
from jacap_lib.cache._triton_kernel import ragged_decode_kernel as fn
const = dict(G=4, D=128, DV=128, BLOCK_N=64, BLOCK_D=128, BLOCK_DV=128)
ptr = {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "OFF": "*i64", "O": "*fp32", "LSE": "*fp32"}
sig = {n: "constexpr" if n in const else ptr.get(n, "fp32") for n in inspect.signature(fn).parameters}
k = triton.compile(ASTSource(triton.jit(fn), sig, const), target=GPUTarget("cuda", 90, 32))
assert k.asm["cubin"]
print("compiled")
"""


def test_kernel_compiles_for_hopper():
    """The kernel lowers to PTX and a cubin for sm_90 (no GPU needed)."""
    pytest.importorskip("triton.backends.nvidia", reason="triton has no NVIDIA backend here")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", SM90_COMPILE], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "compiled" in proc.stdout, proc.stderr[-3000:]
