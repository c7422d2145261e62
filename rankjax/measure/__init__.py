"""Measurements as pure functions of arrays, and the papers' closed forms.

The public face of ``rankjax.measure`` (the implementation is ``rankjax._src.measure``,
private and free to change). Each function's docstring cites the equation or theorem
it computes.

Spectra and ranks: ``effective_rank``, ``effective_rank_from_singular_values``,
``stable_rank``, ``survival_rate``, ``coherence_constant``, ``activation_moments``,
``marchenko_pastur_density`` / ``_edges`` / ``_atom`` / ``_condition_number``.

Jacobians of residual networks (Transforming Rank): ``mlp_jacobian_study`` (the exact
per-input Jacobian spectra of a ``ResidualMLP``), ``JacobianStudy``, ``StudyOptions``,
``JacobianBlock``, ``BlockJacobianMethod``, ``make_study_fn``, ``seed_samples``,
``branch_jacobian``, ``network_study``; per-order path sums ``path_sums`` /
``PathSums``, ``accumulated_branch``, ``block_cosines``; a decoder's FFN Jacobians
``ffn_inputs``, ``ffn_jacobians``; the representation study ``mlp_representation_study``
and its pieces (``cosine_matrix``, ``off_diagonal_mean``, ``growth_exponent``,
``smallest_gram_eigenvalue``, ``masked_gram_eigenvalues``, ``masked_up_projection``,
``post_activation``, ``activation_derivative``, ``backward_stream``).

Post-Norm collapse: ``token_similarity``, ``batch_mean_token_similarity``,
``prefix_average_matrix``; losses ``cross_entropy``, ``frequency_loss``,
``frequency_logits``; gradients ``block_grad_norms``, ``detect_transition`` /
``Transition``, ``collapse_distance``, ``collapsed_loss_lower_bound``; the closed forms
``delta_attn``, ``delta_ffn``, ``delta_de``, ``f1``, ``amount_of_attention``,
``amount_of_attention_postnorm``, ``folded_attention_variance``, ``swiglu_moment``,
``swiglu_xi``, ``STANDARD_SWIGLU_VAR_U``.

Softmax sensitivity: ``theta_exact``, ``theta_bracket``, ``theta_certificate``,
``theta_mitm``, ``softmax_jacobian_inf_to_one``, ``attention_statistics``,
``gradient_spikes``; the bounds ``mha_attention_probs``, ``mha_lipschitz_bound``,
``mha_local_bound``, ``layernorm_only_product``, ``block_inf_rms_norm``,
``inf_rms_operator_norm_bracket``.

Inside your own training loop (a plain flax model, unedited): ``capture`` its residual
stream, loss gradients and attention at ``site``s (``module_named``,
``nth_call_in_block``), then ``residual_statistics`` (postnorm Def 2.1, Def 3.5, Thm
3.6), ``causal_probs`` and ``layer_attention_statistics`` (softmax-sensitivity Sec 5,
per layer); the recipe: docs/extending.md, "rankjax's diagnostics in your own
training loop".

``single_blas_thread``: a context for the CPU engines (one BLAS thread while JAX's own
threads run the Jacobians).
"""
from rankjax._src.fast_paths import single_blas_thread
from rankjax._src.measure.decoder_jacobians import ffn_inputs, ffn_jacobians
from rankjax._src.measure.engine import BlockJacobianMethod, JacobianBlock
from rankjax._src.measure.flax_capture import attention_statistics as layer_attention_statistics
from rankjax._src.measure.flax_capture import (
    capture,
    causal_probs,
    module_named,
    nth_call_in_block,
    residual_statistics,
    site,
)
from rankjax._src.measure.gradients import (
    Transition,
    block_grad_norms,
    collapse_distance,
    collapsed_loss_lower_bound,
    detect_transition,
)
from rankjax._src.measure.jacobians import (
    JacobianStudy,
    StudyOptions,
    branch_jacobian,
    make_study_fn,
    mlp_jacobian_study,
    seed_samples,
)
from rankjax._src.measure.losses import cross_entropy, frequency_logits, frequency_loss
from rankjax._src.measure.paths import PathSums, accumulated_branch, block_cosines, path_sums
from rankjax._src.measure.representations import (
    activation_derivative,
    backward_stream,
    cosine_matrix,
    growth_exponent,
    masked_gram_eigenvalues,
    masked_up_projection,
    mlp_representation_study,
    off_diagonal_mean,
    post_activation,
    smallest_gram_eigenvalue,
)
from rankjax._src.measure.residual_networks import network_study
from rankjax._src.measure.sensitivity import (
    attention_statistics,
    gradient_spikes,
    softmax_jacobian_inf_to_one,
    theta_bracket,
    theta_certificate,
    theta_exact,
    theta_mitm,
)
from rankjax._src.measure.sensitivity_bounds import (
    block_inf_rms_norm,
    inf_rms_operator_norm_bracket,
    layernorm_only_product,
    mha_attention_probs,
    mha_lipschitz_bound,
    mha_local_bound,
)
from rankjax._src.measure.similarity import (
    batch_mean_token_similarity,
    prefix_average_matrix,
    token_similarity,
)
from rankjax._src.measure.spectra import (
    activation_moments,
    coherence_constant,
    effective_rank,
    effective_rank_from_singular_values,
    marchenko_pastur_atom,
    marchenko_pastur_condition_number,
    marchenko_pastur_density,
    marchenko_pastur_edges,
    stable_rank,
    survival_rate,
)
from rankjax._src.measure.theory import (
    STANDARD_SWIGLU_VAR_U,
    amount_of_attention,
    amount_of_attention_postnorm,
    delta_attn,
    delta_de,
    delta_ffn,
    f1,
    folded_attention_variance,
    swiglu_moment,
    swiglu_xi,
)

