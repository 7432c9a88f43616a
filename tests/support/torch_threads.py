"""torch's intra-op threads set for a block and put back after: a kernel's result must not depend on them."""

import contextlib

import torch


@contextlib.contextmanager
def threads(n: int):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
