"""Runs the `speculators` CLI on a machine without a GPU (bench/peer_speculators.py runs the peer's trainer with it).

    PEER_VENV/bin/python bench/peer_cpu_shim.py train --verifier-name-or-path ... (any `speculators` command)

The smallest change its trainer needs on CPU, and nothing else: the trainer moves the model and each batch to
`self.local_rank`, an integer, which torch reads as the CUDA device of that index; here an integer device (or a
"cuda" one) means the CPU, and synchronizing the device (its step timer does so) is a no-op. With no accelerator it
then autocasts with device type "cuda", which torch disables with a warning on a CPU-only build, so the peer trains
in float32 (pass `--hidden-states-dtype float32` so the dataloader keeps the states in float32 as well). Its
optimizer is torch's `torch.optim.Muon`, whose Newton-Schulz iteration casts each gradient to bfloat16: on a CPU
without native bf16 matmuls (AVX2) that made the optimizer step 28 s of a 32 s step (5 steps, 2-core AVX2 EPYC), so
on CPU the shim runs the same quintic iteration, same coefficients and steps, in float32, as draftsmith's own Muon
does there (the optimizer step then took 1.1 s of a 5.0 s step). Loss, optimizer, data and schedule are otherwise
the peer's own.
"""

from __future__ import annotations

import sys
import warnings

import torch
from torch import nn


def _cpu(device):
    if isinstance(device, int) or (isinstance(device, str) and device.startswith("cuda")):
        return torch.device("cpu")
    if isinstance(device, torch.device) and device.type == "cuda":
        return torch.device("cpu")
    return device


def _newton_schulz_fp32(grad, ns_coefficients, ns_steps, eps):
    """torch.optim.Muon's orthogonalisation (`_zeropower_via_newtonschulz`) in float32 instead of bfloat16."""
    a, b, c = ns_coefficients
    x = grad.float()
    tall = x.size(0) > x.size(1)
    if tall:
        x = x.T
    x = x / x.norm().clamp(min=eps)
    for _ in range(ns_steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if tall else x


def _patch() -> None:
    def on_cpu(to):
        """`to` (Tensor.to or Module.to) with a CUDA device, positional or keyword, read as the CPU."""

        def wrapped(self, *args, **kwargs):
            if args:
                args = (_cpu(args[0]), *args[1:])
            if "device" in kwargs:
                kwargs["device"] = _cpu(kwargs["device"])
            return to(self, *args, **kwargs)

        return wrapped

    torch.Tensor.to = on_cpu(torch.Tensor.to)
    nn.Module.to = on_cpu(nn.Module.to)
    if not torch.accelerator.is_available():  # its step timer synchronizes the device on every mark
        torch.accelerator.synchronize = lambda device=None: None
    from torch.optim import _muon

    _muon._zeropower_via_newtonschulz = _newton_schulz_fp32
    warnings.filterwarnings("ignore", message=".*CUDA is not available.*autocast.*")
    warnings.filterwarnings("ignore", message=".*device_type of 'cuda', but CUDA is not available.*")


if __name__ == "__main__":
    _patch()
    from speculators.cli import app

    sys.argv = ["speculators", *sys.argv[1:]]
    app()
