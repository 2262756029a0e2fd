# SPDX-License-Identifier: MIT
"""The instruction-level primitives of design §0 and §3.1, in PyTorch.

Mirror of ``src/kda/numerics.cuh``. fp32 ``add/mul/fma`` flush subnormal inputs and
results (FTZ) and round once (the FMA is emulated exactly: an fp64 sum made
round-to-odd, then rounded to fp32). 16-bit arithmetic is an exact fp32 operation
rounded once. The approximate instructions (``ex2.approx``, ``tanh.approx``,
``rsqrt.approx``) and the tensor-core products (MMA32, MMA16) come from :class:`Ops`:
on a GPU whose arch table the library has, :class:`Ops` runs the library's
single-instruction probes and is bit-exact; elsewhere it uses exact math (fp64, rounded
once), which is what the CPU reference and the pure-PyTorch fallback use.
"""

import torch

from . import _native

LOG2E = 1.4426950408889634  # log2(e) as a double
LOG2E_F = 1.44269502162933349609375  # fp32(log2 e), 0x3FB8AA3B
_TINY = 2.0**-126  # smallest normal fp32


def ftz(x: torch.Tensor) -> torch.Tensor:
    """Flush fp32 subnormals to a zero of the same sign."""
    return torch.where(x.abs() < _TINY, x * 0.0, x)


def add_ftz(a, b):
    return ftz(ftz(a) + ftz(b))


def mul_ftz(a, b):
    return ftz(ftz(a) * ftz(b))


def _fma_exact(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """fp32 ``a * b + c`` with one rounding. The fp64 product is exact; the fp64 sum is
    made round-to-odd with its TwoSum error, so the final fp32 rounding is correct."""
    p = a.double() * b.double()
    cd = c.double()
    s = p + cd
    bb = s - p
    err = (p - (s - bb)) + (cd - bb)
    even = (s.view(torch.int64) & 1) == 0
    toward = torch.where(err > 0, torch.full_like(s, float("inf")), torch.full_like(s, float("-inf")))
    s = torch.where((err != 0) & even, torch.nextafter(s, toward), s)
    return s.float()


def fma_ftz(a, b, c):
    return ftz(_fma_exact(ftz(a), ftz(b), ftz(c)))


def max_num(a: torch.Tensor, b) -> torch.Tensor:
    """fp32 max where a NaN operand gives the other (max.f32, IEEE maxNum)."""
    return torch.fmax(a, torch.as_tensor(b, dtype=a.dtype, device=a.device))


def min_num(a: torch.Tensor, b) -> torch.Tensor:
    """fp32 min where a NaN operand gives the other (min.f32, IEEE minNum)."""
    return torch.fmin(a, torch.as_tensor(b, dtype=a.dtype, device=a.device))


def bf(x: torch.Tensor) -> torch.Tensor:
    """fp32 -> bf16, round to nearest even."""
    return x.to(torch.bfloat16)


def hf(x: torch.Tensor) -> torch.Tensor:
    """fp32 -> fp16, round to nearest even."""
    return x.to(torch.float16)


def bmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a (*) b``: bf16 product, exact in fp32, rounded once (design §0)."""
    return bf(a.float() * b.float())


def hadd(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a (+h) b``: fp16 sum rounded once (the fp32 sum of two fp16 rounds the same)."""
    return hf(a.float() + b.float())


class Ops:
    """The approximate instructions and tensor-core products for tensors on ``device``:
    the library's probes when ``probes`` and the GPU has them, else exact math (which never
    loads the library)."""

    def __init__(self, device: torch.device, probes: bool = True):
        self.device = torch.device(device)
        self._lib, self._cc = None, None
        if probes and self.device.type == "cuda":
            lib = _native.load()
            major, minor = torch.cuda.get_device_capability(self.device)
            cc = 10 * major + minor
            if lib is not None and lib.table_for(cc, _native.FEATURE_PROBES) is not None:
                self._lib, self._cc = lib, cc

    @property
    def exact_instructions(self) -> bool:
        """True when the GPU's own approximate instructions are used (bitwise oracle)."""
        return self._lib is not None

    def _stream(self) -> int:
        return torch.cuda.current_stream(self.device).cuda_stream

    def _unary(self, op: int, x: torch.Tensor, exact) -> torch.Tensor:
        x = x.float().contiguous()
        if self._lib is None:
            return exact(x)
        y = torch.empty_like(x)
        with torch.cuda.device(self.device):
            self._lib.probe_unary(self._cc, op, x.data_ptr(), y.data_ptr(), x.numel(), self._stream())
        return y

    def ex2(self, x):
        """EX2 = ex2.approx.ftz.f32 (exact: 2**x in fp64, rounded, flushed)."""
        return self._unary(_native.PROBE_EX2, x, lambda t: ftz(torch.exp2(ftz(t).double()).float()))

    def sigmoid(self, x):
        """sig(x) = fma(TANH(x * 0.5), 0.5, 0.5) (exact: the logistic function)."""
        return self._unary(_native.PROBE_SIGMOID, x, lambda t: torch.sigmoid(ftz(t).double()).float())

    def rsqrt(self, x):
        """RSQ = rsqrt.approx.ftz.f32 (exact: 1 / sqrt(x) in fp64, rounded)."""
        return self._unary(_native.PROBE_RSQRT, x, lambda t: ftz(torch.rsqrt(ftz(t).double()).float()))

    def lg2(self, x):
        """LG2 = lg2.approx.ftz.f32 (exact: log2(x) in fp64, rounded, flushed)."""
        return self._unary(_native.PROBE_LG2, x, lambda t: ftz(torch.log2(ftz(t).double()).float()))

    def _mma(self, op: int, a: torch.Tensor, b: torch.Tensor, out_dtype) -> torch.Tensor:
        *lead, m, k = a.shape
        n = b.shape[-2]
        if self._lib is None:
            return torch.matmul(a.double(), b.double().transpose(-1, -2)).to(out_dtype)
        a3 = a.contiguous().reshape(-1, m, k)
        b3 = b.contiguous().reshape(-1, n, k)
        c = torch.empty(a3.shape[0], m, n, dtype=out_dtype, device=a.device)
        with torch.cuda.device(self.device):
            self._lib.probe_mma(
                self._cc, op, a3.data_ptr(), b3.data_ptr(), c.data_ptr(), a3.shape[0], m, n, k, self._stream()
            )
        return c.reshape(*lead, m, n)

    def mma32(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """MMA32 ("TN"): ``C[..., i, j] = sum_k a[..., i, k] b[..., j, k]``, bf16 in, fp32 out,
        m16n8k16 tiles accumulated over k-blocks in ascending order."""
        return self._mma(_native.PROBE_MMA_BF16_F32, a, b, torch.float32)

    def mma16(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """MMA16: the product ``x @ y`` of fp16 16x16 matrices with an fp16 accumulator."""
        return self._mma(_native.PROBE_MMA_F16_F16, x, y.transpose(-1, -2), torch.float16)
