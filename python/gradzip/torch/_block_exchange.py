"""The collective :class:`~gradzip.torch.BlockMomentum` needs, behind one small
interface so that its transport can change without touching the algorithm.

BMUF asks four things of the ranks' network: once, at construction,

- ``agree(what, fields, device)``: raise the same ValueError on every rank,
  naming each field that differs and the ranks that differ from rank 0 in
  it, unless every rank passed the same fields (hyperparameters and model
  shapes): ranks that disagree would otherwise end blocks at different steps
  or filter differently;

and once per block:

- ``average_(i, flat)``: flat (float32, contiguous, on the model's device)
  becomes the average over ranks, sent compressed by the codec with the error
  feedback of buffer ``i`` (kept across calls: one state per buffer); every
  rank ends with the same bits. Returns the bytes this rank put on the wire.
- ``average_exact_(flat, part)``: the same in fp32 (module buffers such as
  batch norm statistics; the parameters a layer filter keeps exact), the
  same bits on every rank; ``part`` names the tensor (one state each).
- ``broadcast_(flat)``: rank 0's values on every rank (the initial model).
- ``ranks_where(flag, device)``: the ranks whose flag is set, the same list
  on every rank (W not finite after the outer step: every rank raises, none
  trains on).

:class:`CommunicatorExchange` implements them over a
:class:`gradzip.Communicator`, whichever transport carries its bytes
(_transports.py: torch's process group itself, or UCX/NCCL): the same C++
compressed allreduce either way, so the same bits.

:class:`Background` runs one exchange at a time on a worker thread, for the
overlapped mode: the communicator releases the GIL while it works (over
torch's process group, the transport takes it back only for each of its
calls into torch), so local steps go on meanwhile.
"""

import concurrent.futures
import hashlib
import json
from typing import Any, Dict, List, Optional

import torch

__all__ = ["CommunicatorExchange", "Background"]


