"""The skip shared by the tests that run gradzip's codecs on CUDA tensors."""

import pytest
import torch

import gradzip


def skip_unless_cuda_codecs() -> None:
    """Skips the calling test, saying why, unless a GPU is present and this
    gradzip build's codecs have a CUDA path."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    if not gradzip.BUILD["cuda"]:
        pytest.skip("this gradzip build has no CUDA support")
    try:
        gradzip.Codec("onebit:ef=off").encode(torch.zeros(8, device="cuda"))
    except gradzip.InvalidArgument as e:
        if "no CUDA support" in str(e):
            pytest.skip("this build's codecs have no CUDA path")
        raise
