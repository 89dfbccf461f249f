"""Where the code runs: inside the book build, on Colab, or elsewhere. The lowest layer, imported by any."""
from __future__ import annotations

import os
import sys

__all__ = ["BOOK_BUILD_ENV", "in_book_build", "on_colab"]

BOOK_BUILD_ENV = "JACAP_BOOK_BUILD"


def in_book_build() -> bool:
    """True while the Jupyter Book build executes a chapter (no live kernel for the reader)."""
    return os.environ.get(BOOK_BUILD_ENV, "") not in ("", "0")


def on_colab() -> bool:
    """True inside a Google Colab kernel."""
    return "google.colab" in sys.modules
