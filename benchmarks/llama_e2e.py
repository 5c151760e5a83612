"""Issue 30, item 5, end to end: a transformers LlamaForCausalLM of Llama-3-8B's published config
(random weights from --seed, bf16, sdpa attention; no download), stock against a twin that shares
every parameter and has its nn.Linear modules swapped by gemmgen.torch.patch for the dispatchers
given (`gemmgen emit --dispatch --workload workloads/llama3-8b-linear.toml ...`, trans nt, bf16 out;
a second one with --bias col is taken too, though Llama's layers have no bias). That workload tunes
the fused qkv_proj (N = 6144) and gate_up_proj (28672); transformers' Llama runs q, k, v, gate and
up apart (N = 4096, 1024, 1024, 14336, 14336) and lm_head (128256 x 4096), which a dispatcher
serves with the kernels of the nearest tuned shape: --json lists its choice per layer and M.

Checks, exit 1 where one fails: the twin's logits against the stock model's, eager (every position
of a --check batch) and compiled (the logits of every timed call below): the relative Frobenius
error ||patched - stock|| / ||stock|| at most --tol in each, and the argmax agreement, over all
rows of a group, at least --min-argmax. bf16 rounding through the layers decides both, so the
stock model compiled against itself eager is printed beside them as the scale of that noise. Each
decode graph is replayed twice more and must give its logits again, within --tol (the step
must not move the cache's write position).

Timings, each model under torch.compile in its default mode (not "reduce-overhead": the CUDA graphs
are captured here, the same way for both): prefill, a forward of B x T tokens without a cache,
logits of the last position only (logits_to_keep=1, as generate() asks for them); decode, one
token per sequence at batch B after --past tokens in a StaticCache (filled once by an eager
prefill of the stock model, shared by both), the compiled step captured in a torch.cuda.CUDAGraph
and replayed. Stock and patched alternate, the order reversed each round, --warmup rounds dropped,
each call between two CUDA events and waited for (a prefill's host time counts, as a server sees
it; a replay has next to none), median of --rounds; no L2 flush: one layer's weights are about 9x
the H100's L2. The first call of each model at each shape (compile included) is timed apart.

Layers: --layers of the 32 (default 4). The two models share one copy of the weights, so all 32
fit one 80 GB GPU (about 16 GB, the embeddings and lm_head 2 GB more, plus the caches); what
limits the count is compile time, which grows with it (each shape compiles apart).

Exit 0 where every check passes, 1 where one fails, 2 without torch, transformers or a CUDA GPU,
or where the dispatchers cannot be loaded or serve no layer (one line says which).
usage: python benchmarks/llama_e2e.py --dispatch LINEAR.cu [--dispatch LINEAR_BIAS.cu] [--layers 4]
       [--prefill 1x2048 8x512] [--decode 1 8 32 64] [--past 512] [--check 2x160] [--rounds 30]
       [--warmup 5] [--tol 2e-2] [--min-argmax 0.8] [--stock-lm-head] [--seed 0] [--json OUT.json]
       (needs a GPU, torch and transformers; run from the checkout root)"""
import argparse
import copy
import inspect
import json
import statistics
import sys
import time

try:
    import torch
except ImportError:
    torch = None
transformers = transformers_error = None
if torch is not None:  # transformers without torch prints a warning of its own
    try:
        import transformers
        from transformers import LlamaConfig, LlamaForCausalLM, StaticCache
    except ImportError as err:
        transformers, transformers_error = None, err

# meta-llama/Meta-Llama-3-8B's config.json (rope_scaling null, torch_dtype bfloat16); head_dim and
# mlp_bias are the defaults it implies (4096 / 32, no bias).
LLAMA3_8B = {"vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
             "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "hidden_act": "silu",
             "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
             "initializer_range": 0.02, "attention_bias": False, "attention_dropout": 0.0, "mlp_bias": False,
             "tie_word_embeddings": False, "bos_token_id": 128000, "eos_token_id": 128001, "use_cache": True}


