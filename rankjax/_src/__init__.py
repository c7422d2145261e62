"""rankjax's implementation: private, free to change.

The public API is ``rankjax`` and its packages' faces (``rankjax.config``,
``rankjax.data``, ``rankjax.models``, ``rankjax.measure``, ``rankjax.train``,
``rankjax.studies``): docs/architecture.md, "The public face".
"""

__version__ = "0.1.0"
