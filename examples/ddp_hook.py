# Data-parallel training whose gradients travel compressed.
# Run: torchrun --nproc-per-node=2 examples/ddp_hook.py
import gc, torch, torch.distributed as dist
from gradzip.torch import CompressionState, compression_hook

dist.init_process_group("gloo")  # torchrun sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
model = torch.nn.parallel.DistributedDataParallel(net)
state = CompressionState(codec="onebit")  # 1-bit SGD with error feedback; or "topk:density=0.01"
model.register_comm_hook(state, compression_hook)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(50):
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    opt.zero_grad(); torch.nn.functional.cross_entropy(model(x), y).backward(); opt.step()
print(f"rank {dist.get_rank()}: {state.compression_stats()['ratio']:.1f}x fewer bytes per step")
del model, opt; gc.collect()  # DDP holds the group: free it so gloo's threads stop before exit
dist.destroy_process_group()
