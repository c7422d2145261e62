"""Deprecated shim (issue #24): the threaded SVD is ``rankjax.fast_paths.singular_values``."""
from rankjax._host_lapack import host_singular_values, single_blas_thread  # noqa: F401
from rankjax.fast_paths import singular_values as singular_values_threaded  # noqa: F401