def llama3_8b_config(layers: int, **overrides) -> "LlamaConfig":
    """Llama-3-8B's LlamaConfig with ``layers`` decoder layers and sdpa attention; ``overrides``
    replace fields (a small model on CPU, to check this script's plumbing)."""
    return LlamaConfig(**{**LLAMA3_8B, "num_hidden_layers": layers, **overrides}, attn_implementation="sdpa")


def build(config, seed: int, device: str):
    """(stock, twin): the model of ``config`` in bf16, eval, no grad, weights drawn by transformers'
    init from ``seed`` on ``device``, and a deep copy holding the very same Parameter objects
    (buffers, the rotary frequencies, are copied)."""
    torch.manual_seed(seed)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # made in bf16 on the device: no fp32 copy, no host init
    try:
        with torch.device(device):
            stock = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(default)
    stock = stock.to(torch.bfloat16).eval().requires_grad_(False)
    twin = copy.deepcopy(stock, memo={id(p): p for p in stock.parameters()})
    return stock, twin


def forward_params() -> set:
    return set(inspect.signature(LlamaForCausalLM.forward).parameters)


def cache_call(cache, start: int, batch: int, length: int, device) -> dict:
    """The keyword arguments of a forward of ``length`` tokens per sequence at positions ``start``...
    into ``cache``, as this transformers names them: 5.x takes ``cache`` and positions only, 4.x
    ``past_key_values`` and the ``cache_position`` where a StaticCache writes."""
    params = forward_params()
    positions = torch.arange(start, start + length, device=device)
    call = {"cache" if "cache" in params else "past_key_values": cache, "use_cache": True,
            "position_ids": positions.repeat(batch, 1)}
    if "cache_position" in params:
        call["cache_position"] = positions
    return call


def rewind(cache, length: int) -> None:
    """Put ``cache``'s write position back at ``length`` where transformers keeps it on the device
    (5.x: each StaticLayer's cumulative_length, which every update advances in place), so that a
    replayed step writes the same slot; 4.x layers write where cache_position says and have none."""
    for layer in getattr(cache, "layers", ()):
        written = getattr(layer, "cumulative_length", None)
        if isinstance(written, torch.Tensor):
            written.fill_(length)


def agreement(ref, got) -> dict:
    """How ``got`` (logits, (..., vocab)) matches ``ref``: max |difference|, the relative Frobenius
    error, and per row (position) whether the argmax is the same, with the sums that aggregate."""
    r, g = ref.float().reshape(-1, ref.shape[-1]), got.float().reshape(-1, got.shape[-1])
    diff_sq, ref_sq = float(((g - r) ** 2).sum()), float((r ** 2).sum())
    agree = int((r.argmax(-1) == g.argmax(-1)).sum())
    return {"max_abs": float((g - r).abs().max()), "rel_fro": (diff_sq / ref_sq) ** 0.5 if ref_sq else float("nan"),
            "argmax_agree": agree / r.shape[0], "rows": r.shape[0], "agree_rows": agree}


def alternate(fns, rounds: int, warmup: int) -> list:
    """Samples (ms) per function: each call between two CUDA events on the current stream and
    waited for; the functions alternate, their order reversed each round; ``warmup`` rounds dropped."""
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = [[] for _ in fns]
    order = list(range(len(fns)))
    for r in range(warmup + rounds):
        for i in order:
            start.record()
            fns[i]()
            stop.record()
            stop.synchronize()
            if r >= warmup:
                samples[i].append(start.elapsed_time(stop))
        order.reverse()
    return samples


