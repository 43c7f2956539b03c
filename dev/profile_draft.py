"""GPU probe: where a PyTorch draft forward's time goes (kernel table, eager, 1 and 8 rows)."""
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, "dev")
import torch_draft_probe as probe

lm = probe.build(True, sys.argv[1] if len(sys.argv) > 1 else None)
ctx = 300
idx = torch.arange(ctx)
lm.forward((idx * 17 + 3) % lm.vocab_size, idx, idx, torch.ones(ctx, ctx, dtype=torch.bool).tril())
for n in (1, 8):
    args = probe.tree_rows(lm, ctx, n)
    for _ in range(3):
        lm.forward(*args)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            lm.forward(*args)
        torch.cuda.synchronize()
    print(f"== rows {n}, 10 graph replays")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=60))