class CommunicatorExchange:
    """BMUF's exchange over a :class:`gradzip.Communicator`."""

    __slots__ = ("comm", "codec", "algorithm", "server_codec", "_states", "_fp32", "_fp32_states")

    def __init__(self, comm: Any, codec: Any, algorithm: str, buffers: int,
                 server_codec: Optional[str] = None) -> None:
        import gradzip

        self.comm = comm
        self.codec = codec
        self.algorithm = algorithm
        self.server_codec = server_codec
        self._states: List[Any] = [gradzip.ErrorFeedback() for _ in range(buffers)]
        self._fp32 = gradzip.Codec("none")
        # The none codec keeps no residual, but a state is bound to one size: one per part.
        self._fp32_states: Dict[str, Any] = {}

    @property
    def size(self) -> int:
        return self.comm.size

    @property
    def rank(self) -> int:
        return self.comm.rank

    def average_(self, i: int, flat: torch.Tensor) -> int:
        stats = self.comm.allreduce(flat, self.codec, self._states[i], op="avg", algorithm=self.algorithm,
                                    server_codec=self.server_codec)
        return int(stats["wire_bytes"])

    def average_exact_(self, flat: torch.Tensor, part: str = "module buffers") -> int:
        import gradzip

        state = self._fp32_states.get(part)
        if state is None:
            state = self._fp32_states[part] = gradzip.ErrorFeedback()
        stats = self.comm.allreduce(flat, self._fp32, state, op="avg")
        return int(stats["wire_bytes"])

    def broadcast_(self, flat: torch.Tensor) -> None:
        # A sum in which only rank 0 contributes: x + 0 is x (a -0.0 may come
        # back as +0.0), and every rank gets the same bits.
        import gradzip

        if self.comm.rank != 0:
            flat.zero_()
        # A state of its own: a state is bound to one buffer size.
        self.comm.allreduce(flat, self._fp32, gradzip.ErrorFeedback(), op="sum")

    def ranks_where(self, flag: bool, device: torch.device) -> List[int]:
        import gradzip

        flags = torch.zeros(self.size, dtype=torch.float32, device=device)
        flags[self.rank] = float(flag)
        self.comm.allreduce(flags, self._fp32, gradzip.ErrorFeedback(), op="sum")
        return [r for r, f in enumerate(flags.tolist()) if f != 0]

    def agree(self, what: str, fields: Dict[str, Any], device: torch.device) -> None:
        import gradzip

        names = sorted(fields)
        values = [json.dumps(fields[k], sort_keys=True) for k in names]
        # 64 bits of each field's digest, as four 16-bit pieces (float32 holds
        # them exactly), so that a mismatch names the fields that differ.
        digests = [hashlib.sha256(f"{k}={v}".encode()).digest() for k, v in zip(names, values)]
        mine = torch.tensor([int.from_bytes(d[i:i + 2], "little") for d in digests for i in range(0, 8, 2)],
                            dtype=torch.float32, device=device)
        rank0 = mine.clone()
        self.broadcast_(rank0)
        differs = torch.zeros(self.size, len(names), dtype=torch.float32, device=device)
        differs[self.rank] = (mine != rank0).view(len(names), 4).any(dim=1).float()
        self.comm.allreduce(differs.view(-1), self._fp32, gradzip.ErrorFeedback(), op="sum")
        report = ""
        for j, flags in enumerate(differs.t().tolist()):
            ranks = [r for r, d in enumerate(flags) if d != 0]
            if ranks:
                report += (f"\n  {names[j]}: ranks {', '.join(map(str, ranks))} differ from rank 0 "
                           f"(this rank has {values[j]})")
        if report:
            raise ValueError(f"the ranks disagree on the {what}; every rank must pass the same values:{report}")

    def state_dict(self) -> List[Dict[str, Any]]:
        """The error feedback of every buffer (this rank's: residuals differ between ranks)."""
        return [s.state_dict() for s in self._states]

    def load_state_dict(self, states: List[Dict[str, Any]]) -> None:
        self.set_states(self.checked_states(states))

    def checked_states(self, states: List[Dict[str, Any]]) -> List[Any]:
        """New states loaded from `states` (InvalidArgument, a ValueError, when one is malformed);
        the ones in use are left as they are."""
        import gradzip

        if len(states) != len(self._states):
            raise ValueError(f"the state_dict holds error feedback for {len(states)} buffers, "
                             f"this BlockMomentum has {len(self._states)}")
        loaded = []
        for saved in states:
            s = gradzip.ErrorFeedback()
            s.load_state_dict(saved)
            loaded.append(s)
        return loaded

    def set_states(self, states: List[Any]) -> None:
        """Uses `states` (from checked_states) from now on."""
        self._states = list(states)


class Background:
    """Runs exchanges on one worker thread, one at a time, in submission order.

    On CUDA the worker runs on a stream of its own that first waits for the
    work queued so far on the caller's stream; :meth:`wait` makes the
    caller's stream wait for the exchange in turn.
    """

    __slots__ = ("_pool", "_future", "_streams", "_done")

    def __init__(self) -> None:
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="gradzip-bmuf")
        self._future: Optional[concurrent.futures.Future] = None
        self._streams: Dict[torch.device, Any] = {}
        self._done: Any = None

    @property
    def busy(self) -> bool:
        return self._future is not None

    def submit(self, fn: Any, device: torch.device) -> None:
        assert self._future is None, "one exchange in flight at a time"
        if device.type != "cuda":
            self._future = self._pool.submit(fn)
            return
        ready = torch.cuda.Event()
        ready.record(torch.cuda.current_stream(device))
        stream = self._streams.get(device)
        if stream is None:
            stream = self._streams[device] = torch.cuda.Stream(device)
        done = torch.cuda.Event()
        self._done = (done, device)

        def on_stream() -> Any:
            with torch.cuda.stream(stream):
                stream.wait_event(ready)
                result = fn()
                done.record(stream)
            return result

        self._future = self._pool.submit(on_stream)

    def wait(self) -> Any:
        """The exchange's result (its exception, if it failed)."""
        future, self._future = self._future, None
        assert future is not None
        result = future.result()
        if self._done is not None:
            done, device = self._done
            torch.cuda.current_stream(device).wait_event(done)
            self._done = None
        return result

    def close(self) -> None:
        self._pool.shutdown(wait=True)
