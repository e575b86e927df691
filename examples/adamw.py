# AdamW with compressed communication: after a short warm-up (gradients in
# 8-bit floats) the optimizer exchanges its momentum, 1-bit with error
# feedback, and keeps AdamW's quality where a compressed gradient would not.
# Run: torchrun --nproc-per-node=2 examples/adamw.py
import gc, torch, torch.distributed as dist
from gradzip.torch import CompressedAdamW

dist.init_process_group("gloo")
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
model = torch.nn.parallel.DistributedDataParallel(net)
opt = CompressedAdamW(net.parameters(), lr=1e-3, codec="onebit")  # instead of torch.optim.AdamW
opt.register_ddp(model)  # the optimizer exchanges, in place of DDP's allreduce
for step in range(120):
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    opt.zero_grad(); torch.nn.functional.cross_entropy(model(x), y).backward(); opt.step()
s = opt.compression_stats()
print(f"rank {dist.get_rank()}: {s['warmup_steps']} warm-up steps, then compressed: "
      f"{s['wire_ratio']:.1f}x fewer bytes than fp32 DDP over the run")
del model, opt; gc.collect()  # DDP holds the group: free it so gloo's threads stop before exit
dist.destroy_process_group()
