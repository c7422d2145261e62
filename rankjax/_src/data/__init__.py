"""Data pipelines: packed text for the LMs, flattened images for the MLPs.

The training loop needs only ``make_iterator`` and ``dataset_info`` (see
``rankjax._src.data.pipeline`` for how to checkpoint the iterator with Orbax).
"""

from rankjax._src.data.common import DataUnavailableError
from rankjax._src.data.pipeline import DataInfo, check_model_fits, dataset_info, make_iterator
from rankjax._src.data.tokenizer import Tokenizer, make_tokenizer

__all__ = [
    "images",
    "DataInfo",
    "DataUnavailableError",
    "Tokenizer",
    "check_model_fits",
    "dataset_info",
    "make_iterator",
    "make_tokenizer",
]
