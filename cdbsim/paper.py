"""Exit behaviour as the CDB paper reports it, for comparing cdbsim with the paper on its own terms.

The paper (Schwethelm, Rueckert, Kaissis, arXiv 2608.09444) replays exit decisions recorded from the real
models at several thresholds ``q``: Ouro's cumulative-hazard gate (a token exits at the first loop whose
cumulative exit probability reaches ``q``; ``q = 1`` never exits) and Huginn's latent-difference criterion
(a token exits once its state changes by less than ``q``; ``q = 0`` never exits). Its recorded traces are
not published (the public release commits none), so the distribution of depths is not known; what is
reported, and what follows from it:

* Ouro-1.4B (r_max 4): a mean exit depth of about 2.5 at the most aggressive threshold, q = 0.2 (the paper's
  "mean exit depth ≈ 2.5", matching its FLOP bound of about 1.6x: (F0 + 4 Fr)/(F0 + d Fr) = 1.6 gives
  d = 2.47 with F0/Fr = 0.082). q = 1.0 runs every token at r_max. **Inferred:** the thresholds between,
  0.4 / 0.5 / 0.7, are placed linearly in q between those two anchors (2.88 / 3.06 / 3.44).
* Huginn-3.5B (r_max 16): a mean exit depth of about 8 at q = 0.28 (the paper's "≈ 8 of 16"); q = 0 runs
  every token at r_max. **Inferred:** 0.16 and 0.10 linearly in q between them (11.4 and 13.1).
* The spread of depths and their token-to-token correlation are not reported: the model keeps the
  synthetic defaults (beta-binomial dispersion 0.3, lag-one correlation 0.5) and says so.

A ``paper`` exit model is therefore a synthetic one whose mean comes from this table; it is a way to ask
"what would the paper's operating points look like here", not a replay of the real gates.
"""

from __future__ import annotations

from dataclasses import dataclass

from cdbsim.arch import ArchSpec, LayerStyle
from cdbsim.errors import require

DISPERSION, CORRELATION = 0.3, 0.5


@dataclass(frozen=True)
class PaperPoint:
    """The mean requested depth at one threshold, and whether the paper reports it or it is inferred."""

    mean_depth: float
    reported: bool


PAPER_DEPTHS: dict[LayerStyle, dict[float, PaperPoint]] = {
    LayerStyle.OURO: {0.2: PaperPoint(2.5, True), 0.4: PaperPoint(2.875, False), 0.5: PaperPoint(3.0625, False),
                      0.7: PaperPoint(3.4375, False), 1.0: PaperPoint(4.0, True)},
    LayerStyle.HUGINN: {0.28: PaperPoint(8.0, True), 0.16: PaperPoint(8.0 + 8.0 * 0.12 / 0.28, False),
                        0.10: PaperPoint(8.0 + 8.0 * 0.18 / 0.28, False), 0.0: PaperPoint(16.0, True)},
}
PAPER_R_MAX = {LayerStyle.OURO: 4, LayerStyle.HUGINN: 16}


def paper_point(arch: ArchSpec, q: float) -> PaperPoint:
    """The paper's mean exit depth of ``arch``'s model family at threshold ``q``, rescaled to ``arch``'s
    r_max when it is not the one the paper served (the same share of the loop budget)."""
    table = PAPER_DEPTHS[arch.style]
    require(q in table, f"the paper's thresholds for {arch.style}-style models are q in "
                        f"{', '.join(f'{k:g}' for k in sorted(table))}; got q = {q:g}")
    point = table[q]
    served = PAPER_R_MAX[arch.style]
    if arch.r_max == served:
        return point
    return PaperPoint(1.0 + (point.mean_depth - 1.0) * (arch.r_max - 1) / (served - 1), False)
