"""nn.Linear through a gemmgen launcher: :class:`Linear` (nn.Linear's parameters and state_dict,
its forward a GemmOp of trans nt), :class:`Fp8Linear` (the same layer in FP8 with row-wise or
block scales),
:func:`patch`, which swaps a model's nn.Linear modules for either where a launcher serves them, and
:func:`linear_refusal`, which says why one cannot.
"""

from dataclasses import dataclass, field

import torch

from gemmgen.describe import scaling
from gemmgen.errors import InvalidParameter
from gemmgen.torch.checks import TensorError
from gemmgen.torch.op import GemmOp

_LINEAR_DTYPES = (torch.float16, torch.bfloat16)


def linear_refusal(op: GemmOp, dtype: torch.dtype, has_bias: bool) -> str | None:
    """Why ``op`` cannot compute nn.Linear's forward for a layer of ``dtype`` with a bias
    (``has_bias``) or without one, or None where it can: F.linear(x, weight, bias) is op(x, weight,
    bias=bias) for a one-product launcher of trans nt (weight N x K as stored), no activation, A, B
    and C of the layer's dtype (bf16 or fp16), and a bias per column where the layer has one."""
    v, emit = op.variant, "gemmgen emit ... --trans nt --out"
    if op.precision == "e4m3":
        return fp8_linear_refusal(op, dtype, has_bias)
    if v.batched:
        return f"{op.path.name} is batched (variant {v.text}); nn.Linear needs a launcher of one product per launch"
    if dtype not in _LINEAR_DTYPES:
        return f"the layer is {dtype}; gemmgen.torch.Linear takes torch.bfloat16 or torch.float16 layers"
    if op.dtype != dtype or op.out_dtype != dtype:
        return (f"the layer is {dtype}, and {op.path.name} takes {op.dtype} and writes {op.out_dtype} (variant {v.text}): "
                f"F.linear reads and writes the layer's dtype ({emit} {op.precision} for {op.dtype} layers)")
    if v.trans != "nt":
        return (f"{op.path.name} takes B as trans={v.trans} stores it; nn.Linear keeps its weight N x K "
                f"(trans=nt: {emit} {v.out})")
    return _epilogue_refusal(op, has_bias)


def _epilogue_refusal(op: GemmOp, has_bias: bool) -> str | None:
    """Why ``op``'s epilogue is not nn.Linear's (no activation; a column bias exactly where the
    layer has a bias), or None."""
    v = op.variant
    if v.act != "none":
        return f"{op.path.name} applies {v.act} after the product; nn.Linear applies none (--act none)"
    want = "col" if has_bias else "none"
    if v.bias != want:
        what = "has a bias, one per output feature (--bias col)" if has_bias else "has no bias (--bias none)"
        return f"the layer {what}, and {op.path.name} adds {'none' if v.bias == 'none' else 'one per ' + v.bias}"
    return None


E4M3_MAX = 448.0  # the largest finite float8_e4m3fn


def fp8_linear_refusal(op: GemmOp, dtype: torch.dtype, has_bias: bool) -> str | None:
    """Why ``op`` cannot compute an :class:`Fp8Linear` for a layer of ``dtype`` with a bias
    (``has_bias``) or without one, or None where it can: an e4m3 launcher of trans nt with
    row-wise scales (scale=row) or block scales (scale=block), C of the layer's dtype (bf16 or
    fp16), no activation, and a bias per column where the layer has one."""
    v, emit = op.variant, "gemmgen emit ... --precision e4m3 --trans nt --scale row --out"
    if op.precision != "e4m3" or v.trans != "nt" or v.scale not in ("row", "block") or v.batched:
        return (f"{op.path.name} computes {op.precision} (variant {v.text}); an FP8 Linear takes e4m3 with a weight "
                f"stored N x K and a scale per row of x and per output feature ({emit} bf16), or block scales "
                "(--scale block)")
    if dtype not in _LINEAR_DTYPES or op.out_dtype != dtype:
        return (f"the layer is {dtype}, and {op.path.name} writes {op.out_dtype}: an FP8 Linear gives y in the "
                f"layer's dtype, bf16 or fp16 ({emit} bf16 or fp16)")
    return _epilogue_refusal(op, has_bias)


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, scale): x (rows x K) as float8_e4m3fn rows with a float32 scale each, x[i] ~ scale[i] *
    q[i], scale[i] = max |x[i]| / 448 (so that the row's largest value is e4m3's largest; an all-
    zero row gets scale 1). Rounding is torch's (to nearest)."""
    amax = x.abs().amax(dim=-1).float()
    scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    return (x.float() / scale.unsqueeze(-1)).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn), scale


