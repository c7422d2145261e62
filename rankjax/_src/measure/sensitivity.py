"""Softmax sensitivity theta(p): the public facade over its three modules.

Paper: "Exact Attention Sensitivity and the Geometry of Transformer Stability"
(``papers/softmax_sensitivity.txt``). The code lives in

* ``sensitivity_exact``: exact theta (Def 3.1; enumeration and meet in the middle),
  the exact ``||J_tau||_{inf->1}`` of Thm 3.2 by sign enumeration, Cor 3.4's closed forms;
* ``sensitivity_certificates``: App D.2's greedy-prefix certificate, our ``repair``
  and ``balance`` certificates, and ``theta_bracket``;
* ``sensitivity_statistics``: the attention-row statistics and the gradient-spike
  rule of Sec 5.

The per-layer Lipschitz bounds of Sec 4 are in ``sensitivity_bounds``.
"""
from __future__ import annotations

from rankjax._src.measure.sensitivity_certificates import (
    CertificateMethod,
    theta_bracket,
    theta_certificate,
)
from rankjax._src.measure.sensitivity_exact import (
    MAX_ENUMERATE_L,
    MAX_MITM_L,
    MAX_SIGN_L,
    softmax_jacobian_inf_to_one,
    theta_dominant_atom,
    theta_enumerate,
    theta_exact,
    theta_lower_bound_pmax,
    theta_mitm,
    theta_top_k_uniform,
    theta_uniform,
)
from rankjax._src.measure.sensitivity_statistics import attention_statistics, gradient_spikes

__all__ = [
    "MAX_ENUMERATE_L",
    "MAX_MITM_L",
    "MAX_SIGN_L",
    "CertificateMethod",
    "attention_statistics",
    "gradient_spikes",
    "softmax_jacobian_inf_to_one",
    "theta_bracket",
    "theta_certificate",
    "theta_dominant_atom",
    "theta_enumerate",
    "theta_exact",
    "theta_lower_bound_pmax",
    "theta_mitm",
    "theta_top_k_uniform",
    "theta_uniform",
]
