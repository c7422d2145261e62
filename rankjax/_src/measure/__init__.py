"""Measurements as pure functions of arrays: spectra, Jacobians, path sums,
sensitivity, similarity, losses, gradients, the closed forms of the papers.

The public modules are listed in ``__all__`` (import them by name: ``from
rankjax._src.measure import spectra``); the others are the library's internals.
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