def _e4m3(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return (x.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def _block_amax_scale(amax: torch.Tensor) -> torch.Tensor:
    return torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))


def quantize_1x128(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, scale): x (rows x K) as float8_e4m3fn with a float32 scale per row and 128 of K (the
    last block may be shorter), as :func:`quantize_rows` does per row: each block's largest
    magnitude becomes 448. scale is (rows, ceil(K/128)) with strides (1, rows): what a
    scale=block launcher (and torch._scaled_mm) takes as scale_a (gemmgen.describe.scaling)."""
    rows, k = x.shape
    kb = scaling.blocks(k)
    padded = torch.nn.functional.pad(x.float(), (0, kb * scaling.BLOCK - k)).view(rows, kb, scaling.BLOCK)
    scale = _block_amax_scale(padded.abs().amax(dim=-1))
    q = _e4m3(padded, scale.unsqueeze(-1)).view(rows, kb * scaling.BLOCK)[:, :k].contiguous()
    return q, scale.t().contiguous().t()


def quantize_128x128(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, scale): w (N x K, a Linear's weight) as float8_e4m3fn with a float32 scale per 128 x
    128 block, each block's largest magnitude becoming 448. scale is (KBP, ceil(N/128)) with
    strides (1, KBP), KBP = ceil(K/128) rounded up to 4 (the padding holds 1): what a scale=block
    launcher (and torch._scaled_mm) takes as scale_b."""
    n, k = w.shape
    nb, kb, kbp = scaling.blocks(n), scaling.blocks(k), scaling.k_blocks_padded(k)
    padded = torch.nn.functional.pad(w.float(), (0, kb * scaling.BLOCK - k, 0, nb * scaling.BLOCK - n))
    blocks = padded.view(nb, scaling.BLOCK, kb, scaling.BLOCK)
    scale = _block_amax_scale(blocks.abs().amax(dim=(1, 3)))  # (nb, kb)
    q = _e4m3(blocks, scale[:, None, :, None]).view(nb * scaling.BLOCK, kb * scaling.BLOCK)[:n, :k].contiguous()
    memory = torch.ones(nb, kbp, dtype=torch.float32, device=w.device)
    memory[:, :kb] = scale
    return q, memory.t()


