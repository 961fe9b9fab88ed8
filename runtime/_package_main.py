"""``python -m skinny_gemm``: installed as ``skinny_gemm/__main__.py``."""

from .aot.cli import main

raise SystemExit(main())
