"""``python -m skinny_gemm``: installed as ``skinny_gemm/__main__.py`` (here, not in runtime/, which never imports aot)."""

from .aot.cli import main

raise SystemExit(main())