class Fp8Linear(torch.nn.Module):
    """nn.Linear in FP8 through gemmgen's launcher ``op`` (e4m3, trans nt, scale=row or block, C
    of the layer's dtype, a column bias where the layer has one: :func:`fp8_linear_refusal`):

        y = scale_x[i] * weight_scale[j] * (x_q @ weight.T)[i][j] + bias[j]        (scale=row)

    in one launch, where ``weight`` (out_features x in_features, float8_e4m3fn) and
    ``weight_scale`` (out_features, float32) are the layer's weight quantized row by row once
    (:func:`quantize_rows`, buffers of this module), and x_q, scale_x are x quantized the same way
    at each forward (dynamic row-wise scaling, as torch._scaled_mm's row-wise recipe). With a
    scale=block launcher (DeepSeek-V3's recipe) the weight is quantized in 128 x 128 blocks
    (:func:`quantize_128x128`; ``weight_scale`` is (KBP, ceil(out_features/128))) and x per row
    and 128 features (:func:`quantize_1x128`), each block's scale applied to its part of the sum.
    ``bias`` is the layer's (a buffer, its dtype) or None. x: (..., in_features) of the layer's
    dtype on the weight's device. Inference only; made by :meth:`from_linear`."""

    def __init__(self, weight: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype,
                 op: GemmOp):
        super().__init__()
        why = fp8_linear_refusal(op, dtype, bias is not None) if isinstance(op, GemmOp) else \
            f"op must be a gemmgen.torch.GemmOp (gemmgen.torch.load(...)), not {type(op).__name__}"
        if why is not None:
            raise InvalidParameter(f"cannot make an FP8 Linear: {why}")
        self.out_features, self.in_features = weight.shape
        self.dtype, self.op = dtype, op
        self.register_buffer("weight", weight)
        self.register_buffer("weight_scale", weight_scale)
        self.register_buffer("bias", bias)

    @classmethod
    def from_linear(cls, module: torch.nn.Linear, op: GemmOp) -> "Fp8Linear":
        """``module`` (an nn.Linear of bf16 or fp16 on a CUDA device) with its weight quantized
        to e4m3 row by row, or in 128 x 128 blocks for a scale=block ``op`` (a copy; the bias is
        kept as it is), computed through ``op``. InvalidParameter where ``op`` does not serve it
        (fp8_linear_refusal)."""
        block = isinstance(op, GemmOp) and op.variant.scale == "block"
        with torch.no_grad():
            weight, scale = (quantize_128x128 if block else quantize_rows)(module.weight.detach())
        bias = None if module.bias is None else module.bias.detach()
        return cls(weight, scale, bias, module.weight.dtype, op)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 0 or x.shape[-1] != self.in_features:
            raise TensorError(f"x has shape {tuple(x.shape)}; this Linear takes (..., {self.in_features}): "
                              f"{self.in_features} features in the last dimension")
        if x.dtype != self.dtype:
            raise TensorError(f"x is {x.dtype}; this FP8 Linear takes {self.dtype} (the layer's dtype)")
        quantize = quantize_1x128 if self.op.variant.scale == "block" else quantize_rows
        q, scale = quantize(x.reshape(-1, self.in_features))
        y = self.op(q, self.weight, bias=self.bias, scale_a=scale, scale_b=self.weight_scale)
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"dtype={self.dtype}, op={self.op!r}")


