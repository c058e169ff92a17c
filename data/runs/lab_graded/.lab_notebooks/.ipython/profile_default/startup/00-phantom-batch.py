# Written by phantom.kernels for batch kernels (papermill): skip jsonschema's optional rfc3987_syntax
# backend, whose import costs ~1.6 s per kernel; see the module docstring of phantom.kernels.
import sys as _sys
_sys.modules.setdefault("rfc3987_syntax", None)
del _sys