def timing(phase: str, shape: str, first: list, samples: list, **more) -> dict:
    """One row of the table and the JSON: the medians, their ratio (stock / patched) and every
    sample, of stock and patched (``first`` and ``samples`` in that order); printed as it comes."""
    stock, patched = (statistics.median(s) for s in samples)
    print(f"  {phase} {shape}: stock {stock:.3f} ms, patched {patched:.3f} ms, x{stock / patched:.3f}; "
          f"first calls {first[0]:.1f} s, {first[1]:.1f} s", flush=True)
    return {"phase": phase, "shape": shape, **more, "stock_ms": stock, "patched_ms": patched, "ratio": stock / patched,
            "stock_first_call_s": first[0], "patched_first_call_s": first[1],
            "stock_samples_ms": samples[0], "patched_samples_ms": samples[1]}


def first_call(fn) -> float:
    """Seconds of ``fn()`` waited for (a compiled model's first call at a shape: its compile)."""
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def capture(fn, stream):
    """(graph, output): ``fn`` run twice more on ``stream`` (its launch plans and workspaces made
    there), then captured on it."""
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        out = fn()
    return graph, out


def shape(text: str) -> tuple:
    try:
        b, t = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not BATCHxTOKENS (e.g. 8x512)") from None
    if b < 1 or t < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: batch and tokens must be at least 1")
    return b, t


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive integer")
    return value


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--dispatch", action="append", required=True, metavar="FILE",
                    help="an emitted dispatcher (.cu, or the library built from it); repeat for a second")
    ap.add_argument("--layers", type=positive, default=4, help="decoder layers, at most 32 (default 4)")
    ap.add_argument("--prefill", type=shape, nargs="*", default=[(1, 2048), (8, 512)], metavar="BxT")
    ap.add_argument("--decode", type=positive, nargs="*", default=[1, 8, 32, 64], metavar="B")
    ap.add_argument("--past", type=positive, default=512, help="tokens in the KV cache before a decode step")
    ap.add_argument("--check", type=shape, default=(2, 160), metavar="BxT", help="the eager check's batch")
    ap.add_argument("--rounds", type=positive, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--tol", type=float, default=2e-2, help="largest relative Frobenius error of the logits")
    ap.add_argument("--min-argmax", type=float, default=0.8, help="smallest share of rows whose argmax agrees")
    ap.add_argument("--stock-lm-head", action="store_true", help="patch the decoder layers only, not lm_head")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", metavar="OUT", help="write the settings, checks and every sample here")
    args = ap.parse_args(argv)
    if args.layers > LLAMA3_8B["num_hidden_layers"]:
        ap.error(f"--layers {args.layers}: Llama-3-8B has {LLAMA3_8B['num_hidden_layers']}")
    if args.past + 1 > LLAMA3_8B["max_position_embeddings"] or any(
            t > LLAMA3_8B["max_position_embeddings"] for _, t in [*args.prefill, args.check]):
        ap.error(f"positions past max_position_embeddings ({LLAMA3_8B['max_position_embeddings']})")
    return args


def missing() -> str | None:
    """Why this machine cannot run the benchmark, or None."""
    if torch is None:
        return "llama_e2e: needs PyTorch (pip install '.[torch]')"
    if transformers is None:
        return f"llama_e2e: needs transformers (pip install transformers): {transformers_error}"
    if not torch.cuda.is_available():
        return "llama_e2e: needs a CUDA GPU (torch.cuda.is_available() is False)"
    return None


def raise_recompile_limits() -> None:
    """Room for every shape of both models: they share LlamaForCausalLM.forward's code object,
    whose compiled entries dynamo counts together (8 by default), and past the limit it would
    fall back to eager without a word; make it an error where this torch can."""
    cfg = torch._dynamo.config
    setattr(cfg, "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit", 64)
    for name in ("accumulated_recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(cfg, name):
            setattr(cfg, name, max(getattr(cfg, name), 512))
    if hasattr(cfg, "fail_on_recompile_limit_hit"):
        cfg.fail_on_recompile_limit_hit = True


def dynamo_counts() -> dict:
    from torch._dynamo.utils import counters
    return {"graph_breaks": sum(counters["graph_break"].values()), "graphs": counters["stats"].get("unique_graphs", 0)}


def main(argv=None) -> int:
    args = parse(argv)
    why = missing()
    if why:
        print(why)
        return 2
    import gemmgen.torch
    from gemmgen.errors import GemmgenError

    transformers.logging.set_verbosity_error()
    dev = torch.device("cuda")
    try:
        ops = [gemmgen.torch.load(path) for path in args.dispatch]
    except (OSError, GemmgenError) as err:
        print(f"llama_e2e: cannot load a dispatcher: {err}")
        return 2
    config = llama3_8b_config(args.layers)
    stock, twin = build(config, args.seed, dev)
    report = gemmgen.torch.patch(twin.model if args.stock_lm_head else twin, ops)
    if not report.swapped:
        print(f"llama_e2e: the dispatchers serve no layer of the model:\n{report}")
        return 2
    lm_head = ("stock (--stock-lm-head)" if args.stock_lm_head else
               "swapped" if "lm_head" in report.swapped else f"left: {report.left.get('lm_head')}")
    print(f"== Llama-3-8B config, {args.layers} of 32 layers, bf16, random weights (seed {args.seed}), "
          f"attention {stock.config._attn_implementation}; torch {torch.__version__}, transformers "
          f"{transformers.__version__}, {torch.cuda.get_device_name(dev)}")
    print(f"dispatchers: {', '.join(args.dispatch)}")
    print(f"patch: swapped {len(report.swapped)} nn.Linear modules; " + "\n".join(str(report).splitlines()[1:]))
    print(f"lm_head: {lm_head}")
    params = forward_params()
    last_only = {"logits_to_keep": 1} if "logits_to_keep" in params else {}
    gen = torch.Generator(device=dev).manual_seed(args.seed)

    def ids(batch, tokens):
        return torch.randint(0, config.vocab_size, (batch, tokens), device=dev, generator=gen)

    checks, rows, failures = [], [], []

    def check(group, what, ref, got, noise=None):
        """One comparison of the patched model's logits against stock's, printed and kept."""
        c = {"group": group, "what": what, **agreement(ref, got)}
        if noise is not None:
            c["stock_compiled_vs_eager"] = agreement(noise, ref)
        checks.append(c)
        if not c["rel_fro"] <= args.tol:
            failures.append(f"{what}: relative error {c['rel_fro']:.2e} > {args.tol:.0e}")
        scale = "" if noise is None else f"  (stock compiled vs eager: {c['stock_compiled_vs_eager']['rel_fro']:.2e})"
        print(f"  {what:<22} rel err {c['rel_fro']:.2e}, max |diff| {c['max_abs']:.3f}, argmax agrees "
              f"{c['agree_rows']}/{c['rows']}{scale}", flush=True)

    with torch.no_grad():
        print(f"== logits, patched against stock ({args.check[0]}x{args.check[1]} tokens, eager)")
        x = ids(*args.check)
        check("eager", f"eager {args.check[0]}x{args.check[1]}", stock(input_ids=x, use_cache=False).logits,
              twin(input_ids=x, use_cache=False).logits)
        raise_recompile_limits()
        compiled = [torch.compile(stock), torch.compile(twin)]
        side = torch.cuda.Stream()
        print("== prefill and decode, torch.compile (default mode) of each; decode steps in CUDA graphs")
        for b, t in args.prefill:
            x = ids(b, t)
            outs = [None, None]

            def run(i, x=x, outs=outs):
                outs[i] = compiled[i](input_ids=x, use_cache=False, **last_only).logits

            first = [first_call(lambda i=i: run(i)) for i in (0, 1)]
            samples = alternate([lambda: run(0), lambda: run(1)], args.rounds, args.warmup)
            rows.append(timing("prefill", f"{b}x{t}", first, samples))
            check("compiled", f"prefill {b}x{t}", outs[0], outs[1],
                  noise=stock(input_ids=x, use_cache=False, **last_only).logits)
            del outs
        for b in args.decode:
            cache = StaticCache(config=config, max_cache_len=args.past + 1)
            stock(input_ids=ids(b, args.past), **cache_call(cache, 0, b, args.past, dev), **last_only)
            token, call = ids(b, 1), cache_call(cache, args.past, b, 1, dev)

            def step(model, token=token, call=call, cache=cache):
                rewind(cache, args.past)
                return model(input_ids=token, **call).logits

            first = [first_call(lambda m=m: step(m)) for m in compiled]
            graphs, outs = zip(*(capture(lambda m=m: step(m), side) for m in compiled))
            samples = alternate([g.replay for g in graphs], args.rounds, args.warmup)
            rows.append(timing("decode", f"b{b}", first, samples, past=args.past))
            check("compiled", f"decode b{b}", outs[0], outs[1], noise=step(stock))
            for name, g, out in zip(("stock", "patched"), graphs, outs):
                before = out.clone()
                g.replay()
                g.replay()
                checks[-1][f"{name}_replay_rel_fro"] = again = agreement(before, out)["rel_fro"]
                if not again <= args.tol:
                    failures.append(f"decode b{b}: the {name} graph's replays differ by {again:.2e} "
                                    "(the cache's write position moved?)")
            del graphs, outs, cache
            torch.cuda.empty_cache()

    for group in ("eager", "compiled"):
        mine = [c for c in checks if c["group"] == group]
        share = sum(c["agree_rows"] for c in mine) / sum(c["rows"] for c in mine) if mine else 1.0
        if share < args.min_argmax:
            failures.append(f"{group}: argmax agrees on {share:.3f} of rows < {args.min_argmax}")
    counts = dynamo_counts()
    tokens = sorted({args.check[0] * args.check[1], *(b * t for b, t in args.prefill), *args.decode})
    served = {(m.out_features, m.in_features): m.op for m in twin.modules() if isinstance(m, gemmgen.torch.Linear)}
    choices = {f"{n}x{k}": {m: op.choice(m, n, k) for m in tokens} for (n, k), op in sorted(served.items())}
    print(f"== {args.layers} layers; dynamo: {counts['graphs']} graphs compiled, {counts['graph_breaks']} graph breaks;"
          f" ratio = stock / patched (above 1: patched faster); median of {args.rounds}")
    print(f"{'shape':<18}{'stock ms':>10}{'patched ms':>12}{'ratio':>8}{'first calls s':>16}")
    for r in rows:
        label = f"{r['phase']} {r['shape']}" + (f" +{r['past']}" if r["phase"] == "decode" else "")
        print(f"{label:<18}{r['stock_ms']:>10.3f}{r['patched_ms']:>12.3f}{r['ratio']:>8.3f}"
              f"{r['stock_first_call_s']:>8.1f}{r['patched_first_call_s']:>8.1f}")
    slower = [f"{r['phase']} {r['shape']} x{r['ratio']:.4f}" for r in rows if r["ratio"] < 1.0]
    print(f"patched at least as fast as stock everywhere: {'yes' if not slower else 'no (' + ', '.join(slower) + ')'}")
    print("logits match: " + ("yes" if not failures else "NO\n  " + "\n  ".join(failures)))
    if args.json:
        result = {"config": {**LLAMA3_8B, "num_hidden_layers": args.layers}, "seed": args.seed,
                  "torch": torch.__version__, "transformers": transformers.__version__,
                  "device": torch.cuda.get_device_name(dev), "dispatch": args.dispatch,
                  "patch": {"swapped": report.swapped, "left": report.left, "lm_head": lm_head},
                  "compile": "torch.compile default mode; decode steps captured in torch.cuda.CUDAGraph",
                  "prefill_logits_to_keep": last_only.get("logits_to_keep", 0), "dynamo": counts,
                  "choices": choices, "tol": args.tol, "min_argmax": args.min_argmax, "checks": checks, "timings": rows,
                  "failures": failures, "ok": not failures}
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
