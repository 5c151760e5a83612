"""gemmgen kernels called on PyTorch tensors (the extra ``torch``), a stage of its own after tune:
``gemmgen.torch.load`` builds or loads an emitted file and returns a GemmOp that calls its
launcher on torch's current stream, registered as the operators ``torch.ops.gemmgen.gemm`` and
``gemm_out`` (torch.compile, CUDA graphs); ``Linear`` and ``patch`` put launchers under a model's
nn.Linear layers. ``checks`` holds the rules for tensors and targets on plain values and imports no
torch; the public names below are loaded from ``op`` and ``modules`` on first use, so that importing
gemmgen.torch.checks needs no PyTorch (and the operators are registered by then: every call
goes through ``load`` or a GemmOp first).
"""

import importlib

# Each public name and the module of this package that defines it.
_HOMES = {**dict.fromkeys(("BatchedGemmOp", "BuildFailed", "GemmOp", "NotCapturable", "load"), "op"),
          **dict.fromkeys(("Fp8Linear", "Linear", "PatchReport", "linear_refusal", "patch", "quantize_1x128",
                           "quantize_128x128", "quantize_rows"), "modules"),
          "TensorError": "checks"}

__all__ = sorted(_HOMES)


def __getattr__(name: str):
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'gemmgen.torch' has no attribute {name!r}")
    try:
        module = importlib.import_module(f"gemmgen.torch.{home}")
    except ModuleNotFoundError as err:
        if err.name != "torch":
            raise
        raise ModuleNotFoundError(f"gemmgen.torch.{name} needs PyTorch: pip install 'gemmgen[torch]'",
                                  name="torch") from None
    value = globals()[name] = getattr(module, name)
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
