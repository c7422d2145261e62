"""Measurements as pure functions of arrays: spectra, Jacobians, path sums,
sensitivity, similarity, losses, gradients, the closed forms of the papers.

The implementation (private); the public names are ``rankjax.measure``.
"""

__all__ = [
    "decoder_jacobians",
    "gradients",
    "jacobians",
    "losses",
    "paths",
    "representations",
    "residual_networks",
    "sensitivity",
    "sensitivity_bounds",
    "similarity",
    "spectra",
    "theory",
]