__all__ = [
    "BlockJacobianMethod",
    "JacobianBlock",
    "JacobianStudy",
    "PathSums",
    "STANDARD_SWIGLU_VAR_U",
    "StudyOptions",
    "Transition",
    "accumulated_branch",
    "activation_derivative",
    "activation_moments",
    "amount_of_attention",
    "amount_of_attention_postnorm",
    "attention_statistics",
    "backward_stream",
    "batch_mean_token_similarity",
    "block_cosines",
    "block_grad_norms",
    "block_inf_rms_norm",
    "branch_jacobian",
    "capture",
    "causal_probs",
    "coherence_constant",
    "collapse_distance",
    "collapsed_loss_lower_bound",
    "cosine_matrix",
    "cross_entropy",
    "delta_attn",
    "delta_de",
    "delta_ffn",
    "detect_transition",
    "effective_rank",
    "effective_rank_from_singular_values",
    "f1",
    "ffn_inputs",
    "ffn_jacobians",
    "folded_attention_variance",
    "frequency_logits",
    "frequency_loss",
    "gradient_spikes",
    "growth_exponent",
    "inf_rms_operator_norm_bracket",
    "layer_attention_statistics",
    "layernorm_only_product",
    "make_study_fn",
    "marchenko_pastur_atom",
    "marchenko_pastur_condition_number",
    "marchenko_pastur_density",
    "marchenko_pastur_edges",
    "masked_gram_eigenvalues",
    "masked_up_projection",
    "mha_attention_probs",
    "mha_lipschitz_bound",
    "mha_local_bound",
    "mlp_jacobian_study",
    "mlp_representation_study",
    "module_named",
    "network_study",
    "nth_call_in_block",
    "off_diagonal_mean",
    "path_sums",
    "post_activation",
    "prefix_average_matrix",
    "residual_statistics",
    "seed_samples",
    "single_blas_thread",
    "site",
    "smallest_gram_eigenvalue",
    "softmax_jacobian_inf_to_one",
    "stable_rank",
    "survival_rate",
    "swiglu_moment",
    "swiglu_xi",
    "theta_bracket",
    "theta_certificate",
    "theta_exact",
    "theta_mitm",
    "token_similarity",
]
