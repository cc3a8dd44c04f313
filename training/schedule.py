"""The masking schedule of absorbing-state (masked) diffusion.

At noise level ``t`` in (0, 1] every target token is independently replaced by MASK with probability
``t`` (the linear schedule of MDLM and LLaDA: the chance a token is still clean is ``1 - t``). The ELBO of
this process weights the cross-entropy of each masked token by ``1 / t``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class MaskSchedule:
    """Draws mask ratios and gives the ELBO weight of each.

    ``min_ratio`` keeps ``t`` away from 0, where the ``1 / t`` weight explodes while almost nothing is
    masked. ``stratified`` spreads one batch's ratios evenly over (min_ratio, 1] (one uniform offset shared
    by the batch): the same expectation with a much lower-variance loss.
    """

    min_ratio: float = 1e-3
    stratified: bool = True

    def sample(self, batch_size: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """(B,) mask ratios in [min_ratio, 1]."""
        if self.stratified:
            offset = torch.rand((), generator=generator)
            u = (offset + torch.arange(batch_size) / batch_size) % 1.0
            u = u[torch.randperm(batch_size, generator=generator)]
        else:
            u = torch.rand(batch_size, generator=generator)
        return self.min_ratio + (1 - self.min_ratio) * u

    @staticmethod
    def weight(t: torch.Tensor) -> torch.Tensor:
        """ELBO weight of a masked token's cross-entropy at ratio ``t``: ``1 / t``."""
        return 1.0 / t
