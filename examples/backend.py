# A plain data-parallel loop whose all_reduce calls travel compressed: only the
# init line differs from the gloo version, and gradzip is not imported (torch
# finds the backend through the installed package's entry point).
# Run: torchrun --nproc-per-node=2 examples/backend.py
import gc, hashlib, torch, torch.distributed as dist

dist.init_process_group("cpu:gradzip,cuda:gradzip")  # was: dist.init_process_group("gloo")
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
model = torch.nn.parallel.DistributedDataParallel(net)  # no comm hook
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(20):
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    opt.zero_grad(); loss = torch.nn.functional.cross_entropy(model(x), y); loss.backward(); opt.step()
    dist.all_reduce(loss.detach(), op=dist.ReduceOp.AVG)  # a metric: small, stays exact
digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in net.parameters())).hexdigest()[:16]
stats = dist.group.WORLD.compression_stats()
print(f"rank {dist.get_rank()}: parameters {digest}, {stats['compressed_calls']} all_reduce calls compressed, "
      f"{stats['wire_ratio']:.1f}x fewer bytes")
del model, opt; gc.collect()  # DDP holds the group: free it so gloo's threads stop before exit
dist.destroy_process_group()
