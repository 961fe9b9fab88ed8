"""tune (work in progress in this session)."""


def add_arguments(p):
    """Register the verb's options."""
    p.set_defaults(func=main)


def main(args):
    """Entry point."""
    raise SystemExit("tune: not available yet")
