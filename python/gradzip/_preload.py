"""Share torch's CUDA runtime and NCCL with gradzip._core, whichever is imported first.

gradzip._core links libcudart.so.N and libnccl.so.2 by soname. torch's pip
wheels bundle newer copies of both (in the nvidia.* packages). A process
holds one library per soname: if gradzip came first with the system's older
NCCL, a later ``import torch`` fails (undefined symbol: ncclCommResume, seen
here). So before _core loads, load the bundled copies when they exist: both
then resolve to them (the runtime and NCCL are backward compatible within a
major version). Without torch's wheels nothing happens.
"""

import ctypes
import importlib.util
import os
import sys

_SONAMES = ("libcudart.so.", "libnccl.so.")


def preload() -> None:
    if "torch" in sys.modules:  # torch already loaded its libraries; _core will reuse them
        return
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return
    if spec is None or not spec.submodule_search_locations:
        return
    for root in spec.submodule_search_locations:
        try:
            packages = sorted(os.listdir(root))
        except OSError:
            continue
        for package in packages:
            lib = os.path.join(root, package, "lib")
            if not os.path.isdir(lib):
                continue
            for name in sorted(os.listdir(lib)):
                if name.startswith(_SONAMES) and name.split(".so.")[-1].isdigit():
                    try:
                        ctypes.CDLL(os.path.join(lib, name))
                    except OSError:
                        pass  # not loadable here (no driver is fine: cudart loads without one)
