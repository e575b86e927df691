"""The codec the DDP hook and the backend use when none is given."""

import gradzip
from gradzip.torch import CompressionState
from gradzip.torch.backend import Policy

QSGD4 = gradzip.Codec("qsgd:bits=4").spec


def test_the_hook_and_the_backend_default_to_qsgd_4bit():
    # qsgd 4-bit (7.7x fewer bytes than fp32 DDP) ended below fp32's validation loss on
    # average with AdamW on the LM experiment (4 and 8 ranks; one 8-rank seed of five
    # +8.8% through the hook) and matched fp32 on digits with momentum SGD; onebit, the
    # former default, ended +4.6% (hook) and +8.4% (backend): BENCHMARKS.md section 11,
    # "Defaults that keep AdamW's quality".
    assert CompressionState().codec.spec == QSGD4
    assert CompressionState(adaptive=True).codec.spec == QSGD4  # AdamW keeps it, error feedback included
    assert CompressionState(adaptive=False).codec.spec == QSGD4
    assert Policy().rules == [("*", 16384, QSGD4)]
    assert Policy.parse("min_elements=5").rules == [("*", 5, QSGD4)]  # GRADZIP_POLICY without codec=
    assert Policy.parse("").rules == Policy().rules
