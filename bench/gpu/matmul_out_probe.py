import torch, torch.nn.functional as F
torch.manual_seed(0)
dev = "cuda"
for k in (2048, 7168, 1024, 3584):
    a = torch.randn(128, k, device=dev, dtype=torch.bfloat16)
    w = torch.randn(4096, k, device=dev, dtype=torch.bfloat16)
    buf = torch.empty(128, 4096, device=dev, dtype=torch.bfloat16)
    def lin(): return F.linear(a, w)
    def mm_out(): return torch.matmul(a, w.t(), out=buf)
    def mm_out2(): return torch.mm(a, w.t(), out=buf)
    res = {}
    for name, fn in (("linear", lin), ("matmul_out", mm_out), ("mm_out", mm_out2)):
        for _ in range(10): fn()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(20): fn()
        torch.cuda.synchronize()
        ts = []
        for _ in range(20):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record(); g.replay(); e.record(); torch.cuda.synchronize()
            ts.append(s.elapsed_time(e) * 1000 / 20)
        ts.sort(); res[name] = round(ts[len(ts)//2], 2)
    print(k, res, flush=True)
