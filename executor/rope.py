"""The RoPE table both ops backends read: cos/sin of every position's rotation angles."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class RopeTable:
    """cos/sin of ``position * inv_freq``, ``[max_pos, head_dim / 2]`` float32; ``interleaved`` pairs (2i, 2i+1)
    (Huginn), else (i, i + head_dim/2) (rotate half, Ouro)."""

    cos: torch.Tensor
    sin: torch.Tensor
    interleaved: bool

    @classmethod
    def build(cls, head_dim: int, theta: float, max_pos: int, interleaved: bool,
              device: torch.device | str) -> RopeTable:
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
        angles = torch.outer(torch.arange(max_pos, dtype=torch.float64), inv_freq)
        return cls(angles.cos().float().to(device), angles.sin().float().to(device), interleaved)
