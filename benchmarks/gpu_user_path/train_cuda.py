import os
import sys

import torch

rank_env = "RANK" in os.environ
dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
torch.cuda.set_device(dev)
m = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).to(dev)
if rank_env:
    import torch.distributed as dist

    dist.init_process_group("nccl")
    m = torch.nn.parallel.DistributedDataParallel(m, device_ids=[dev.index])
opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
x = torch.randn(256, 1024, device=dev)
for i in range(int(sys.argv[-1])):
    loss = m(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
torch.cuda.synchronize()
print("ran to the end", i + 1)