class Linear(torch.nn.Linear):
    """nn.Linear whose forward is gemmgen's launcher ``op``: y = x @ weight.T + bias, bf16 or fp16,
    computed by op(x, weight, bias=bias) with x seen as a (-1, in_features) matrix.

    The parameters are nn.Linear's (``weight`` (out_features, in_features), ``bias``
    (out_features,) or None), so state_dict and load_state_dict match nn.Linear's, both ways; ``op``
    is no parameter or buffer. ``op`` must serve the layer (:func:`linear_refusal`): trans nt, no
    activation, A, B and C of the layer's dtype, a column bias where the layer has a bias and none
    where it has not; InvalidParameter (the reason) otherwise. x: any shape (..., in_features) of
    the layer's dtype on a CUDA device; where its rows are not contiguous it is copied first (as
    F.linear accepts it). Inference only: there is no backward (under torch.no_grad() or
    torch.inference_mode(), or with parameters that do not require grad). torch.compile traces the
    forward to the registered operator, and CUDA graphs capture it (GemmOp)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None, *,
                 op: GemmOp):
        super().__init__(in_features, out_features, bias, device, dtype)
        self._serve(op)

    def _serve(self, op: GemmOp) -> None:
        if not isinstance(op, GemmOp):
            raise InvalidParameter(f"op must be a gemmgen.torch.GemmOp (gemmgen.torch.load(...)), not {type(op).__name__}")
        why = linear_refusal(op, self.weight.dtype, self.bias is not None)
        if why is not None:
            raise InvalidParameter(f"{op.path.name} cannot compute this Linear: {why}")
        self.op = op

    @classmethod
    def from_linear(cls, module: torch.nn.Linear, op: GemmOp) -> "Linear":
        """A Linear computing ``module`` (an nn.Linear) through ``op``, holding the same Parameter
        objects (no copy: tied weights stay tied) and in the same training mode; ``module``'s hooks
        are not carried over. InvalidParameter as the constructor."""
        new = cls.__new__(cls)
        torch.nn.Module.__init__(new)
        new.in_features, new.out_features = module.in_features, module.out_features
        new.weight = module.weight
        if module.bias is None:
            new.register_parameter("bias", None)
        else:
            new.bias = module.bias
        new._serve(op)
        new.train(module.training)
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 0 or x.shape[-1] != self.in_features:
            raise TensorError(f"x has shape {tuple(x.shape)}; this Linear takes (..., {self.in_features}): "
                              f"{self.in_features} features in the last dimension")
        rows = x.reshape(-1, self.in_features)
        if not rows.is_contiguous():
            rows = rows.contiguous()
        return self.op(rows, self.weight, bias=self.bias).view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, op={self.op!r}"


@dataclass
class PatchReport:
    """What :func:`patch` did: ``swapped``, the names (as named_modules gives them) of the
    nn.Linear modules it replaced by gemmgen.torch.Linear; ``left``, name -> why, of those it left.
    ``str()`` lists both."""

    swapped: list[str] = field(default_factory=list)
    left: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        lines = [f"swapped {len(self.swapped)} nn.Linear module(s) for gemmgen.torch.Linear"
                 + (": " + ", ".join(self.swapped) if self.swapped else "")]
        lines.append(f"left {len(self.left)}" + (":" if self.left else ""))
        lines.extend(f"  {name or '(the model)'}: {why}" for name, why in self.left.items())
        return "\n".join(lines)


def patch(model: torch.nn.Module, dispatcher) -> PatchReport:
    """Replace, in place, each nn.Linear module of ``model`` that ``dispatcher`` serves by a
    gemmgen.torch.Linear through it (:meth:`Linear.from_linear`: the same parameters), or by an
    :class:`Fp8Linear` where the launcher is FP8 (its weight quantized, a copy); return the report
    of what was swapped and why the others were left.

    ``dispatcher``: a GemmOp (gemmgen.torch.load of an `emit --dispatch` file, or of one kernel),
    or a sequence of them, where each module takes the first that serves it (e.g. one without and
    one with a column bias). A module is swapped where it is an nn.Linear itself (not a subclass,
    whose forward may differ, nor already a gemmgen Linear), its weight is on a CUDA device, and a
    GemmOp serves its dtype and bias (:func:`linear_refusal` says why not). A module reached under
    several names is swapped once and appears under each. Raises InvalidParameter where
    ``dispatcher`` holds no GemmOp or something else."""
    ops = [dispatcher] if isinstance(dispatcher, GemmOp) else list(dispatcher) if isinstance(dispatcher, (list, tuple)) \
        else None
    if not ops or not all(isinstance(op, GemmOp) for op in ops):
        raise InvalidParameter(f"dispatcher must be a gemmgen.torch.GemmOp (gemmgen.torch.load(...)) or a list of them, "
                               f"not {dispatcher!r}")
    report, made = PatchReport(), {}
    for name, module in list(model.named_modules(remove_duplicate=False)):
        if not isinstance(module, torch.nn.Linear):
            continue
        new = made.get(id(module))
        if new is None:
            why = _unswappable(name, module, ops)
            if isinstance(why, str):
                report.left[name] = why
                continue
            new = made[id(module)] = why
        parent, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent), attr, new)
        report.swapped.append(name)
    return report


def _unswappable(name: str, module: torch.nn.Linear, ops: list[GemmOp]) -> "str | Linear":
    """patch's judgement of one nn.Linear: why it stays (a string), or its gemmgen Linear."""
    if isinstance(module, (Linear, Fp8Linear)):
        return "already a gemmgen.torch.Linear"
    if type(module) is not torch.nn.Linear:
        return f"a subclass of nn.Linear ({type(module).__name__}), whose forward may not be F.linear's"
    if name == "":
        return "the model itself is an nn.Linear, which patch cannot replace in place: use Linear.from_linear(model, op)"
    if module.weight.device.type != "cuda":
        return f"its weight is on {module.weight.device}; gemmgen kernels run on CUDA devices: move the model first"
    whys = []
    for op in ops:
        why = linear_refusal(op, module.weight.dtype, module.bias is not None)
        if why is None:
            return (Fp8Linear if op.precision == "e4m3" else Linear).from_linear(module, op)
        whys.append(why)
    return "; ".join(dict.fromkeys(whys))
