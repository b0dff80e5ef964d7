"""Running the Triton kernels under Triton's CPU interpreter (``TRITON_INTERPRET=1``) in the tests."""

from __future__ import annotations

import os


def patch_loop_bounds() -> None:
    """Triton 3.6's interpreter passes scalars as 1-element arrays and calls ``int()`` on them for loop
    bounds, which numpy >= 2.4 refuses; index through the first element instead. A no-op when not
    interpreting."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor

    def patched(tensor, scope) -> None:
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interpreter._patch_lang_tensor = patched
