"""Issue 17, GPU time without host latency: each call captured in a CUDA graph (as LLM serving runs
decode), ours through gemmgen.torch and cuBLAS through torch.mm(out_dtype=float32), replayed in
alternation after an L2 flush, median of 40 after warm-up. usage: python benchmarks/torch_dispatch_graphs.py PRECISION DISPATCHER.cu (needs a GPU and torch)"""
import json, sys
import numpy as np, torch
from gemmgen.describe.problem import Shape
from gemmgen.describe.workload import load_workload
from gemmgen.torch import load

precision, cu = sys.argv[1:3]
wl = load_workload("workloads/llama3-8b.toml")
op = load(cu)
dev = torch.device("cuda")
flush = torch.zeros(2 * torch.cuda.get_device_properties(0).L2_cache_size // 4, device=dev)
side = torch.cuda.Stream()
ratios, rows = {}, []
for s in wl.shapes:
    a = (torch.rand(s.m, s.k, device=dev) * 2 - 1).to(op.dtype); b = (torch.rand(s.k, s.n, device=dev) * 2 - 1).to(op.dtype)
    c = torch.empty(s.m, s.n, device=dev); c_ref = torch.empty(s.m, s.n, device=dev)
    graphs = []
    for fn in (lambda: op(a, b, out=c), lambda: torch.mm(a, b, out_dtype=torch.float32, out=c_ref)):
        with torch.cuda.stream(side):
            for _ in range(3):
                fn()  # the launcher's workspace and plan for this stream exist before capture
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=side):
            fn()
        graphs.append(g)
    times = [[], []]
    order = [0, 1]
    for r in range(45):
        for i in order:
            flush.sum(); c.fill_(float("nan"))
            st, en = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            st.record(); graphs[i].replay(); en.record(); en.synchronize()
            if r >= 5:
                times[i].append(st.elapsed_time(en))
        order.reverse()
    ours, cublas = np.median(times[0]), np.median(times[1])
    err = ((c.double() - (a.double() @ b.double())).norm() / (a.double() @ b.double()).norm()).item()
    ratios[s] = cublas / ours
    rows.append((str(s), op.choice(s.m, s.n, s.k), ours * 1e3, cublas * 1e3, cublas / ours, err))
    del graphs
print(f"== {precision}, CUDA graphs: dispatcher (gemmgen.torch) vs torch.mm(out_dtype=float32)")
for r in rows:
    print(f"{r[0]:<18} {r[1]:<44} {r[2]:8.1f} us {r[3]:8.1f} us  x{r[4]:.3f}  rel err {r[5]:.1e}")
print(json.dumps({"precision": precision, "graph_weighted_geomean_vs_cublas": wl.weighted_mean(ratios)}))
