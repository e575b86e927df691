"""transport="gradzip" for the DDP hook: gradzip's allreduce algorithms over
gradzip's own transports (UCX on CPU, NCCL on GPU), with connections of
their own, met through torch's rendezvous store.

The same interface as _torch_transport (_transports.py): ``connect`` gives
the hook (or BlockMomentum) its communicator, which runs every exchange the
same way.
"""

from typing import Any, Optional

import torch.distributed as dist


def connect(process_group: Optional[dist.ProcessGroup], communicator: Any, timeout: Optional[float]) -> Any:
    """The given communicator (checked against the group), or a new one over UCX or NCCL."""
    import gradzip

    if not gradzip.BUILD["comm"]:
        raise ValueError("transport='gradzip' needs a gradzip build with its communicator")
    if communicator is None:
        return gradzip.Communicator.from_torch(process_group, timeout=timeout)
    if not isinstance(communicator, gradzip.Communicator):
        raise ValueError(f"communicator must be a gradzip.Communicator, got {type(communicator).__name__}")
    # A communicator made without torch.distributed (Communicator.from_env)
    # has no group to match.
    if process_group is not None or (dist.is_available() and dist.is_initialized()):
        world = dist.get_world_size(process_group)
        if communicator.size != world:
            raise ValueError(f"the communicator has {communicator.size} ranks, the process group {world}")
    return communicator
