"""Data: the image sets of the residual-MLP studies.

The public face of ``rankjax.data`` (the implementation, text streams, tokenizers and
the grain pipeline included, is ``rankjax._src.data``). A training run reads its data
through its ``TrainConfig`` (``dataset``, ``data_dir``), not through this package.

- ``image_source``: an installed image set (CIFAR-10, Fashion-MNIST, digits) as arrays;
- ``missing_image_set_line``: why an image set is not available here, in one line
  (None when it is).
"""
from rankjax._src.data.images import image_source, missing_image_set_line

__all__ = ["image_source", "missing_image_set_line"]
